// defer_has_non_finite's kernels (step/step_scalars.hpp): the loss scaler's overflow check
// of the summed gradients, writing a flag word of the step's buffer instead of reading back.
#include "backend/cuda/device_common.cuh"
#include "step/step_scalars.hpp"

namespace tnt::cuda {

namespace {

template <typename T>
__global__ void flag_non_finite_kernel(const T* __restrict__ x,  // (n)
                                       int64_t n, unsigned long long* __restrict__ flag) {
  TNT_KERNEL_LOOP(i, n) {
    if (!isfinite(to_float(x[i]))) *flag = 1ull;  // every writer writes 1: the race is benign
  }
}

}  // namespace

void flag_non_finite(const std::vector<Tensor>& xs, uint64_t* flag) {
  if (xs.empty()) return;
  const int device = common_device({&xs[0]}, "loss scaling's overflow check");
  for (const Tensor& x : xs) {
    TNT_CHECK(device_of(x, "loss scaling's overflow check") == device,
              "loss scaling's overflow check: tensors on cuda:{} and {}: all must be on one device", device,
              x.device().str());
  }
  cudaStream_t stream = compute_stream(device);
  for (const Tensor& x : xs) {
    const DType d = x.dtype();
    const int64_t n = x.numel();
    // Integer tensors cannot hold a NaN or an infinity (as ops::has_non_finite).
    if (n == 0 || !(d == DType::f32 || d == DType::f16 || d == DType::bf16)) continue;
    TNT_CUDA_DISPATCH_FLOAT(d, "loss scaling's overflow check", {
      flag_non_finite_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, stream>>>(
          static_cast<const scalar_t*>(x.raw()), n, reinterpret_cast<unsigned long long*>(flag));
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace tnt::cuda
