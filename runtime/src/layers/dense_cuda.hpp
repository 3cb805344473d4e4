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
// The same, but the input gradient is ADDED to `sum` (x's shape and dtype), in the product
// (cuBLAS's beta = 1: one rounding of sum + dy W instead of two, and no tensor for dy W
// alone); returns sum. MultiHeadAttention's backward sums the gradients of its three
// projections of one input this way. Where the forward skipped the input gradient
// (SavedState::need_input_grads), sum is returned untouched.
Tensor dense_backward_add(Dense& layer, const Tensor& dy, const RunContext& rc, SavedState& saved, const Tensor& sum);

}  // namespace tnt::cuda
