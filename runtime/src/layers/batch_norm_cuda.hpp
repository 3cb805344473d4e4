// The CUDA engine of BatchNorm (batch_norm_cuda.cu), called by batch_norm.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics: over axis 1 of (N, C) or (N, C, H, W). Training: batch mean and biased variance
// normalise; running = (1 - m) * running + m * batch, running_var takes the UNBIASED batch
// variance (N*H*W / (N*H*W - 1)); updated in forward(training). Inference: the running
// statistics. Backward in training uses the batch statistics; in inference the running ones
// (a per-channel affine map).
// Memory formats: a 4-D x in either format; y and dx in x's, dy in x's too.
#pragma once

#include "tarantella/layers/batch_norm.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> batch_norm_forward(BatchNorm& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved);
std::vector<Tensor> batch_norm_backward(BatchNorm& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved);

}  // namespace tnt::cuda
