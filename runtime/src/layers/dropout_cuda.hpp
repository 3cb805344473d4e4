// The CUDA engine of Dropout (dropout_cuda.cu), called by dropout.cpp.
// What every engine may assume, and the mixed-precision rules: backend/dispatch.hpp.
// Semantics: training only (inference never reaches the engine): keep element i iff
// philox::uniform4(layer.mask_key(rc), Dropout::mask_counter(rc, shape) + i) >= float(layer.rate()),
// kept values scaled by 1 / (1 - rate) (core/philox.hpp), i the element's LOGICAL index (so a
// channels_last tensor gets the contiguous tensor's mask); y and dx take the memory format of
// x and dy. The engine must leave saved.tensors
// or saved.extra non-empty (the mask): an empty SavedState tells backward that forward was the
// identity.
#pragma once

#include "tarantella/layers/dropout.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> dropout_forward(Dropout& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                    SavedState& saved);
std::vector<Tensor> dropout_backward(Dropout& layer, const std::vector<Tensor>& grad_outputs,
                                     const RunContext& rc, SavedState& saved);

// The fused chain Dropout -> Add (dropout_add_fusion.cpp): outputs = {x + dropout(h)} with
// the bits of the two layers one by one; h and x contiguous, of one shape, dtype and device,
// in training with a rate above 0 (the caller checks). Keeps the decisions as bits in saved.
// Returns true (it always runs).
bool dropout_add_forward(Dropout& layer, const Tensor& h, const Tensor& x, const RunContext& rc, SavedState& saved,
                         std::vector<Tensor>& outputs);
// {dh, dx}: dh = dy * scale where kept, 0 elsewhere; dx is dy itself (not a copy).
std::vector<Tensor> dropout_add_backward(Dropout& layer, const Tensor& dy, SavedState& saved);

}  // namespace tnt::cuda
