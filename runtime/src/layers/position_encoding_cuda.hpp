// The CUDA engine of PositionEncoding (position_encoding_cuda.cu), called by
// position_encoding.cpp. What every engine may assume: backend/dispatch.hpp.
// Semantics: y = x + P with P the layer's host-built f32 table (T, D) (layer.table(), on the
// device), added in float and rounded once to x's dtype; x (B, T, D) f32, f16 or bf16.
#pragma once

#include "tarantella/layers/position_encoding.hpp"

#include <vector>

namespace tnt::cuda {

std::vector<Tensor> position_encoding_forward(PositionEncoding& layer, const std::vector<Tensor>& inputs,
                                              const RunContext& rc, SavedState& saved);

}  // namespace tnt::cuda
