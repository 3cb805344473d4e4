// CUDA update kernels of the optimizers (optim_cuda.cu), launched on the device's compute
// stream. Each element goes through the same rule as the CPU loops (optim/update_rules.hpp),
// with the scalars the host derived once for both engines.
#pragma once

#include "optim/multi_tensor.hpp"
#include "optim/update_rules.hpp"

#include <cstdint>
#include <optional>

namespace tnt::cuda {

// Per parameter: one launch per tensor.

// param, grad, buf: (n,). buf is null when momentum == 0.
void sgd_update(const optim::SgdRule& rule, float* param, const float* grad, float* buf, int64_t n, int device);

// param, grad, exp_avg, exp_avg_sq: (n,).
void adam_update(const optim::AdamRule& rule, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 int64_t n, int device);

// grad: (n,), each element clipped into [-limit, limit] in place.
void clip_value(float* grad, float limit, int64_t n, int device);

// The sum of grad's squares in double, chunk by chunk as the multi-tensor clipping sums a
// tensor (so both paths clip alike, bit for bit), with one readback.
double sum_squares_chunked(const float* grad, int64_t n, int64_t chunk_elements, int device);

// Multi-tensor: one launch per step over an uploaded table (optim/multi_tensor.hpp). Row
// r of the table follows rules[chunk.rule]; rules has at most optim::kMaxRules entries.

// slot0 of each row: the momentum buffer, or null without momentum.
void multi_tensor_sgd(const optim::MtLaunch& launch, const optim::SgdRule* rules, int n_rules);

// slot0, slot1 of each row: exp_avg, exp_avg_sq.
void multi_tensor_adam(const optim::MtLaunch& launch, const optim::AdamRule* rules, int n_rules);

// Clipping of every row's gradient, on the device without a readback: with a norm, the
// squares of each chunk (one block each), then one block sums them per tensor (and over
// tensors for global) in a fixed order and derives the factors, then one pass scales and
// clips by value. norm and global_norm exclude each other (optim/clip.cpp checks).
struct MultiTensorClip {
  std::optional<double> value;
  std::optional<double> norm;
  std::optional<double> global_norm;
};
void multi_tensor_clip(const optim::MtLaunch& launch, const MultiTensorClip& clip);

}  // namespace tnt::cuda
