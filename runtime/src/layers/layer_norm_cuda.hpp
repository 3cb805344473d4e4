// The CUDA engine of LayerNorm (layer_norm_cuda.cu), called by layer_norm.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics: layer_norm.hpp. x, y, dy, dx in x's dtype (f32, f16, bf16); statistics,
// weight, bias and their gradients f32; all arithmetic in float.
#pragma once

#include "tarantella/layers/layer_norm.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> layer_norm_forward(LayerNorm& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved);
std::vector<Tensor> layer_norm_backward(LayerNorm& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved);

}  // namespace tnt::cuda
