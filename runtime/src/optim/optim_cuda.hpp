// CUDA update kernels of the optimizers (optim_cuda.cu), launched on the device's compute
// stream. Scalars come precomputed from the host, in the same formulas as the CPU loops of
// sgd.cpp and adam.cpp, so both engines do the same f32 arithmetic per element.
#pragma once

#include <cstdint>

namespace tnt::cuda {

// param, grad, buf: (n,). buf may be null when momentum == 0. first: buf <- g.
// Differences such as 1 - dampening and 1 - beta come rounded from double (as PyTorch).
void sgd_update(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                float one_minus_dampening, float weight_decay, bool nesterov, bool first, int device);

// param, grad, exp_avg, exp_avg_sq: (n,). l2 is added to the gradient (Adam); decay_factor
// multiplies the parameter first (AdamW: 1 - lr * wd; Adam: 1). step_size = lr / (1 - b1^t),
// inv_sqrt_bc2 = 1 / sqrt(1 - b2^t).
void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                 float beta1, float omb1, float beta2, float omb2, float eps, float l2, float decay_factor,
                 float step_size, float inv_sqrt_bc2, int device);

}  // namespace tnt::cuda
