// CUDA update kernels of the optimizers (optim_cuda.cu), launched on the device's compute
// stream. Each element goes through the same rule as the CPU loops (optim/update_rules.hpp),
// with the scalars the host derived once for both engines.
#pragma once

#include "optim/update_rules.hpp"

#include <cstdint>

namespace tnt::cuda {

// param, grad, buf: (n,). buf is null when momentum == 0.
void sgd_update(const optim::SgdRule& rule, float* param, const float* grad, float* buf, int64_t n, int device);

// param, grad, exp_avg, exp_avg_sq: (n,).
void adam_update(const optim::AdamRule& rule, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 int64_t n, int device);

// grad: (n,), each element clipped into [-limit, limit] in place.
void clip_value(float* grad, float limit, int64_t n, int device);

}  // namespace tnt::cuda
