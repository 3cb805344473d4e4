// Elementwise optimizer updates on CUDA: one grid-stride loop per optimizer, each element
// independent, so results do not depend on the launch configuration.
#include "optim/optim_cuda.hpp"

#include "backend/cuda/cuda_context.hpp"

namespace tnt::cuda {

namespace {

constexpr int kBlock = 256;

__global__ void sgd_kernel(float* __restrict__ param, const float* __restrict__ grad,
                           float* __restrict__ buf, int64_t n, float lr, float momentum,
                           float one_minus_dampening, float weight_decay, bool nesterov, bool first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float g = grad[i] + weight_decay * param[i];
    if (buf != nullptr) {
      const float b = first ? g : momentum * buf[i] + one_minus_dampening * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    param[i] -= lr * g;
  }
}

__global__ void adam_kernel(float* __restrict__ param, const float* __restrict__ grad,
                            float* __restrict__ m, float* __restrict__ v, int64_t n, float beta1,
                            float omb1, float beta2, float omb2, float eps, float l2, float decay_factor, float step_size,
                            float inv_sqrt_bc2) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float p = param[i] * decay_factor;
    const float g = grad[i] + l2 * p;
    const float mi = beta1 * m[i] + omb1 * g;
    const float vi = beta2 * v[i] + omb2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

void sgd_update(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                float one_minus_dampening, float weight_decay, bool nesterov, bool first, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  sgd_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
      param, grad, buf, n, lr, momentum, one_minus_dampening, weight_decay, nesterov, first);
  TNT_CUDA_CHECK_LAUNCH();
}

void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                 float beta1, float omb1, float beta2, float omb2, float eps, float l2, float decay_factor,
                 float step_size, float inv_sqrt_bc2, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  adam_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
      param, grad, exp_avg, exp_avg_sq, n, beta1, omb1, beta2, omb2, eps, l2, decay_factor, step_size,
      inv_sqrt_bc2);
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::cuda
