// Metrics: the CPU engines, and the host half of both engines. An update's results (counts,
// and the first bad label or target) are words of the step's readback (step/step_scalars.hpp):
// in a training step they are read once at the step's end, in a direct call before update()
// returns; either way the same consumer checks them and adds the counts to the sums.
#include "tarantella/metrics.hpp"

#include "backend/dispatch.hpp"
#include "layers/metrics/binary_math.hpp"
#include "layers/metrics/metrics_cuda.hpp"
#include "tarantella/check.hpp"
#include "step/step_scalars.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

namespace tnt {

namespace {

// A check pair (step/step_scalars.hpp) written on the host: the first bad element wins,
// as the CUDA kernels' atomicMin.
void set_bad(uint64_t* check, int64_t index, double value) {
  const auto i = static_cast<uint64_t>(index);
  if (check[0] != detail::StepScalars::kNone && check[0] <= i) return;
  check[0] = i;
  std::memcpy(&check[1], &value, sizeof(double));
}

}  // namespace

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

// The CPU engine of topk_correct, writing the same words (metrics_cuda.hpp) on the host.
void topk_correct_cpu(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index, uint64_t* words) {
  const int64_t classes = scores.dim(-1), rows = scores.numel() / classes;
  const float* x = scores.data<float>();  // (R, K)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = labels.dtype() == DType::i32 ? labels.data<int32_t>()[r] : labels.data<int64_t>()[r];
    if (label == ignore_index) continue;
    if (label < 0 || label >= classes) {
      set_bad(words + cuda::kTopkWords, r, static_cast<double>(label));
      continue;
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
    words[0] += finite && ahead < k;
    ++words[1];
  }
}

void topk_words(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index, uint64_t* words) {
  TNT_CUDA_DISPATCH(scores.device(), cuda::topk_correct(scores, labels, k, ignore_index, words));
  topk_correct_cpu(scores, labels, k, ignore_index, words);
}

}  // namespace

void TopKAccuracy::update(const Tensor& predictions, const Tensor& labels) {
  TNT_CHECK(predictions.defined() && labels.defined(), "{}: undefined predictions or labels", name());
  TNT_CHECK(predictions.ndim() >= 1 && predictions.dim(-1) > 0, "{}: predictions {} are not (..., K)", name(),
            predictions.str());
  const int64_t rows = predictions.numel() / predictions.dim(-1);
  TNT_INPUT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
                  "{}: labels must be i32 or i64 class indices, got {}", name(), labels.str());
  TNT_CHECK(labels.numel() == rows, "{}: {} labels for {} rows of predictions {}", name(), labels.numel(), rows,
            predictions.str());
  TNT_CHECK(labels.device() == predictions.device(), "{}: predictions on {} but labels on {}", name(),
            predictions.device().str(), labels.device().str());
  TNT_CHECK(predictions.dtype() == DType::f32 || predictions.device().is_cuda(),
            "{}: the CPU engine computes in f32, got {}", name(), predictions.str());
  const int64_t classes = predictions.dim(-1);
  detail::StepScalars::For out(predictions.device());
  uint64_t* words = out->reserve(cuda::kTopkWords, 2, [this, classes](const uint64_t* w) {
    // The check first: an update that fails adds nothing.
    if (const int64_t r = detail::bad_index(w + cuda::kTopkWords); r >= 0) {
      const auto label = static_cast<int64_t>(detail::bad_value(w + cuda::kTopkWords));
      TNT_INPUT_ERROR("accuracy: label {} of row {} of this rank's batch is outside the {} classes [0, {})", label, r,
                      classes, classes);
    }
    total_ += static_cast<double>(w[0]);
    count_ += static_cast<double>(w[1]);
  });
  topk_words(predictions, labels, k_, ignore_index_, words);
  out.finish();
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

// The binary metrics' check pair (the first target that is not 0 or 1, its value), read
// before the counts: an update that fails adds nothing.
void check_targets(const std::string& metric, const uint64_t* check) {
  if (const int64_t i = detail::bad_index(check); i >= 0) {
    TNT_INPUT_ERROR("{}: target {} of element {} is not 0 or 1 (binary metrics take 0/1 targets)", metric,
                    detail::bad_value(check), i);
  }
}

