// Elementwise optimizer updates on CUDA (and clipping by value): one grid-stride loop per rule
// of optim/update_rules.hpp. Each element is independent, so results do not depend on the
// launch configuration.
#include "optim/optim_cuda.hpp"

#include "backend/cuda/cuda_context.hpp"

namespace tnt::cuda {

namespace {

constexpr int kBlock = 256;

__global__ void sgd_kernel(optim::SgdRule rule,
                           float* __restrict__ param,       // (n)
                           const float* __restrict__ grad,  // (n)
                           float* __restrict__ buf,         // (n), or null without momentum
                           int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    optim::apply(rule, param[i], grad[i], buf != nullptr ? buf + i : nullptr);
  }
}

__global__ void adam_kernel(optim::AdamRule rule,
                            float* __restrict__ param,       // (n)
                            const float* __restrict__ grad,  // (n)
                            float* __restrict__ m,           // (n)
                            float* __restrict__ v,           // (n)
                            int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    optim::apply(rule, param[i], grad[i], m[i], v[i]);
  }
}

__global__ void clip_value_kernel(float* __restrict__ grad,  // (n)
                                  float limit, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    grad[i] = optim::clip_value(grad[i], limit);
  }
}

}  // namespace

void sgd_update(const optim::SgdRule& rule, float* param, const float* grad, float* buf, int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  sgd_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(rule, param, grad, buf, n);
  TNT_CUDA_CHECK_LAUNCH();
}

void adam_update(const optim::AdamRule& rule, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  adam_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(rule, param, grad, exp_avg,
                                                                                 exp_avg_sq, n);
  TNT_CUDA_CHECK_LAUNCH();
}

void clip_value(float* grad, float limit, int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  clip_value_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(grad, limit, n);
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::cuda
