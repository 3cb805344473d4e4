// Metrics accumulate sums on the host: most of them two, total and count (for accuracy:
// correct predictions and samples; for precision: true positives and predicted positives),
// AUC a histogram. The training loop allreduces every metric's sums() over the ranks and
// makes the logged value with value_of(global sums), so it is the global value on every
// rank, and p ranks give exactly what one rank gives on the same samples (the sums are
// integer counts, exact in double up to 2^53). update() works on any device (the CUDA
// engine returns its counts to the host). Inside Model's steps the built-in metrics' counts
// (and their label and target checks) are read with the step's other device results in one
// copy at the step's end, so the sums change then, not when update() returns; called
// directly, update() has added its counts (or thrown) when it returns.
#pragma once

#include "tarantella/tensor.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tnt {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual std::string name() const = 0;
  virtual void update(const Tensor& predictions, const Tensor& targets) = 0;
  // The sums to add up over the ranks; always the same number of them for one metric.
  virtual std::vector<double> sums() const { return {total_, count_}; }
  virtual void set_sums(const std::vector<double>& sums);
  // The metric of (possibly summed) sums: total / count, 0 when the count is 0.
  virtual double value_of(const std::vector<double>& sums) const;
  virtual void reset() { total_ = count_ = 0; }
  double result() const { return value_of(sums()); }
  double total() const { return total_; }
  double count() const { return count_; }
  void set_totals(double total, double count) { total_ = total; count_ = count; }

 protected:
  double total_ = 0;
  double count_ = 0;
};

using MetricPtr = std::shared_ptr<Metric>;

// A sample (a row of K scores in predictions (..., K), label in targets (...), i32/i64)
// is correct when the label ranks among the first k in a STABLE descending order: fewer
// than k classes score higher, counting ties before the label as higher. For k = 1 this is
// argmax with the first maximum winning. Labels equal to ignore_index are not counted.
class TopKAccuracy : public Metric {
 public:
  explicit TopKAccuracy(int64_t k = 5, int64_t ignore_index = -100);
  std::string name() const override;  // "top5_accuracy"
  void update(const Tensor& predictions, const Tensor& labels) override;
  int64_t k() const { return k_; }
  int64_t ignore_index() const { return ignore_index_; }

 protected:
  int64_t k_;
  int64_t ignore_index_;
};

class Accuracy : public TopKAccuracy {
 public:
  explicit Accuracy(int64_t ignore_index = -100) : TopKAccuracy(1, ignore_index) {}
  std::string name() const override { return "accuracy"; }
};

// Binary classification metrics: each element of predictions (any shape, f32) is one
// decision, against the element of targets with the same index (same element count; f32,
// i32 or i64 holding exactly 0 or 1, anything else an InputError naming the value and its
// index). Predictions are probabilities (Keras' convention), or logits with from_logits
// (then sigmoid(logit) is the probability, activation_math's float sigmoid on both engines).
// A prediction is positive when its probability is > threshold. A NaN prediction counts as
// wrong: a false negative for a positive target, a false positive for a negative one.
struct BinaryMetricOptions {
  double threshold = 0.5;  // in [0, 1]
  bool from_logits = false;
};

// true positives / (true positives + false positives); 0 when nothing was predicted
// positive (as Keras).
class BinaryPrecision : public Metric {
 public:
  explicit BinaryPrecision(BinaryMetricOptions options = {});
  std::string name() const override { return "precision"; }
  void update(const Tensor& predictions, const Tensor& targets) override;
  const BinaryMetricOptions& options() const { return options_; }

 private:
  BinaryMetricOptions options_;
};

// true positives / (true positives + false negatives); 0 when no target was positive.
class BinaryRecall : public Metric {
 public:
  explicit BinaryRecall(BinaryMetricOptions options = {});
  std::string name() const override { return "recall"; }
  void update(const Tensor& predictions, const Tensor& targets) override;
  const BinaryMetricOptions& options() const { return options_; }

 private:
  BinaryMetricOptions options_;
};

// Area under the ROC curve, from a histogram: `bins` equal bins of the probability over
// [0, 1] (bin min(floor(p * bins), bins - 1); p clamped to [0, 1]), one histogram of the
// positive and one of the negative elements; sums() are both histograms, so the global AUC is
// the AUC of the summed histograms. value_of() integrates the ROC curve through the bin edges
// with the trapezoidal rule, which is P(positive's score > negative's) with a pair in the same
// bin counted as half. So it differs from the exact AUC (the same with exact scores) by at most
// half the fraction of (positive, negative) pairs that share a bin. 0 while either class has
// no element. A NaN prediction is ranked as wrong as the bins allow: a positive's goes to the
// lowest bin, a negative's to the highest. targets and from_logits as BinaryMetricOptions
// (the threshold is unused). bins: 200 by default (Keras' num_thresholds), 1 to 10^6.
class AUC : public Metric {
 public:
  explicit AUC(int64_t bins = 200, bool from_logits = false);
  std::string name() const override { return "auc"; }
  void update(const Tensor& predictions, const Tensor& targets) override;
  std::vector<double> sums() const override;  // positives' histogram, then negatives'
  void set_sums(const std::vector<double>& sums) override;
  double value_of(const std::vector<double>& sums) const override;
  void reset() override;
  int64_t bins() const { return bins_; }
  bool from_logits() const { return from_logits_; }

 private:
  int64_t bins_;
  bool from_logits_;
  std::vector<double> histogram_;  // (2, bins): positives, negatives
};

}  // namespace tnt
