// The CUDA engine of Dense (dense_cuda.cu), called by dense.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics: y = x W^T + b over the last axis; x (..., in) -> (..., units); W (units, in).
#pragma once

#include "tarantella/layers/dense.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> dense_forward(Dense& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                  SavedState& saved);
std::vector<Tensor> dense_backward(Dense& layer, const std::vector<Tensor>& grad_outputs,
                                   const RunContext& rc, SavedState& saved);

}  // namespace tnt::cuda
