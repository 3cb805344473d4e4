#include "tarantella/tensor.hpp"

#include "core/half.hpp"
#include "core/device_api.hpp"
#include "core/memory.hpp"
#ifdef TNT_WITH_CUDA
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

const char* memory_format_name(MemoryFormat format) {
  return format == MemoryFormat::channels_last ? "channels_last" : "contiguous";
}

MemoryFormat parse_memory_format(const std::string& text) {
  if (text == "contiguous" || text == "channels_first" || text == "nchw") return MemoryFormat::contiguous;
  if (text == "channels_last" || text == "nhwc") return MemoryFormat::channels_last;
  TNT_INPUT_ERROR("memory format '{}' is not 'channels_first' (also 'contiguous', 'nchw') or 'channels_last' "
                  "(also 'nhwc')",
                  text);
}

namespace {

// Host conversion between the two formats, element by element of `Bytes` bytes.
template <size_t Bytes>
void convert_format_host(const char* src, char* dst, int64_t n, int64_t c, int64_t hw, bool to_channels_last) {
  for (int64_t i = 0; i < n; ++i) {
    const char* s = src + static_cast<size_t>(i * c * hw) * Bytes;
    char* d = dst + static_cast<size_t>(i * c * hw) * Bytes;
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t p = 0; p < hw; ++p) {
        const int64_t nchw = ch * hw + p, nhwc = p * c + ch;
        const int64_t from = to_channels_last ? nchw : nhwc, to = to_channels_last ? nhwc : nchw;
        std::memcpy(d + static_cast<size_t>(to) * Bytes, s + static_cast<size_t>(from) * Bytes, Bytes);
      }
    }
  }
}

// dst (same shape, dtype, device as src, other format) = src.
void convert_format(const Tensor& src, const Tensor& dst) {
  const int64_t n = src.dim(0), c = src.dim(1), hw = src.dim(2) * src.dim(3);
  if (src.numel() == 0) return;
  if (!src.device().is_cpu()) {
    backend::cuda_convert_memory_format(src, dst);
    return;
  }
  const bool to_cl = dst.is_channels_last();
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  switch (dtype_size(src.dtype())) {
    case 1: convert_format_host<1>(s, d, n, c, hw, to_cl); break;
    case 2: convert_format_host<2>(s, d, n, c, hw, to_cl); break;
    case 4: convert_format_host<4>(s, d, n, c, hw, to_cl); break;
    case 8: convert_format_host<8>(s, d, n, c, hw, to_cl); break;
    default: TNT_THROW("memory format conversion: unsupported element size {}", dtype_size(src.dtype()));
  }
}

}  // namespace

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = device_alloc(bytes, device);
}

Storage::~Storage() { device_free(data_, bytes_, device_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  for (int64_t d : shape) TNT_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  TNT_CHECK(format == MemoryFormat::contiguous || shape.size() == 4, "a channels_last tensor must be 4-D, not {}",
            shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.format_ = format;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  Tensor t = empty(shape, dtype, device, format);
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
  return fmt::format("{}{}{} on {}", dtype_name(dtype_), shape_str(shape_),
                     is_channels_last() ? " channels_last" : "", device().str());
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
  if (s == shape_) return *this;
  TNT_CHECK(!is_channels_last(), "reshape {} -> {}: the tensor is channels_last; call contiguous() first",
            shape_str(shape_), shape_str(s));
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
  t.format_ = MemoryFormat::contiguous;
  return t;
}

Tensor Tensor::to_memory_format(MemoryFormat format) const {
  if (format == format_ || !defined()) return *this;
  if (format == MemoryFormat::channels_last && ndim() != 4) return *this;
  Tensor t = empty(shape_, dtype_, device(), format);
  convert_format(*this, t);
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device, format_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const { return to(device()); }

void Tensor::copy_from(const Tensor& src) {
  TNT_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy_from: {} into {}", src.str(), str());
  if (src.memory_format() != format_) {
    TNT_CHECK(src.shape() == shape_, "copy_from: {} into {}: other memory format and shape", src.str(), str());
    // Convert on the source's device, then copy the bytes.
    Tensor converted = src.to_memory_format(format_);
    device_copy(raw(), device(), converted.raw(), converted.device(), nbytes());
    return;
  }
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
    backend::cuda_fill(*this, value);
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
  Tensor host = (device().is_cpu() ? *this : to(Device::cpu())).contiguous();
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
    Tensor host = (device().is_cpu() ? *this : to(Device::cpu())).contiguous();
    const float* p = host.data<float>();
    return std::vector<float>(p, p + numel());
  }
  std::vector<double> d = to_double_vector();
  return std::vector<float>(d.begin(), d.end());
}

}  // namespace tnt
