// Vectorised element-wise kernels: out[i] = f(i, a[i], b[i]) over n elements with 16-byte
// loads and stores where every pointer allows it (the plan: backend/cuda/elementwise_plan.hpp).
//
// A kernel applies the functor to each element exactly as the scalar loop did; only the way
// elements travel between memory and registers changes (one 16-byte access per operand for
// `width` elements instead of `width` accesses). So both paths give bit-for-bit the same
// results, whichever one the alignment of a call picks: tests/core/test_kernels_cuda.cpp runs
// each kernel on aligned tensors and on views at byte offsets 2, 4 and 8 and compares.
//
// Functors take the element's index (int64_t, for the ones that need it: Dropout's counter)
// and the input elements in their storage types, and return the output element.
//
// No __restrict__ on the pointers: in-place calls (axpy's y, scale's x, accumulate's dst,
// ops::add(a, b, a)) pass one buffer as input and output. Each element is read before it is
// written, by the same thread, so aliasing is harmless; restrict would make it undefined.
#pragma once

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/elementwise_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace tnt::cuda {

// `width` elements of T that the compiler moves with one access of sizeof(T) * width bytes
// (16 for the widest operand of a kernel; the alignment makes the access a vector one).
template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

template <int W, typename T>
__device__ __forceinline__ Pack<T, W> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, W>*>(p);
}

template <int W, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, W>& pack) {
  *reinterpret_cast<Pack<T, W>*>(p) = pack;
}

// W elements widened to float (exact for f32, f16, bf16), and back with from_float's
// round-to-nearest-even: for kernels that compute on a whole pack in float.
template <int W, typename T>
__device__ __forceinline__ void load_as_float(const T* p, float (&out)[W]) {
  const Pack<T, W> pack = load_pack<W>(p);
#pragma unroll
  for (int k = 0; k < W; ++k) out[k] = to_float(pack.v[k]);
}

template <int W, typename T>
__device__ __forceinline__ void store_from_float(T* p, const float (&in)[W]) {
  Pack<T, W> pack;
#pragma unroll
  for (int k = 0; k < W; ++k) pack.v[k] = from_float<T>(in[k]);
  store_pack<W>(p, pack);
}

// The three kernels below share one shape. Thread t of T threads handles the steps t,
// t + T, ... of W elements each (W a power of two: n / W is a shift), then the first
// n % W threads take one tail element each. Index is uint32_t when the plan allows it
// (fits_index32), else int64_t. With W == 1 this is the scalar grid-stride loop.

// out[i] = f(i)
template <int W, typename Index, typename Out, typename F>
__global__ void map0_kernel(Out* out,  // (n)
                            Index n, F f) {
  const Index threads = static_cast<Index>(blockDim.x) * gridDim.x;
  const Index first = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Index vectors = n / W;
  for (Index v = first; v < vectors; v += threads) {
    const Index base = v * W;
    Pack<Out, W> po;
#pragma unroll
    for (int k = 0; k < W; ++k) po.v[k] = f(static_cast<int64_t>(base + k));
    store_pack<W>(out + base, po);
  }
  const Index tail_start = vectors * W;
  if (first < n - tail_start) {
    const Index i = tail_start + first;
    out[i] = f(static_cast<int64_t>(i));
  }
}

// out[i] = f(i, a[i])
template <int W, typename Index, typename Out, typename A, typename F>
__global__ void map1_kernel(Out* out,    // (n)
                            const A* a,  // (n)
                            Index n, F f) {
  const Index threads = static_cast<Index>(blockDim.x) * gridDim.x;
  const Index first = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Index vectors = n / W;
  for (Index v = first; v < vectors; v += threads) {
    const Index base = v * W;
    const Pack<A, W> pa = load_pack<W>(a + base);
    Pack<Out, W> po;
#pragma unroll
    for (int k = 0; k < W; ++k) po.v[k] = f(static_cast<int64_t>(base + k), pa.v[k]);
    store_pack<W>(out + base, po);
  }
  const Index tail_start = vectors * W;
  if (first < n - tail_start) {
    const Index i = tail_start + first;
    out[i] = f(static_cast<int64_t>(i), a[i]);
  }
}

// out[i] = f(i, a[i], b[i])
template <int W, typename Index, typename Out, typename A, typename B, typename F>
__global__ void map2_kernel(Out* out,    // (n)
                            const A* a,  // (n)
                            const B* b,  // (n)
                            Index n, F f) {
  const Index threads = static_cast<Index>(blockDim.x) * gridDim.x;
  const Index first = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Index vectors = n / W;
  for (Index v = first; v < vectors; v += threads) {
    const Index base = v * W;
    const Pack<A, W> pa = load_pack<W>(a + base);
    const Pack<B, W> pb = load_pack<W>(b + base);
    Pack<Out, W> po;
#pragma unroll
    for (int k = 0; k < W; ++k) po.v[k] = f(static_cast<int64_t>(base + k), pa.v[k], pb.v[k]);
    store_pack<W>(out + base, po);
  }
  const Index tail_start = vectors * W;
  if (first < n - tail_start) {
    const Index i = tail_start + first;
    out[i] = f(static_cast<int64_t>(i), a[i], b[i]);
  }
}

namespace detail {

template <int W, typename Index, typename Out, typename F>
void launch_map(unsigned grid, cudaStream_t stream, Index n, F f, Out* out) {
  map0_kernel<W, Index, Out, F><<<grid, kBlock, 0, stream>>>(out, n, f);
}

template <int W, typename Index, typename Out, typename F, typename A>
void launch_map(unsigned grid, cudaStream_t stream, Index n, F f, Out* out, const A* a) {
  map1_kernel<W, Index, Out, A, F><<<grid, kBlock, 0, stream>>>(out, a, n, f);
}

template <int W, typename Index, typename Out, typename F, typename A, typename B>
void launch_map(unsigned grid, cudaStream_t stream, Index n, F f, Out* out, const A* a, const B* b) {
  map2_kernel<W, Index, Out, A, B, F><<<grid, kBlock, 0, stream>>>(out, a, b, n, f);
}

}  // namespace detail

// out[i] = f(i, in[i]...) for i in [0, n), zero to two inputs, on the device's compute
// stream. Picks the vector or scalar path and the index type (elementwise_plan.hpp), sizes
// the grid from the SM count (grid_for) and checks the launch.
template <typename Out, typename F, typename... In>
void launch_elementwise(int device, int64_t n, F f, Out* out, const In*... in) {
  static_assert(sizeof...(In) <= 2, "launch_elementwise: at most two inputs");
  if (n <= 0) return;
  constexpr int widest = static_cast<int>(std::max({sizeof(Out), sizeof(In)...}));
  constexpr int W = vector_width(widest);
  const ElementwisePlan plan = plan_elementwise(n, W, {static_cast<const void*>(out), static_cast<const void*>(in)...});
  const unsigned grid = grid_for(plan.work_items(), kBlock, device);
  const int64_t threads = static_cast<int64_t>(grid) * kBlock;
  cudaStream_t stream = compute_stream(device);
  const bool index32 = fits_index32(n, threads);
  if (plan.width == W && W > 1) {
    if (index32) {
      detail::launch_map<W, uint32_t>(grid, stream, static_cast<uint32_t>(n), f, out, in...);
    } else {
      detail::launch_map<W, int64_t>(grid, stream, n, f, out, in...);
    }
  } else {
    if (index32) {
      detail::launch_map<1, uint32_t>(grid, stream, static_cast<uint32_t>(n), f, out, in...);
    } else {
      detail::launch_map<1, int64_t>(grid, stream, n, f, out, in...);
    }
  }
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::cuda
