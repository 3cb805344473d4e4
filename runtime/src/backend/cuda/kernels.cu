// Generic kernels on whole tensors: fill, casts, accumulate_as_float. Each is one functor
// over the elements, run by launch_elementwise (backend/cuda/vector_io.cuh): 16-byte accesses
// when every pointer is aligned, the scalar loop otherwise, the same per-element function
// either way, so a result never depends on the alignment of a view.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/vector_io.cuh"

#include <cstring>
#include <type_traits>

namespace tnt::cuda {

namespace {

// Binds `alias` to the element type of any DType.
#define TNT_CUDA_DISPATCH_ANY(dtype, alias, ...)                                     \
  do {                                                                             \
    switch (dtype) {                                                               \
      case DType::f32: { using alias = float; __VA_ARGS__; break; }                \
      case DType::f64: { using alias = double; __VA_ARGS__; break; }               \
      case DType::f16: { using alias = __half; __VA_ARGS__; break; }               \
      case DType::bf16: { using alias = __nv_bfloat16; __VA_ARGS__; break; }       \
      case DType::i32: { using alias = int32_t; __VA_ARGS__; break; }              \
      case DType::i64: { using alias = int64_t; __VA_ARGS__; break; }              \
      case DType::u8: { using alias = uint8_t; __VA_ARGS__; break; }               \
    }                                                                              \
  } while (0)

template <typename T>
constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <typename D, typename S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (is_half_v<D>) {
    return from_float<D>(to_float(v));
  } else if constexpr (is_half_v<S>) {
    return static_cast<D>(to_float(v));
  } else {
    return static_cast<D>(v);
  }
}

template <typename D, typename S>
struct Convert {
  __device__ D operator()(int64_t, S v) const { return convert<D>(v); }
};

// Elements are written as raw words of their size: the pattern was made on the host.
template <typename W>
struct FillWord {
  W pattern;
  __device__ W operator()(int64_t) const { return pattern; }
};

// dst + float(src), one float addition as `dst[i] += to_float(src[i])` was.
template <typename S>
struct AccumulateAsFloat {
  __device__ float operator()(int64_t, float dst, S src) const { return dst + to_float(src); }
};

template <typename W>
void launch_fill(const Tensor& t, const void* pattern, int device) {
  W word;
  std::memcpy(&word, pattern, sizeof(W));
  launch_elementwise(device, t.numel(), FillWord<W>{word}, static_cast<W*>(t.raw()));
}

}  // namespace

void fill(const Tensor& t, double value) {
  int device = common_device({&t}, "fill");
  if (t.numel() == 0) return;
  // The host makes the element's bytes, so a GPU fill equals a CPU fill bit for bit. Every
  // element gets the same value, so the memory format does not matter.
  Tensor one = Tensor::full({1}, value, t.dtype(), Device::cpu());
  switch (dtype_size(t.dtype())) {
    case 1: launch_fill<uint8_t>(t, one.raw(), device); break;
    case 2: launch_fill<uint16_t>(t, one.raw(), device); break;
    case 4: launch_fill<uint32_t>(t, one.raw(), device); break;
    case 8: launch_fill<uint64_t>(t, one.raw(), device); break;
    default: TNT_THROW("fill: unexpected element size {}", dtype_size(t.dtype()));
  }
}

void cast(const Tensor& src, const Tensor& dst) {
  int device = common_device({&src, &dst}, "cast");
  TNT_CHECK(src.numel() == dst.numel(), "cast: {} into {}: element counts differ", src.str(), dst.str());
  int64_t n = src.numel();
  if (n == 0) return;
  // Element i of one buffer is element i of the other only in one memory format: a source
  // in the other format is converted first (as copy_from does: logical order is kept), then
  // cast element-wise. A channels_last dst is 4-D; a source that is not (contiguous, then)
  // takes dst's shape for the conversion.
  Tensor from = src;
  if (src.memory_format() != dst.memory_format()) {
    from = (src.ndim() == 4 ? src : src.reshape(dst.shape())).to_memory_format(dst.memory_format());
  }
  TNT_CUDA_DISPATCH_ANY(from.dtype(), S, TNT_CUDA_DISPATCH_ANY(dst.dtype(), D, {
    launch_elementwise(device, n, Convert<D, S>{}, static_cast<D*>(dst.raw()), static_cast<const S*>(from.raw()));
  }));
}

Tensor cast(const Tensor& src, DType dtype) {
  Tensor out = Tensor::empty(src.shape(), dtype, src.device(), src.memory_format());
  cast(src, out);
  return out;
}

void accumulate_as_float(const Tensor& src, const Tensor& dst) {
  int device = common_device({&src, &dst}, "accumulate_as_float");
  TNT_CHECK(dst.dtype() == DType::f32, "accumulate_as_float: the destination {} must be f32", dst.str());
  TNT_CHECK(src.numel() == dst.numel(), "accumulate_as_float: {} into {}: element counts differ", src.str(),
            dst.str());
  TNT_CHECK(src.memory_format() == dst.memory_format(),
            "accumulate_as_float: {} into {}: memory formats differ (element i would not be element i)", src.str(),
            dst.str());
  const int64_t n = src.numel();
  if (n == 0) return;
  float* d = static_cast<float*>(dst.raw());
  TNT_CUDA_DISPATCH_FLOAT(src.dtype(), "accumulate_as_float", {
    launch_elementwise(device, n, AccumulateAsFloat<scalar_t>{}, d, static_cast<const float*>(d),
                       static_cast<const scalar_t*>(src.raw()));
  });
}

}  // namespace tnt::cuda
