// The CUDA engines of the activations (activation_cuda.cu), called by activation.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics:
//   ReLU     y = x > 0 ? x : 0, so a NaN gives 0 (unlike PyTorch, which keeps the NaN);
//            gradient dy where x > 0, else 0 (0 at x == 0 and at a NaN); stores y, as the
//            CPU engine does (y > 0 exactly where x > 0).
//   GELU     layers/gelu_math.hpp, in float, on x of any floating dtype; stores x.
//   Sigmoid, Tanh, LeakyReLU  layers/activation_math.hpp, in float, on x of any floating
//            dtype, results in x's dtype; Sigmoid and Tanh store y, LeakyReLU stores x.
//   Softmax  along layer.axis() (negative axes count from the input's rank).
// Memory formats: every output takes its input's (channels_last stays channels_last); a
// backward needs dy in the format of the tensor forward saved (else an Error).
#pragma once

#include "tarantella/layers/activation.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> relu_forward(ReLU& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                 SavedState& saved);
std::vector<Tensor> relu_backward(ReLU& layer, const std::vector<Tensor>& grad_outputs,
                                  const RunContext& rc, SavedState& saved);
std::vector<Tensor> gelu_forward(GELU& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                 SavedState& saved);
std::vector<Tensor> gelu_backward(GELU& layer, const std::vector<Tensor>& grad_outputs,
                                  const RunContext& rc, SavedState& saved);
std::vector<Tensor> sigmoid_forward(Sigmoid& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                    SavedState& saved);
std::vector<Tensor> sigmoid_backward(Sigmoid& layer, const std::vector<Tensor>& grad_outputs,
                                     const RunContext& rc, SavedState& saved);
std::vector<Tensor> tanh_forward(Tanh& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                 SavedState& saved);
std::vector<Tensor> tanh_backward(Tanh& layer, const std::vector<Tensor>& grad_outputs,
                                  const RunContext& rc, SavedState& saved);
std::vector<Tensor> leaky_relu_forward(LeakyReLU& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved);
std::vector<Tensor> leaky_relu_backward(LeakyReLU& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved);
std::vector<Tensor> softmax_forward(Softmax& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                    SavedState& saved);
std::vector<Tensor> softmax_backward(Softmax& layer, const std::vector<Tensor>& grad_outputs,
                                     const RunContext& rc, SavedState& saved);

}  // namespace tnt::cuda
