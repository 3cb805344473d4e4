#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"

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
__global__ void cast_kernel(const S* __restrict__ src,  // (n)
                            D* __restrict__ dst,        // (n)
                            int64_t n) {
  TNT_KERNEL_LOOP(i, n) { dst[i] = convert<D>(src[i]); }
}

// Elements are copied as raw words of their size: the pattern was made on the host.
template <typename W>
__global__ void fill_kernel(W* __restrict__ out,  // (n)
                            W pattern, int64_t n) {
  TNT_KERNEL_LOOP(i, n) { out[i] = pattern; }
}

template <typename S>
__global__ void accumulate_as_float_kernel(const S* __restrict__ src,  // (n)
                                           float* __restrict__ dst,    // (n)
                                           int64_t n) {
  TNT_KERNEL_LOOP(i, n) { dst[i] += to_float(src[i]); }
}

template <typename W>
void launch_fill(const Tensor& t, const void* pattern, int device) {
  W word;
  std::memcpy(&word, pattern, sizeof(W));
  int64_t n = t.numel();
  fill_kernel<W><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(static_cast<W*>(t.raw()),
                                                                                     word, n);
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fill(const Tensor& t, double value) {
  int device = common_device({&t}, "fill");
  if (t.numel() == 0) return;
  // The host makes the element's bytes, so a GPU fill equals a CPU fill bit for bit.
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
  unsigned grid = grid_for(n, kBlock, device);
  cudaStream_t stream = compute_stream(device);
  TNT_CUDA_DISPATCH_ANY(src.dtype(), S, TNT_CUDA_DISPATCH_ANY(dst.dtype(), D, {
    cast_kernel<D, S><<<grid, kBlock, 0, stream>>>(static_cast<const S*>(src.raw()), static_cast<D*>(dst.raw()), n);
  }));
  TNT_CUDA_CHECK_LAUNCH();
}

Tensor cast(const Tensor& src, DType dtype) {
  Tensor out = Tensor::empty(src.shape(), dtype, src.device());
  cast(src, out);
  return out;
}

void accumulate_as_float(const Tensor& src, const Tensor& dst) {
  int device = common_device({&src, &dst}, "accumulate_as_float");
  TNT_CHECK(dst.dtype() == DType::f32, "accumulate_as_float: the destination {} must be f32", dst.str());
  TNT_CHECK(src.numel() == dst.numel(), "accumulate_as_float: {} into {}: element counts differ", src.str(),
            dst.str());
  const int64_t n = src.numel();
  if (n == 0) return;
  TNT_CUDA_DISPATCH_FLOAT(src.dtype(), "accumulate_as_float", {
    accumulate_as_float_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
        static_cast<const scalar_t*>(src.raw()), static_cast<float*>(dst.raw()), n);
  });
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::cuda
