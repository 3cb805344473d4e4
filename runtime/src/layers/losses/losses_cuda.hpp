// The CUDA engines of the losses (losses_cuda.cu), called by losses.cpp with global_batch > 0
// already resolved. What every engine may assume: backend/dispatch.hpp.
// Semantics:
//   SoftmaxCrossEntropy  logits (R, K) viewed from (..., K), labels (R) i32 or i64;
//                        loss = sum over rows with label != ignore_index of
//                        -sum_k q_k log softmax(x)_k, q = (1 - s) onehot + s / K, divided by
//                        global_batch. backward: (softmax - q) * scale / global_batch for
//                        counted rows, 0 for ignored rows. A label outside [0, K) (and
//                        != ignore_index) is an error (InputError naming the label).
//   MeanSquaredError     sum (p - t)^2 / (global_batch * D);
//                        backward 2 (p - t) scale / (global_batch * D).
// A loss forward returns a 1-element f32 tensor on the device.
#pragma once

#include "tarantella/loss.hpp"

#include <cstdint>

namespace tnt::cuda {

Tensor softmax_cross_entropy_forward(SoftmaxCrossEntropy& loss, const Tensor& logits, const Tensor& labels,
                                     int64_t global_batch, SavedState& saved);
Tensor softmax_cross_entropy_backward(SoftmaxCrossEntropy& loss, SavedState& saved, double scale);
Tensor mean_squared_error_forward(MeanSquaredError& loss, const Tensor& predictions, const Tensor& targets,
                                  int64_t global_batch, SavedState& saved);
Tensor mean_squared_error_backward(MeanSquaredError& loss, SavedState& saved, double scale);

}  // namespace tnt::cuda
