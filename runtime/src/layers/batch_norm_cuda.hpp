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

#include <functional>
#include <vector>

namespace tnt::cuda {

std::vector<Tensor> batch_norm_forward(BatchNorm& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved);
std::vector<Tensor> batch_norm_backward(BatchNorm& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved);

// y = relu(batch_norm(x) [+ z]) in one cuDNN call (CUDNN_BATCHNORM_OPS_BN_ACTIVATION, or
// _BN_ADD_ACTIVATION with z), training only, for a 4-D channels_last x (z of x's shape,
// dtype and format, or undefined), in the persistent NHWC mode, outside deterministic mode.
// Where that does not apply or cuDNN declines it (its queries say not supported or a bad
// parameter), returns false having done nothing, and the chain runs layer by layer. Else
// calls `begin` (BatchNorm::begin_forward: checks, building, the pass counter) first.
// Rounding: the sum and the ReLU are applied in float before y is stored once, where the
// layers round the batch norm's output (and the sum) to x's dtype first.
bool batch_norm_act_forward(BatchNorm& layer, const Tensor& x, const Tensor& z, const RunContext& rc,
                            const std::function<void()>& begin, SavedState& saved, Tensor& y);
// dy (like y) -> {dx, dz} (dz undefined without z); the parameter gradients are added to
// the layer's as its backward does.
std::vector<Tensor> batch_norm_act_backward(BatchNorm& layer, const Tensor& dy, SavedState& saved);

}  // namespace tnt::cuda
