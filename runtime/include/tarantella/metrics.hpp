// Metrics accumulate two sums, total and count (for accuracy: correct predictions and
// samples), on the host. The training loop allreduces (total, count) over the ranks and
// sets them back with set_totals(), so result() is the global value on every rank.
// update() works on any device (the CUDA engine returns its counts to the host).
#pragma once

#include "tarantella/tensor.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace tnt {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual std::string name() const = 0;
  virtual void update(const Tensor& predictions, const Tensor& targets) = 0;
  void reset() { total_ = count_ = 0; }
  double result() const { return count_ > 0 ? total_ / count_ : 0.0; }
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

}  // namespace tnt