// Calls visit(i, positive) for each element with a target of 0 or 1 (positive: 1); the first
// other one goes to the check pair.
template <typename Visit>
void for_each_target(const Tensor& targets, uint64_t* check, Visit visit) {
  auto walk = [&](const auto* t) {
    for (int64_t i = 0; i < targets.numel(); ++i) {
      const int c = binary::target_class(t[i]);
      if (c < 0) {
        set_bad(check, i, static_cast<double>(t[i]));
        continue;
      }
      visit(i, c == 1);
    }
  };
  switch (targets.dtype()) {
    case DType::f32: walk(targets.data<float>()); break;
    case DType::i32: walk(targets.data<int32_t>()); break;
    default: walk(targets.data<int64_t>()); break;
  }
}

// The confusion cells of predictions against targets, given to add (binary::Cell order) when
// the words are read.
void confusion(const std::string& metric, const Tensor& predictions, const Tensor& targets,
               const BinaryMetricOptions& o, std::function<void(const uint64_t* cells)> add) {
  check_binary_inputs(metric, predictions, targets);
  detail::StepScalars::For out(predictions.device());
  uint64_t* words = out->reserve(cuda::kConfusionWords, 2, [metric, add = std::move(add)](const uint64_t* w) {
    check_targets(metric, w + cuda::kConfusionWords);
    add(w);
  });
  if (predictions.device().is_cuda()) {
#ifdef TNT_WITH_CUDA
    cuda::confusion_counts(metric, predictions, targets, o.threshold, o.from_logits, words);
#else
    detail::no_cuda_engine(metric.c_str());
#endif
  } else {
    const float* p = predictions.data<float>();  // (n)
    for_each_target(targets, words + cuda::kConfusionWords, [&](int64_t i, bool positive) {
      ++words[binary::cell(binary::probability(p[i], o.from_logits), positive, o.threshold)];
    });
  }
  out.finish();
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
  confusion(name(), predictions, targets, options_, [this](const uint64_t* c) {
    total_ += static_cast<double>(c[binary::kTruePositive]);
    count_ += static_cast<double>(c[binary::kTruePositive] + c[binary::kFalsePositive]);
  });
}

BinaryRecall::BinaryRecall(BinaryMetricOptions options) : options_(options) {
  check_options("recall", options_);
}

void BinaryRecall::update(const Tensor& predictions, const Tensor& targets) {
  confusion(name(), predictions, targets, options_, [this](const uint64_t* c) {
    total_ += static_cast<double>(c[binary::kTruePositive]);
    count_ += static_cast<double>(c[binary::kTruePositive] + c[binary::kFalseNegative]);
  });
}

AUC::AUC(int64_t bins, bool from_logits) : bins_(bins), from_logits_(from_logits) {
  // The histogram is 2 x bins doubles on every rank and in every allreduce: a million bins
  // (16 MB) is far finer than any data set needs.
  TNT_INPUT_CHECK(bins >= 1 && bins <= 1000000, "auc: bins must be in [1, 1000000], got {}", bins);
  histogram_.assign(static_cast<size_t>(2 * bins_), 0.0);
}

void AUC::update(const Tensor& predictions, const Tensor& targets) {
  check_binary_inputs(name(), predictions, targets);
  const size_t cells = histogram_.size();  // 2 x bins
  detail::StepScalars::For out(predictions.device());
  uint64_t* words = out->reserve(cells, 2, [this, cells](const uint64_t* w) {
    check_targets(name(), w + cells);
    // Integer counts, exact in double: the same sums as adding 1 per element.
    for (size_t k = 0; k < cells; ++k) histogram_[k] += static_cast<double>(w[k]);
  });
  if (predictions.device().is_cuda()) {
#ifdef TNT_WITH_CUDA
    cuda::auc_histogram(predictions, targets, bins_, from_logits_, words);
#else
    detail::no_cuda_engine("auc");
#endif
  } else {
    const float* p = predictions.data<float>();  // (n)
    for_each_target(targets, words + cells, [&](int64_t i, bool positive) {
      const int64_t b = binary::bin(binary::probability(p[i], from_logits_), positive, bins_);
      ++words[(positive ? 0 : bins_) + b];
    });
  }
  out.finish();
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
