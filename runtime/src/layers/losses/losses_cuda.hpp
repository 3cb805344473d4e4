// The CUDA engines of the losses (losses_cuda.cu), called by losses.cpp with global_batch > 0
// already resolved. What every engine may assume: backend/dispatch.hpp.
// Semantics:
//   SoftmaxCrossEntropy  logits (R, K) viewed from (..., K), labels (R) i32 or i64;
//                        loss = sum over rows with label != ignore_index of
//                        -sum_k q_k log softmax(x)_k, q = (1 - s) onehot + s / K, divided by
//                        global_batch. backward: (softmax - q) * scale / global_batch for
//                        counted rows, 0 for ignored rows. A label outside [0, K) (and
//                        != ignore_index) is an error (InputError naming the label).
//                        With sample weights (N) f32: row r of sample n = r / (R / N)
//                        counts w_n times (0 exactly when w_n == 0), in value and gradient.
//   element-wise losses  (MeanSquaredError, MeanAbsoluteError, Huber, BinaryCrossEntropy)
//                        sum over elements of w_n f(p, t) / (global_batch * D) with the
//                        rule of pointwise_rules.hpp; SavedState {w_n f'(p, t)}; backward
//                        that times scale / (global_batch * D). BinaryCrossEntropy: a
//                        target outside [0, 1] is an InputError naming it, as on the CPU.
// A loss forward returns a 1-element f32 tensor on the device.
#pragma once

#include "layers/losses/pointwise_rules.hpp"
#include "tarantella/loss.hpp"

#include <cstdint>

namespace tnt::cuda {

// sample_weights: undefined, or (N) f32 on the logits' device.
Tensor softmax_cross_entropy_forward(SoftmaxCrossEntropy& loss, const Tensor& logits, const Tensor& labels,
                                     const Tensor& sample_weights, int64_t global_batch, SavedState& saved);
Tensor softmax_cross_entropy_backward(SoftmaxCrossEntropy& loss, SavedState& saved, double scale);
// what: the loss's name for messages. targets f32 with the predictions' element count.
Tensor pointwise_loss_forward(const char* what, const losses::PointwiseRule& rule, const Tensor& predictions,
                              const Tensor& targets, const Tensor& sample_weights, int64_t global_batch,
                              SavedState& saved);
Tensor pointwise_loss_backward(SavedState& saved, double scale);

}  // namespace tnt::cuda
