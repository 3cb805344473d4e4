// The max pooling kernels for NHWC (channels_last) tensors, and the geometry every pooling
// kernel takes. Included by pooling_cuda.cu only (its definitions are internal).
#pragma once

#include "backend/cuda/device_common.cuh"

#include <cstdint>
#include <initializer_list>

namespace tnt::cuda {
namespace {

struct PoolGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0, ho = 0, wo = 0, pool = 0, stride = 0, pad = 0;
};

// Along one axis, the outputs [first, last] whose windows hold input position `in`:
// o * stride - pad <= in <= o * stride - pad + pool - 1, within [0, out - 1].
template <typename I>
__device__ __forceinline__ void windows_holding(I in, I pad, I pool, I stride, I out, I& first, I& last) {
  first = in + pad < pool ? 0 : (in + pad - pool) / stride + 1;
  last = min((in + pad) / stride, out - 1);
}

// The same for NHWC: x (N, H, W, C), y and argmax (N, Ho, Wo, C), argmax as above. I is
// the index type: int32_t when every index of x and y fits (the host checks), which makes
// the four divisions per element 32-bit ones (a 64-bit division is a long software
// sequence on the GPU, and ResNet's pooling runs over 10^8 elements), else int64_t.
template <typename I>
struct PoolIndex {
  I n, c, h, w, ho, wo, pool, stride, pad;
  explicit PoolIndex(const PoolGeometry& g)
      : n(static_cast<I>(g.n)), c(static_cast<I>(g.c)), h(static_cast<I>(g.h)), w(static_cast<I>(g.w)),
        ho(static_cast<I>(g.ho)), wo(static_cast<I>(g.wo)), pool(static_cast<I>(g.pool)),
        stride(static_cast<I>(g.stride)), pad(static_cast<I>(g.pad)) {}
};

template <typename T, typename I>
__global__ void max_pool_forward_nhwc_kernel(const T* __restrict__ x,  // (N, H, W, C)
                                             PoolIndex<I> g,
                                             T* __restrict__ y,               // (N, Ho, Wo, C)
                                             int32_t* __restrict__ argmax) {  // (N, Ho, Wo, C)
  const I total = g.n * g.ho * g.wo * g.c;
  for (I o = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); o < total;
       o += static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x)) {
    const I c = o % g.c, pixel = o / g.c;
    const I ow = pixel % g.wo, oh = (pixel / g.wo) % g.ho, image = pixel / (g.wo * g.ho);
    const T* xp = x + image * g.h * g.w * g.c + c;  // element (ih, iw) at xp[(ih * W + iw) * C]
    float best = 0.0f;
    int32_t best_at = -1;
    for (I i = 0; i < g.pool; ++i) {
      const I ih = oh * g.stride - g.pad + i;
      if (ih < 0 || ih >= g.h) continue;
      for (I j = 0; j < g.pool; ++j) {
        const I iw = ow * g.stride - g.pad + j;
        if (iw < 0 || iw >= g.w) continue;
        const float v = to_float(xp[(ih * g.w + iw) * g.c]);
        // The NCHW kernel's rule: strict, so the first maximum stays; the first NaN wins.
        if (best_at < 0 || v > best || (v != v && best == best)) {
          best = v;
          best_at = static_cast<int32_t>(ih * g.w + iw);
        }
      }
    }
    y[o] = best_at < 0 ? from_float<T>(0.0f) : xp[static_cast<I>(best_at) * g.c];
    argmax[o] = best_at;
  }
}

template <typename T, typename I>
__global__ void max_pool_backward_nhwc_kernel(const T* __restrict__ dy,             // (N, Ho, Wo, C)
                                              const int32_t* __restrict__ argmax,  // (N, Ho, Wo, C)
                                              PoolIndex<I> g,
                                              T* __restrict__ dx) {  // (N, H, W, C)
  const I total = g.n * g.h * g.w * g.c;
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x)) {
    const I c = i % g.c, pixel = i / g.c;
    const I iw = pixel % g.w, ih = (pixel / g.w) % g.h, image = pixel / (g.w * g.h);
    const int32_t here = static_cast<int32_t>(ih * g.w + iw);
    // The windows containing (ih, iw), as in the NCHW kernel, in the same order.
    I oh0, oh1, ow0, ow1;
    windows_holding(ih, g.pad, g.pool, g.stride, g.ho, oh0, oh1);
    windows_holding(iw, g.pad, g.pool, g.stride, g.wo, ow0, ow1);
    const I base = image * g.ho * g.wo;
    float acc = 0.0f;
    for (I oh = oh0; oh <= oh1; ++oh) {
      for (I ow = ow0; ow <= ow1; ++ow) {
        const I o = (base + oh * g.wo + ow) * g.c + c;
        if (argmax[o] == here) acc += to_float(dy[o]);
      }
    }
    dx[i] = from_float<T>(acc);
  }
}

// The NHWC kernels above with V = 16 / sizeof(T) channels per thread (C a multiple of V,
// every pointer 16-byte aligned: the host checks): 16-byte loads and stores, and the index
// arithmetic once per V channels. Each channel's comparisons, sums and results are those
// of the kernels above, in the same order (bitwise the same outputs).
template <typename T>
struct PoolVec {
  static constexpr int V = 16 / static_cast<int>(sizeof(T));
};

