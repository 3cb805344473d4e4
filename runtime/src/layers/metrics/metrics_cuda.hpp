// The CUDA engines of the metrics (metrics_cuda.cu), called by metrics.cpp.
// Semantics (tarantella/metrics.hpp): a row counts as correct when the stable descending rank
// of its label (higher score, or equal score and a smaller index, ranks first) is < k, and
// every score of the row is finite (a NaN or an infinity: wrong). A label outside [0, K) (and
// != ignore_index) is an InputError naming it.
// BinaryPrecision, BinaryRecall, AUC: the per-element rules of layers/metrics/binary_math.hpp; a target
// other than 0 or 1 is an InputError naming the metric, the value and its index.
#pragma once

#include "tarantella/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace tnt::cuda {

// What both engines return.
struct MetricCounts {
  int64_t correct = 0;
  int64_t count = 0;  // rows whose label != ignore_index
};

// scores (R, K) f32, labels (R) i32/i64.
MetricCounts topk_correct(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index);

// What both engines of the binary metrics return.
struct ConfusionCounts {
  int64_t counts[4] = {0, 0, 0, 0};  // indexed by binary::Cell
};

// predictions (n) f32/f16/bf16, targets (n) f32/i32/i64.
ConfusionCounts confusion_counts(const std::string& metric, const Tensor& predictions, const Tensor& targets,
                                 double threshold, bool from_logits);

// Adds the (2, bins) histogram (positives, then negatives) of predictions (n) to hist.
void auc_histogram(const Tensor& predictions, const Tensor& targets, int64_t bins, bool from_logits,
                   std::vector<double>& hist);

}  // namespace tnt::cuda
