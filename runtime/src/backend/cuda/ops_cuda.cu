// CUDA engines of tarantella/ops.hpp. The caller (backend/cpu/ops_cpu.cpp) has checked
// counts, dtypes and devices. Element-wise ops compute in float whatever the storage type;
// reductions accumulate in double, per block in a fixed tree and across blocks in a
// second one-block pass, so a result is the same run to run on one device.
#include "backend/cuda/ops_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/vector_io.cuh"
#include "core/device_api.hpp"

#include <cmath>
#include <limits>

namespace tnt::cuda {

namespace {

// The element-wise ops are functors run by launch_elementwise (backend/cuda/vector_io.cuh):
// 16-byte accesses where the pointers allow, the same per-element arithmetic either way.

// y + alpha x with one rounding: written as an explicit fused multiply-add, which is what
// nvcc's default contraction made of the former `to_float(y) + alpha * to_float(x)`, so the
// result does not depend on compiler flags and a host std::fma reproduces it.
template <typename T>
struct Axpy {
  float alpha;
  __device__ T operator()(int64_t, T y, T x) const { return from_float<T>(__fmaf_rn(alpha, to_float(x), to_float(y))); }
};

template <typename T>
struct Scale {
  float alpha;
  __device__ T operator()(int64_t, T x) const { return from_float<T>(to_float(x) * alpha); }
};

template <typename T>
struct Add {
  __device__ T operator()(int64_t, T a, T b) const { return from_float<T>(to_float(a) + to_float(b)); }
};

// Two tensors meeting element by element must share a memory format, else element i of one
// is not element i of the other.
void check_same_format(const Tensor& a, const Tensor& b, const char* what) {
  TNT_CHECK(a.memory_format() == b.memory_format(), "{}: {} and {} have different memory formats", what, a.str(),
            b.str());
}

struct Identity {
  __device__ double operator()(double v) const { return v; }
};
struct Square {
  __device__ double operator()(double v) const { return v * v; }
};

// partials[block] = sum over this block's grid-stride share of f(x).
template <typename T, typename F>
__global__ void reduce_partials_kernel(const T* __restrict__ x,  // (n)
                                       int64_t n,
                                       double* __restrict__ partials,  // (gridDim.x)
                                       F f) {
  __shared__ double scratch[kWarp];
  double acc = 0.0;
  TNT_KERNEL_LOOP(i, n) { acc += f(static_cast<double>(to_float(x[i]))); }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: out[0] = sum of the partials in a fixed order.
__global__ void reduce_final_kernel(const double* __restrict__ partials,  // (count)
                                    int count, double* __restrict__ out) {
  __shared__ double scratch[kWarp];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = acc;
}

template <typename F>
double reduce(const Tensor& x, F f, const char* what) {
  int device = common_device({&x}, what);
  int64_t n = x.numel();
  if (n == 0) return 0.0;
  unsigned grid = grid_for(n, kBlock, device);
  cudaStream_t stream = compute_stream(device);
  Workspace ws((grid + 1) * sizeof(double), device);
  double* partials = ws.as<double>();  // (grid)
  double* total = partials + grid;     // (1)
  TNT_CUDA_DISPATCH_FLOAT(x.dtype(), what, {
    reduce_partials_kernel<scalar_t, F>
        <<<grid, kBlock, 0, stream>>>(static_cast<const scalar_t*>(x.raw()), n, partials, f);
  });
  TNT_CUDA_CHECK_LAUNCH();
  reduce_final_kernel<<<1, kBlock, 0, stream>>>(partials, static_cast<int>(grid), total);
  TNT_CUDA_CHECK_LAUNCH();
  double host = 0.0;
  backend::cuda_copy(&host, Device::cpu(), total, Device::cuda(device), sizeof(double));
  return host;
}

template <typename T>
__global__ void non_finite_kernel(const T* __restrict__ x,  // (n)
                                  int64_t n, int* __restrict__ flag) {
  TNT_KERNEL_LOOP(i, n) {
    if (!isfinite(to_float(x[i]))) *flag = 1;  // every writer writes 1: the race is benign
  }
}

// One warp per row: the first maximum (smallest index among equal maxima), with the CPU
// engine's NaN rule. The CPU scans j = 1, 2, ... keeping j when row[j] > row[best]; a NaN
// never compares greater, so it never takes over, and a NaN at index 0 is never replaced.
// Hence: row[0] NaN -> 0; else the first maximum of the non-NaN elements (row[0] is one).
// Each lane skips its NaNs: a lane holding a NaN would beat nothing and let nothing beat
// it, and the butterfly below would then lose another lane's maximum through it.
template <typename T>
__global__ void argmax_rows_kernel(const T* __restrict__ x,  // (R, K)
                                   int64_t rows, int64_t k,
                                   int64_t* __restrict__ out) {  // (R)
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_per_block = blockDim.x / kWarp;
  for (int64_t r = blockIdx.x * warps_per_block + threadIdx.x / kWarp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    const T* row = x + r * k;
    float best = -INFINITY;
    int64_t best_j = k;  // k = "no element seen"
    for (int64_t j = lane; j < k; j += kWarp) {
      float v = to_float(row[j]);
      if (v != v) continue;  // NaN: never the CPU's answer but at index 0 (below)
      if (best_j == k || v > best) {
        best = v;
        best_j = j;
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      float ov = __shfl_xor_sync(0xffffffffu, best, offset);
      int64_t oj = __shfl_xor_sync(0xffffffffu, best_j, offset);
      bool take = oj != k && (best_j == k || ov > best || (ov == best && oj < best_j));
      if (take) {
        best = ov;
        best_j = oj;
      }
    }
    if (lane == 0) {
      const float first = to_float(row[0]);
      out[r] = (best_j == k || first != first) ? 0 : best_j;  // all NaN, or a leading NaN: 0
    }
  }
}

}  // namespace

void axpy(double alpha, const Tensor& x, const Tensor& y) {
  int device = common_device({&x, &y}, "ops::axpy");
  check_same_format(x, y, "ops::axpy");
  TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "ops::axpy", {
    auto* yp = static_cast<scalar_t*>(y.raw());
    launch_elementwise(device, x.numel(), Axpy<scalar_t>{static_cast<float>(alpha)}, yp,
                       static_cast<const scalar_t*>(yp), static_cast<const scalar_t*>(x.raw()));
  });
}

void scale(const Tensor& x, double alpha) {
  int device = common_device({&x}, "ops::scale");
  TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "ops::scale", {
    auto* xp = static_cast<scalar_t*>(x.raw());
    launch_elementwise(device, x.numel(), Scale<scalar_t>{static_cast<float>(alpha)}, xp,
                       static_cast<const scalar_t*>(xp));
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  int device = common_device({&a, &b, &out}, "ops::add");
  check_same_format(a, b, "ops::add");
  check_same_format(a, out, "ops::add");
  TNT_CUDA_DISPATCH_FLOAT(a.dtype(), "ops::add", {
    launch_elementwise(device, a.numel(), Add<scalar_t>{}, static_cast<scalar_t*>(out.raw()),
                       static_cast<const scalar_t*>(a.raw()), static_cast<const scalar_t*>(b.raw()));
  });
}

void copy_cast(const Tensor& src, const Tensor& dst) {
  int device = common_device({&src, &dst}, "ops::copy_cast");
  if (src.numel() == 0) return;
  // A byte copy only when the bytes mean the same elements; cast converts formats.
  if (src.dtype() == dst.dtype() && src.memory_format() == dst.memory_format()) {
    TNT_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                   compute_stream(device)));
    return;
  }
  cast(src, dst);
}

double sum(const Tensor& x) { return reduce(x, Identity{}, "ops::sum"); }

double sum_squares(const Tensor& x) { return reduce(x, Square{}, "ops::sum_squares"); }

bool has_non_finite(const Tensor& x) {
  int device = common_device({&x}, "ops::has_non_finite");
  DType d = x.dtype();
  if (!(d == DType::f32 || d == DType::f16 || d == DType::bf16) || x.numel() == 0) return false;
  int64_t n = x.numel();
  cudaStream_t stream = compute_stream(device);
  Workspace ws(sizeof(int), device);
  TNT_CUDA_CHECK(cudaMemsetAsync(ws.data(), 0, sizeof(int), stream));
  TNT_CUDA_DISPATCH_FLOAT(d, "ops::has_non_finite", {
    non_finite_kernel<scalar_t>
        <<<grid_for(n, kBlock, device), kBlock, 0, stream>>>(static_cast<const scalar_t*>(x.raw()), n, ws.as<int>());
  });
  TNT_CUDA_CHECK_LAUNCH();
  int flag = 0;
  backend::cuda_copy(&flag, Device::cpu(), ws.data(), Device::cuda(device), sizeof(int));
  return flag != 0;
}

// The loss scaler's check of every gradient after the allreduce: one flag for all tensors,
// one launch per tensor, all queued on the compute stream, and a single readback at the
// end, so the host waits once per step instead of once per parameter.
bool has_non_finite(const std::vector<Tensor>& xs) {
  if (xs.empty()) return false;
  const int device = common_device({&xs[0]}, "ops::has_non_finite");
  for (const Tensor& x : xs) {
    TNT_CHECK(device_of(x, "ops::has_non_finite") == device,
              "ops::has_non_finite: tensors on cuda:{} and {}: all must be on one device", device,
              x.device().str());
  }
  cudaStream_t stream = compute_stream(device);
  Workspace ws(sizeof(int), device);
  int* flag = ws.as<int>();  // (1): 0, or 1 once any element is NaN or infinite
  TNT_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  for (const Tensor& x : xs) {
    const DType d = x.dtype();
    const int64_t n = x.numel();
    // Integer tensors cannot hold a NaN or infinity (the single-tensor version says false).
    if (n == 0 || !(d == DType::f32 || d == DType::f16 || d == DType::bf16)) continue;
    TNT_CUDA_DISPATCH_FLOAT(d, "ops::has_non_finite", {
      non_finite_kernel<scalar_t>
          <<<grid_for(n, kBlock, device), kBlock, 0, stream>>>(static_cast<const scalar_t*>(x.raw()), n, flag);
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  int host = 0;
  backend::cuda_copy(&host, Device::cpu(), flag, Device::cuda(device), sizeof(int));
  return host != 0;
}

void argmax_rows(const Tensor& x, const Tensor& out) {
  int device = common_device({&x, &out}, "ops::argmax_rows");
  TNT_CHECK(out.dtype() == DType::i64, "ops::argmax_rows: output must be i64, got {}", out.str());
  int64_t k = x.dim(-1);
  int64_t rows = k > 0 ? x.numel() / k : 0;
  if (rows == 0) return;
  constexpr int warps = kBlock / kWarp;
  unsigned grid = grid_for(rows, warps, device);
  TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "ops::argmax_rows", {
    argmax_rows_kernel<scalar_t><<<grid, kBlock, 0, compute_stream(device)>>>(
        static_cast<const scalar_t*>(x.raw()), rows, k, static_cast<int64_t*>(out.raw()));
  });
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::cuda