template <typename T>
__global__ void max_pool_forward_nhwc_vec_kernel(const T* __restrict__ x,  // (N, H, W, C)
                                                 PoolIndex<int32_t> g,
                                                 T* __restrict__ y,               // (N, Ho, Wo, C)
                                                 int32_t* __restrict__ argmax) {  // (N, Ho, Wo, C)
  constexpr int V = PoolVec<T>::V;
  const int32_t groups = g.c / V;
  const int32_t total = g.n * g.ho * g.wo * groups;
  for (int32_t o = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x); o < total;
       o += static_cast<int32_t>(blockDim.x * gridDim.x)) {
    const int32_t cg = o % groups, pixel = o / groups;
    const int32_t ow = pixel % g.wo, oh = (pixel / g.wo) % g.ho, image = pixel / (g.wo * g.ho);
    const T* xp = x + image * g.h * g.w * g.c + cg * V;
    float best[V];
    int32_t at[V];
    uint4 kept = make_uint4(0u, 0u, 0u, 0u);  // the maxima's own bits (0 where no element)
    T* kv = reinterpret_cast<T*>(&kept);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      best[v] = 0.0f;
      at[v] = -1;
    }
    for (int32_t i = 0; i < g.pool; ++i) {
      const int32_t ih = oh * g.stride - g.pad + i;
      if (ih < 0 || ih >= g.h) continue;
      for (int32_t j = 0; j < g.pool; ++j) {
        const int32_t iw = ow * g.stride - g.pad + j;
        if (iw < 0 || iw >= g.w) continue;
        const uint4 raw = *reinterpret_cast<const uint4*>(xp + (ih * g.w + iw) * g.c);
        const T* xv = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const float val = to_float(xv[v]);
          if (at[v] < 0 || val > best[v] || (val != val && best[v] == best[v])) {
            best[v] = val;
            at[v] = ih * g.w + iw;
            kv[v] = xv[v];
          }
        }
      }
    }
    const int32_t out = pixel * g.c + cg * V;
    *reinterpret_cast<uint4*>(y + out) = kept;
#pragma unroll
    for (int v = 0; v < V; v += 4) *reinterpret_cast<int4*>(argmax + out + v) = make_int4(at[v], at[v + 1], at[v + 2], at[v + 3]);
  }
}

template <typename T>
__global__ void max_pool_backward_nhwc_vec_kernel(const T* __restrict__ dy,             // (N, Ho, Wo, C)
                                                  const int32_t* __restrict__ argmax,  // (N, Ho, Wo, C)
                                                  PoolIndex<int32_t> g,
                                                  T* __restrict__ dx) {  // (N, H, W, C)
  constexpr int V = PoolVec<T>::V;
  const int32_t groups = g.c / V;
  const int32_t total = g.n * g.h * g.w * groups;
  for (int32_t i = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x); i < total;
       i += static_cast<int32_t>(blockDim.x * gridDim.x)) {
    const int32_t cg = i % groups, pixel = i / groups;
    const int32_t iw = pixel % g.w, ih = (pixel / g.w) % g.h, image = pixel / (g.w * g.h);
    const int32_t here = ih * g.w + iw;
    int32_t oh0, oh1, ow0, ow1;
    windows_holding(ih, g.pad, g.pool, g.stride, g.ho, oh0, oh1);
    windows_holding(iw, g.pad, g.pool, g.stride, g.wo, ow0, ow1);
    const int32_t base = image * g.ho * g.wo;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.0f;
    for (int32_t oh = oh0; oh <= oh1; ++oh) {
      for (int32_t ow = ow0; ow <= ow1; ++ow) {
        const int32_t o = (base + oh * g.wo + ow) * g.c + cg * V;
        const uint4 raw = *reinterpret_cast<const uint4*>(dy + o);
        const T* dv = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int v = 0; v < V; v += 4) {
          const int4 a = *reinterpret_cast<const int4*>(argmax + o + v);
          if (a.x == here) acc[v] += to_float(dv[v]);
          if (a.y == here) acc[v + 1] += to_float(dv[v + 1]);
          if (a.z == here) acc[v + 2] += to_float(dv[v + 2]);
          if (a.w == here) acc[v + 3] += to_float(dv[v + 3]);
        }
      }
    }
    uint4 out;
    T* ov = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int v = 0; v < V; ++v) ov[v] = from_float<T>(acc[v]);
    *reinterpret_cast<uint4*>(dx + pixel * g.c + cg * V) = out;
  }
}

// Whether the vectorised NHWC kernels apply: whole 16-byte groups of channels (and at
// least 4, the argmax's int4), every pointer 16-byte aligned, int32 indices.
bool pool_vec_applies(const PoolGeometry& g, size_t elem_bytes, std::initializer_list<const void*> pointers) {
  const int64_t v = 16 / static_cast<int64_t>(elem_bytes);
  if (v < 4 || g.c % v != 0) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

}  // namespace
}  // namespace tnt::cuda
