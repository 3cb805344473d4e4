// Device-side helpers shared by the .cu files: element types of each DType, conversions
// through float, a dtype dispatch for host code, grid-stride loops and deterministic block
// reductions.
//
// Reductions never use floating-point atomics: a sum is reduced in a fixed tree inside a
// block and, across blocks, in a fixed order by a second pass, so a result depends only on
// the shape and the launch configuration (deterministic mode needs nothing more from them).
#pragma once

#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/cuda_context.hpp"
#include "tarantella/dtype.hpp"
#include "tarantella/tensor.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tnt::cuda {

constexpr int kBlock = 256;  // threads per block of the elementwise kernels
constexpr int kWarp = 32;

// float <-> element type. Accumulation is always in float (or double for f64).
template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Grid-stride loop over [0, n).
#define TNT_KERNEL_LOOP(i, n)                                                                      \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);          \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Runs the statement with `scalar_t` bound to the element type of a floating dtype that
// the CUDA engines support (f32, f16, bf16).
#define TNT_CUDA_DISPATCH_FLOAT(dtype, what, ...)                                                    \
  do {                                                                                             \
    switch (dtype) {                                                                               \
      case ::tnt::DType::f32: {                                                                    \
        using scalar_t = float;                                                                    \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
      }                                                                                            \
      case ::tnt::DType::f16: {                                                                    \
        using scalar_t = __half;                                                                   \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
      }                                                                                            \
      case ::tnt::DType::bf16: {                                                                   \
        using scalar_t = __nv_bfloat16;                                                            \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
      }                                                                                            \
      default:                                                                                     \
        TNT_THROW("{}: dtype {} is not supported by the CUDA engine (f32, f16, bf16)", what,       \
                  ::tnt::dtype_name(dtype));                                                       \
    }                                                                                              \
  } while (0)

// Integer label types (i32, i64): binds `label_t`.
#define TNT_CUDA_DISPATCH_LABEL(dtype, what, ...)                                                    \
  do {                                                                                             \
    switch (dtype) {                                                                               \
      case ::tnt::DType::i32: {                                                                    \
        using label_t = int32_t;                                                                   \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
      }                                                                                            \
      case ::tnt::DType::i64: {                                                                    \
        using label_t = int64_t;                                                                   \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
      }                                                                                            \
      default:                                                                                     \
        TNT_THROW("{}: labels must be i32 or i64, got {}", what, ::tnt::dtype_name(dtype));        \
    }                                                                                              \
  } while (0)

// Sum over a warp; every lane gets the result. Fixed butterfly order: deterministic.
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 values in shared memory. Ends with a barrier, so the scratch
// may be reused right after.
template <typename A>
__device__ A block_sum(A v, A* scratch) {
  int lane = threadIdx.x % kWarp;
  int warp = threadIdx.x / kWarp;
  int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A total = lane < warps ? scratch[lane] : A(0);
  total = warp_sum(total);
  __syncthreads();
  return total;
}

template <typename A>
__device__ A block_max(A v, A* scratch, A lowest) {
  int lane = threadIdx.x % kWarp;
  int warp = threadIdx.x / kWarp;
  int warps = blockDim.x / kWarp;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A m = lane < warps ? scratch[lane] : lowest;
  m = warp_max(m);
  __syncthreads();
  return m;
}

}  // namespace tnt::cuda
