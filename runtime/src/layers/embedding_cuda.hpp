// The CUDA engine of Embedding (embedding_cuda.cu), called by embedding.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics (embedding.hpp):
//   lookup      ids (R) i32/i64 -> y (R, D) = W[id] * sqrt(D), 0 where id == 0. y is f32, or
//               the dtype of the weight's compute copy when the network computes in f16/bf16
//               (the lookup is where activations enter, so it is where they become half).
//               Ids outside [0, V) are an InputError with the CPU engine's message (layer,
//               id, position, vocabulary size) plus the number of the lookup call that had
//               them. The ids stay on the device: each call checks them there and the host
//               learns the result later, without a stall. The error is thrown by the
//               call's own backward (which waits for the check), or earlier by any later
//               call of the layer (forward, lookup or projection) that finds the check
//               finished (it does not wait); so in inference, by the next call after the
//               check has run (after a synchronisation, the very next call). The bad
//               call's output has 0 in the rows of bad ids.
//               backward: dW[id] += sqrt(D) dy[r] over r with id != 0, summed per id in row
//               order (deterministic, no atomics: the rows are sorted by id on the device,
//               a stable radix sort); no input gradient.
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
