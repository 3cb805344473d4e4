// The CUDA engine of the top-k accuracy metrics (metrics_cuda.cu), called by metrics.cpp.
// Semantics (tarantella/metrics.hpp): a row counts as correct when the stable descending rank
// of its label (higher score, or equal score and a smaller index, ranks first) is < k, and
// every score of the row is finite (a NaN or an infinity: wrong). A label outside [0, K) (and
// != ignore_index) is an InputError naming it.
#pragma once

#include "tarantella/tensor.hpp"

#include <cstdint>

namespace tnt::cuda {

// What both engines return.
struct MetricCounts {
  int64_t correct = 0;
  int64_t count = 0;  // rows whose label != ignore_index
};

// scores (R, K) f32, labels (R) i32/i64.
MetricCounts topk_correct(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index);

}  // namespace tnt::cuda
