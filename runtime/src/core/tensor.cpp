#include "tarantella/tensor.hpp"

#include "core/half.hpp"
#include "backend/device_api.hpp"
#include "core/memory.hpp"
#ifdef TNT_WITH_CUDA
#include "backend/cuda/kernels.hpp"
#endif

#include <cstring>

namespace tnt {

int64_t shape_numel(const Shape& shape) {
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    TNT_CHECK(d > 0 && !__builtin_mul_overflow(n, d, &n), "shape {} has no valid element count", shape_str(shape));
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = device_alloc(bytes, device);
}

Storage::~Storage() { device_free(data_, bytes_, device_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) TNT_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  TNT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
            "from_vector: {} values for shape {}", values.size(), shape_str(shape));
  return from_data(values.data(), shape);
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int j = i < 0 ? i + n : i;
  TNT_CHECK(j >= 0 && j < n, "dimension {} out of range for shape {}", i, shape_str(shape_));
  return shape_[j];
}

std::string Tensor::str() const {
  return fmt::format("{}{} on {}", dtype_name(dtype_), shape_str(shape_), device().str());
}

void* Tensor::raw() const {
  TNT_CHECK(storage_, "use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TNT_CHECK(infer < 0, "reshape: more than one -1 in {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TNT_CHECK(known > 0 && numel() % known == 0, "reshape {} -> {}: sizes do not match", shape_str(shape_), shape_str(shape));
    s[infer] = numel() / known;
  }
  TNT_CHECK(shape_numel(s) == numel(), "reshape {} -> {}: element counts differ", shape_str(shape_), shape_str(s));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  TNT_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
            "slice_rows [{}, {}) out of range for shape {}", begin, end, shape_str(shape_));
  Tensor t = *this;
  int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.offset_ += static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::view(const Shape& shape, DType dtype, size_t byte_offset) const {
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  TNT_CHECK(storage_ && offset_ + byte_offset + bytes <= storage_->bytes(),
            "view of {} bytes at offset {} exceeds storage of {} bytes", bytes, byte_offset,
            storage_ ? storage_->bytes() : 0);
  Tensor t = *this;
  t.offset_ += byte_offset;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const { return to(device()); }

void Tensor::copy_from(const Tensor& src) {
  TNT_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy_from: {} into {}", src.str(), str());
  device_copy(raw(), device(), src.raw(), src.device(), nbytes());
}

void Tensor::zero_() {
  if (device().is_cpu()) {
    std::memset(raw(), 0, nbytes());
  } else {
    backend::cuda_memset_zero(raw(), nbytes(), device().index);
  }
}

void Tensor::fill_(double value) {
  if (!device().is_cpu()) {
#ifdef TNT_WITH_CUDA
    cuda::fill(*this, value);
#else
    Tensor host = Tensor::full(shape_, value, dtype_, Device::cpu());
    copy_from(host);
#endif
    return;
  }
  int64_t n = numel();
  switch (dtype_) {
    case DType::f32: std::fill_n(static_cast<float*>(raw()), n, static_cast<float>(value)); break;
    case DType::f64: std::fill_n(static_cast<double*>(raw()), n, value); break;
    case DType::i32: std::fill_n(static_cast<int32_t*>(raw()), n, static_cast<int32_t>(value)); break;
    case DType::i64: std::fill_n(static_cast<int64_t*>(raw()), n, static_cast<int64_t>(value)); break;
    case DType::u8: std::fill_n(static_cast<uint8_t*>(raw()), n, static_cast<uint8_t>(value)); break;
    case DType::f16: std::fill_n(static_cast<uint16_t*>(raw()), n, float_to_f16(static_cast<float>(value))); break;
    case DType::bf16: std::fill_n(static_cast<uint16_t*>(raw()), n, float_to_bf16(static_cast<float>(value))); break;
  }
}

std::vector<double> Tensor::to_double_vector() const {
  Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  int64_t n = numel();
  std::vector<double> out(static_cast<size_t>(n));
  const void* p = host.raw();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype_) {
      case DType::f32: out[i] = static_cast<const float*>(p)[i]; break;
      case DType::f64: out[i] = static_cast<const double*>(p)[i]; break;
      case DType::i32: out[i] = static_cast<const int32_t*>(p)[i]; break;
      case DType::i64: out[i] = static_cast<double>(static_cast<const int64_t*>(p)[i]); break;
      case DType::u8: out[i] = static_cast<const uint8_t*>(p)[i]; break;
      case DType::f16: out[i] = f16_to_float(static_cast<const uint16_t*>(p)[i]); break;
      case DType::bf16: out[i] = bf16_to_float(static_cast<const uint16_t*>(p)[i]); break;
    }
  }
  return out;
}

std::vector<float> Tensor::to_vector() const {
  if (dtype_ == DType::f32) {
    Tensor host = device().is_cpu() ? *this : to(Device::cpu());
    const float* p = host.data<float>();
    return std::vector<float>(p, p + numel());
  }
  std::vector<double> d = to_double_vector();
  return std::vector<float>(d.begin(), d.end());
}

}  // namespace tnt
