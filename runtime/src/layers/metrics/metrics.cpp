#include "tarantella/metrics.hpp"

#include "backend/dispatch.hpp"
#include "layers/metrics/binary_math.hpp"
#include "layers/metrics/metrics_cuda.hpp"
#include "tarantella/check.hpp"

#include <algorithm>
#include <cmath>

namespace tnt {

void Metric::set_sums(const std::vector<double>& sums) {
  TNT_CHECK(sums.size() == 2, "{}: set_sums with {} sums, expected (total, count)", name(), sums.size());
  total_ = sums[0];
  count_ = sums[1];
}

double Metric::value_of(const std::vector<double>& sums) const {
  TNT_CHECK(sums.size() == 2, "{}: value_of {} sums, expected (total, count)", name(), sums.size());
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

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

namespace {

// The checks both engines of the binary metrics rely on.
void check_binary_inputs(const std::string& metric, const Tensor& predictions, const Tensor& targets) {
  TNT_CHECK(predictions.defined() && targets.defined(), "{}: undefined predictions or targets", metric);
  TNT_CHECK(targets.dtype() == DType::f32 || targets.dtype() == DType::i32 || targets.dtype() == DType::i64,
            "{}: targets must be f32, i32 or i64 holding 0 or 1, got {}", metric, targets.str());
  TNT_CHECK(targets.numel() == predictions.numel(), "{}: {} targets for {} predictions {}", metric, targets.numel(),
            predictions.numel(), predictions.str());
  TNT_CHECK(targets.device() == predictions.device(), "{}: predictions on {} but targets on {}", metric,
            predictions.device().str(), targets.device().str());
  TNT_CHECK(predictions.dtype() == DType::f32 || predictions.device().is_cuda(),
            "{}: the CPU engine computes in f32, got {}", metric, predictions.str());
}

[[noreturn]] void bad_target(const std::string& metric, double value, int64_t index) {
  TNT_INPUT_ERROR("{}: target {} of element {} is not 0 or 1 (binary metrics take 0/1 targets)", metric, value,
                  index);
}

// Calls visit(i, positive) for each element, positive being its target class.
template <typename Visit>
void for_each_target(const std::string& metric, const Tensor& targets, Visit visit) {
  auto walk = [&](const auto* t) {
    for (int64_t i = 0; i < targets.numel(); ++i) {
      const int c = binary::target_class(t[i]);
      if (c < 0) bad_target(metric, static_cast<double>(t[i]), i);
      visit(i, c == 1);
    }
  };
  switch (targets.dtype()) {
    case DType::f32: walk(targets.data<float>()); break;
    case DType::i32: walk(targets.data<int32_t>()); break;
    default: walk(targets.data<int64_t>()); break;
  }
}

cuda::ConfusionCounts confusion(const std::string& metric, const Tensor& predictions, const Tensor& targets,
                                const BinaryMetricOptions& o) {
  check_binary_inputs(metric, predictions, targets);
  TNT_CUDA_DISPATCH(predictions.device(),
                    cuda::confusion_counts(metric, predictions, targets, o.threshold, o.from_logits));
  cuda::ConfusionCounts c;
  const float* p = predictions.data<float>();  // (n)
  for_each_target(metric, targets, [&](int64_t i, bool positive) {
    ++c.counts[binary::cell(binary::probability(p[i], o.from_logits), positive, o.threshold)];
  });
  return c;
}

void check_options(const std::string& metric, const BinaryMetricOptions& o) {
  TNT_INPUT_CHECK(o.threshold >= 0.0 && o.threshold <= 1.0, "{}: threshold {} is outside [0, 1]", metric,
                  o.threshold);
}

}  // namespace

BinaryPrecision::BinaryPrecision(BinaryMetricOptions options) : options_(options) {
  check_options("precision", options_);
}

void BinaryPrecision::update(const Tensor& predictions, const Tensor& targets) {
  const cuda::ConfusionCounts c = confusion(name(), predictions, targets, options_);
  total_ += static_cast<double>(c.counts[binary::kTruePositive]);
  count_ += static_cast<double>(c.counts[binary::kTruePositive] + c.counts[binary::kFalsePositive]);
}

BinaryRecall::BinaryRecall(BinaryMetricOptions options) : options_(options) {
  check_options("recall", options_);
}

void BinaryRecall::update(const Tensor& predictions, const Tensor& targets) {
  const cuda::ConfusionCounts c = confusion(name(), predictions, targets, options_);
  total_ += static_cast<double>(c.counts[binary::kTruePositive]);
  count_ += static_cast<double>(c.counts[binary::kTruePositive] + c.counts[binary::kFalseNegative]);
}

AUC::AUC(int64_t bins, bool from_logits) : bins_(bins), from_logits_(from_logits) {
  // The histogram is 2 x bins doubles on every rank and in every allreduce: a million bins
  // (16 MB) is far finer than any data set needs.
  TNT_INPUT_CHECK(bins >= 1 && bins <= 1000000, "auc: bins must be in [1, 1000000], got {}", bins);
  histogram_.assign(static_cast<size_t>(2 * bins_), 0.0);
}

void AUC::update(const Tensor& predictions, const Tensor& targets) {
  check_binary_inputs(name(), predictions, targets);
  TNT_CUDA_DISPATCH(predictions.device(), cuda::auc_histogram(predictions, targets, bins_, from_logits_, histogram_));
  const float* p = predictions.data<float>();  // (n)
  for_each_target(name(), targets, [&](int64_t i, bool positive) {
    const int64_t b = binary::bin(binary::probability(p[i], from_logits_), positive, bins_);
    histogram_[static_cast<size_t>((positive ? 0 : bins_) + b)] += 1.0;
  });
}

std::vector<double> AUC::sums() const { return histogram_; }

void AUC::set_sums(const std::vector<double>& sums) {
  TNT_CHECK(sums.size() == histogram_.size(), "auc: set_sums with {} sums, expected 2 x {} bins", sums.size(), bins_);
  histogram_ = sums;
}

void AUC::reset() { std::fill(histogram_.begin(), histogram_.end(), 0.0); }

double AUC::value_of(const std::vector<double>& sums) const {
  TNT_CHECK(sums.size() == histogram_.size(), "auc: value_of {} sums, expected 2 x {} bins", sums.size(), bins_);
  const double* pos = sums.data();           // (bins)
  const double* neg = sums.data() + bins_;   // (bins)
  // Each positive in bin i beats the negatives of the bins below and ties (half) those of
  // its own bin. The counts are integers and `pairs` a multiple of 1/2: exact while
  // 2 x positives x negatives < 2^53.
  double pairs = 0, negatives_below = 0, positives = 0;
  for (int64_t i = 0; i < bins_; ++i) {
    pairs += pos[i] * (negatives_below + 0.5 * neg[i]);
    negatives_below += neg[i];
    positives += pos[i];
  }
  return positives > 0 && negatives_below > 0 ? pairs / (positives * negatives_below) : 0.0;
}

}  // namespace tnt
