// The trial helpers of compare.hpp.
#include "backend/cuda/compare.hpp"

#include "backend/cuda/device_common.cuh"

#include <cfloat>
#include <cstring>

namespace tnt::cuda {

namespace {

// max |a - b| and max |b| (NaN counted as infinite) into out[0], out[1] as the bits of
// non-negative floats, which order as unsigned integers.
template <typename T>
__global__ void max_difference_kernel(const T* __restrict__ a, const T* __restrict__ b, int64_t n,
                                      unsigned* __restrict__ out) {
  float d = 0.0f, m = 0.0f;
  TNT_KERNEL_LOOP(i, n) {
    const float x = to_float(a[i]), y = to_float(b[i]);
    float e = fabsf(x - y), r = fabsf(y);
    if (!(e <= FLT_MAX)) e = INFINITY;
    if (!(r <= FLT_MAX)) r = INFINITY;
    d = fmaxf(d, e);
    m = fmaxf(m, r);
  }
  for (int off = kWarp / 2; off > 0; off /= 2) {
    d = fmaxf(d, __shfl_xor_sync(0xffffffffu, d, off));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  }
  if ((threadIdx.x & (kWarp - 1)) == 0) {
    atomicMax(out, __float_as_uint(d));
    atomicMax(out + 1, __float_as_uint(m));
  }
}

template <typename T>
__global__ void dot_kernel(const T* __restrict__ a, const T* __restrict__ b, int64_t n, double* __restrict__ out) {
  double s = 0.0;
  TNT_KERNEL_LOOP(i, n) { s += static_cast<double>(to_float(a[i])) * static_cast<double>(to_float(b[i])); }
  s = warp_sum(s);
  if ((threadIdx.x & (kWarp - 1)) == 0) atomicAdd(out, s);
}

// splitmix64's finalizer: a counter to 64 well-mixed bits.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void fill_uniform_kernel(T* __restrict__ x, int64_t n, uint64_t seed, float lo, float hi) {
  TNT_KERNEL_LOOP(i, n) {
    const uint64_t r = mix64(seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(i + 1));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // 24 bits: [0, 1)
    x[i] = from_float<T>(lo + (hi - lo) * u);
  }
}

}  // namespace

std::pair<float, float> max_difference(const void* a, const void* b, int64_t n, DType dtype, int device) {
  cudaStream_t stream = compute_stream(device);
  Workspace out(2 * sizeof(unsigned), device);
  TNT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, 2 * sizeof(unsigned), stream));
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(dtype, "max_difference", {
      max_difference_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, stream>>>(
          static_cast<const scalar_t*>(a), static_cast<const scalar_t*>(b), n, out.as<unsigned>());
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  unsigned host[2] = {0, 0};
  TNT_CUDA_CHECK(cudaMemcpyAsync(host, out.data(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  TNT_CUDA_CHECK(cudaStreamSynchronize(stream));
  float r[2];
  memcpy(r, host, sizeof(r));
  return {r[0], r[1]};
}

double dot(const void* a, const void* b, int64_t n, DType dtype, int device) {
  cudaStream_t stream = compute_stream(device);
  Workspace out(sizeof(double), device);
  TNT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, sizeof(double), stream));
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(dtype, "dot", {
      dot_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, stream>>>(
          static_cast<const scalar_t*>(a), static_cast<const scalar_t*>(b), n, out.as<double>());
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  double host = 0;
  TNT_CUDA_CHECK(cudaMemcpyAsync(&host, out.data(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  TNT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

void fill_uniform(void* x, int64_t n, DType dtype, uint64_t seed, float lo, float hi, int device) {
  if (n <= 0) return;
  cudaStream_t stream = compute_stream(device);
  TNT_CUDA_DISPATCH_FLOAT(dtype, "fill_uniform", {
    fill_uniform_kernel<scalar_t>
        <<<grid_for(n, kBlock, device), kBlock, 0, stream>>>(static_cast<scalar_t*>(x), n, seed, lo, hi);
  });
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::cuda
