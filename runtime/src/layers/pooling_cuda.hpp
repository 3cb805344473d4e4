// The CUDA engines of MaxPool2D, AvgPool2D and GlobalAveragePool (pooling_cuda.cu), called by
// pooling.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics:
//   MaxPool2D          padding never wins; a NaN anywhere in a window is the output (as
//                      PyTorch). The gradient goes to the window's FIRST maximum in row-major
//                      order, or to its first NaN.
//   AvgPool2D          padded positions are excluded from the divisor.
//   GlobalAveragePool  (N, C, H, W) -> (N, C).
// Memory formats: inputs in either format; outputs (but GlobalAveragePool's (N, C)) and dx
// in the input's, dy in the output's.
#pragma once

#include "tarantella/layers/pooling.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> max_pool2d_forward(MaxPool2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved);
std::vector<Tensor> max_pool2d_backward(MaxPool2D& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved);
std::vector<Tensor> avg_pool2d_forward(AvgPool2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved);
std::vector<Tensor> avg_pool2d_backward(AvgPool2D& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved);
std::vector<Tensor> global_average_pool_forward(GlobalAveragePool& layer, const std::vector<Tensor>& inputs,
                                                const RunContext& rc, SavedState& saved);
std::vector<Tensor> global_average_pool_backward(GlobalAveragePool& layer, const std::vector<Tensor>& grad_outputs,
                                                 const RunContext& rc, SavedState& saved);

}  // namespace tnt::cuda
