// The per-element rules of BinaryPrecision, BinaryRecall and AUC (tarantella/metrics.hpp), written once
// for the CPU loop (metrics.cpp) and the CUDA kernels (metrics_cuda.cu).
#pragma once

#include "core/host_device.hpp"
#include "layers/activation_math.hpp"

#include <cstdint>

namespace tnt::binary {

// Where an element lands in the confusion matrix; the index into ConfusionCounts' order.
enum Cell : int { kTruePositive = 0, kFalsePositive = 1, kFalseNegative = 2, kTrueNegative = 3 };

// 1 for a positive target, 0 for a negative one, -1 for anything else (a NaN included).
template <typename T>
TNT_HD int target_class(T t) {
  return t == T(1) ? 1 : (t == T(0) ? 0 : -1);
}

TNT_HD float probability(float prediction, bool from_logits) {
  return from_logits ? act::sigmoid(prediction) : prediction;
}

// A NaN fails every comparison, so it is tested first: it must count as wrong, not as
// "not above the threshold" (which would make it a right answer for every negative).
TNT_HD Cell cell(float p, bool positive, double threshold) {
  if (p != p) return positive ? kFalseNegative : kFalsePositive;
  const bool predicted = static_cast<double>(p) > threshold;
  if (positive) return predicted ? kTruePositive : kFalseNegative;
  return predicted ? kFalsePositive : kTrueNegative;
}

// The AUC histogram's bin of probability p: min(floor(p * bins), bins - 1) after clamping to
// [0, 1]; a NaN goes to the wrong end (a positive's to bin 0, a negative's to the top bin).
TNT_HD int64_t bin(float p, bool positive, int64_t bins) {
  if (p != p) return positive ? 0 : bins - 1;
  const double c = p < 0.0f ? 0.0 : (p > 1.0f ? 1.0 : static_cast<double>(p));
  const int64_t b = static_cast<int64_t>(c * static_cast<double>(bins));
  return b < bins ? b : bins - 1;
}

}  // namespace tnt::binary
