// The CUDA engine of LabelSmoothingCrossEntropy (label_smoothing_cuda.cu), called by
// label_smoothing.cpp with global_batch > 0 already resolved. What every engine may
// assume: backend/dispatch.hpp. Semantics: loss.hpp. logits (R, V) viewed from (..., V) in
// f32, f16 or bf16 (read as float), labels (R) i32 or i64; exp in float, per-row sums in double, the
// total in a fixed tree; SavedState keeps the logits, the labels and each row's
// log-sum-exp (backward recomputes softmax). A label outside [0, V) (and != pad) is an
// InputError, raised when the host reads the step's readback (step/step_scalars.hpp).
#pragma once

#include "tarantella/loss.hpp"

#include <cstdint>

namespace tnt::cuda {

Tensor label_smoothing_forward(LabelSmoothingCrossEntropy& loss, const Tensor& logits, const Tensor& labels,
                               int64_t global_batch, SavedState& saved);
Tensor label_smoothing_backward(LabelSmoothingCrossEntropy& loss, SavedState& saved, double scale);

}  // namespace tnt::cuda
