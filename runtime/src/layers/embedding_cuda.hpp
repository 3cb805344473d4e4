// The CUDA engine of Embedding (embedding_cuda.cu), called by embedding.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics (embedding.hpp):
//   lookup      ids (R) i32/i64 -> y (R, D) = W[id] * sqrt(D), 0 where id == 0. y is f32, or
//               the dtype of the weight's compute copy when the network computes in f16/bf16
//               (the lookup is where activations enter, so it is where they become half).
//               Ids outside [0, V) are an InputError (the ids are copied to the host, which
//               also groups the rows by id for the backward).
//               backward: dW[id] += sqrt(D) dy[r] over r with id != 0, summed per id in row
//               order (deterministic, no atomics); no input gradient.
//   projection  x (R, D) -> logits (R, V) = x W^T; dx = dy W; dW += dy^T x (f32, accumulated
//               as Dense's weight gradient is).
#pragma once

#include "tarantella/layers/embedding.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> embedding_forward(Embedding& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                      SavedState& saved);
std::vector<Tensor> embedding_backward(Embedding& layer, const std::vector<Tensor>& grad_outputs,
                                       const RunContext& rc, SavedState& saved);

}  // namespace tnt::cuda
