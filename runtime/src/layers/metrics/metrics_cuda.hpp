// The CUDA engines of the metrics (metrics_cuda.cu), called by metrics.cpp.
// Semantics (tarantella/metrics.hpp): a row counts as correct when the stable descending rank
// of its label (higher score, or equal score and a smaller index, ranks first) is < k, and
// every score of the row is finite (a NaN or an infinity: wrong). A label outside [0, K) (and
// != ignore_index) is an InputError naming it (raised by metrics.cpp when it reads the words).
// BinaryPrecision, BinaryRecall, AUC: the per-element rules of layers/metrics/binary_math.hpp; a target
// other than 0 or 1 is an InputError naming the metric, the value and its index.
#pragma once

#include "tarantella/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace tnt::cuda {

// Both engines write their results into words of the step's readback (step/step_scalars.hpp;
// device memory on CUDA), which metrics.cpp reserves and reads. Counts are integers; a check
// pair is (the first bad element's index, kNone when none; its value as a double).

// scores (R, K), labels (R) i32/i64. words: [0] correct rows, [1] counted rows (label !=
// ignore_index), [2, 4) the check pair of the labels.
constexpr size_t kTopkWords = 2;
void topk_correct(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index, uint64_t* words);

// predictions (n) f32/f16/bf16, targets (n) f32/i32/i64. words: [0, 4) the cells indexed by
// binary::Cell, [4, 6) the check pair of the targets.
constexpr size_t kConfusionWords = 4;
void confusion_counts(const std::string& metric, const Tensor& predictions, const Tensor& targets, double threshold,
                      bool from_logits, uint64_t* words);

// words: [0, 2 bins) the histogram of predictions (n) (positives, then negatives), [2 bins,
// 2 bins + 2) the check pair of the targets.
void auc_histogram(const Tensor& predictions, const Tensor& targets, int64_t bins, bool from_logits, uint64_t* words);

}  // namespace tnt::cuda
