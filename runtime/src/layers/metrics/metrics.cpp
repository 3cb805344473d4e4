#include "tarantella/metrics.hpp"

#include "backend/dispatch.hpp"
#include "layers/metrics/metrics_cuda.hpp"
#include "tarantella/check.hpp"

#include <cmath>

namespace tnt {

TopKAccuracy::TopKAccuracy(int64_t k, int64_t ignore_index) : k_(k), ignore_index_(ignore_index) {
  TNT_CHECK(k >= 1, "TopKAccuracy: k must be at least 1, got {}", k);
}

std::string TopKAccuracy::name() const { return fmt::format("top{}_accuracy", k_); }

namespace {

cuda::MetricCounts topk_correct_cpu(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index) {
  const int64_t classes = scores.dim(-1), rows = scores.numel() / classes;
  const float* x = scores.data<float>();  // (R, K)
  cuda::MetricCounts c;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = labels.dtype() == DType::i32 ? labels.data<int32_t>()[r] : labels.data<int64_t>()[r];
    if (label == ignore_index) continue;
    if (label < 0 || label >= classes) {
      TNT_INPUT_ERROR("accuracy: label {} of sample {} is outside the {} classes [0, {})", label, r, classes,
                      classes);
    }
    const float* xr = x + r * classes;
    const float v = xr[label];
    int64_t ahead = 0;  // classes ranked before the label in a stable descending order
    bool finite = true;
    for (int64_t j = 0; j < classes; ++j) {
      ahead += xr[j] > v || (xr[j] == v && j < label);
      finite = finite && std::isfinite(xr[j]);
    }
    // A NaN compares false with everything, so it never ranks ahead of the label: without
    // this, a diverged model (NaN scores) would score 100%. No ranking exists in such a
    // row, so it counts as wrong (an infinity too: it is as much a sign of divergence).
    c.correct += finite && ahead < k;
    ++c.count;
  }
  return c;
}

cuda::MetricCounts topk_dispatch(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index) {
  TNT_CUDA_DISPATCH(scores.device(), cuda::topk_correct(scores, labels, k, ignore_index));
  return topk_correct_cpu(scores, labels, k, ignore_index);
}

}  // namespace

void TopKAccuracy::update(const Tensor& predictions, const Tensor& labels) {
  TNT_CHECK(predictions.defined() && labels.defined(), "{}: undefined predictions or labels", name());
  TNT_CHECK(predictions.ndim() >= 1 && predictions.dim(-1) > 0, "{}: predictions {} are not (..., K)", name(),
            predictions.str());
  const int64_t rows = predictions.numel() / predictions.dim(-1);
  TNT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
            "{}: labels must be i32 or i64 class indices, got {}", name(), labels.str());
  TNT_CHECK(labels.numel() == rows, "{}: {} labels for {} rows of predictions {}", name(), labels.numel(), rows,
            predictions.str());
  TNT_CHECK(labels.device() == predictions.device(), "{}: predictions on {} but labels on {}", name(),
            predictions.device().str(), labels.device().str());
  TNT_CHECK(predictions.dtype() == DType::f32 || predictions.device().is_cuda(),
            "{}: the CPU engine computes in f32, got {}", name(), predictions.str());
  cuda::MetricCounts c = topk_dispatch(predictions, labels, k_, ignore_index_);
  total_ += static_cast<double>(c.correct);
  count_ += static_cast<double>(c.count);
}

}  // namespace tnt
