// Losses. forward() returns the loss as a 1-element f32 tensor on the predictions' device:
// the SUM of the per-sample losses of this rank's samples divided by `global_batch`, the
// number the caller supplies (the GLOBAL batch size in data-parallel training, so that the
// allreduced gradients equal the serial ones; 0 means this call's own sample count).
// backward() returns d(loss)/d(predictions) times `scale` (loss scaling).
#pragma once

#include "tarantella/layer.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <string>

namespace tnt {

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  virtual Tensor forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch,
                         SavedState& saved) = 0;
  virtual Tensor backward(SavedState& saved, double scale = 1.0) = 0;
  static double value(const Tensor& loss);  // the loss as a double (copies from the device)
};

using LossPtr = std::shared_ptr<Loss>;

// Softmax cross-entropy on logits (..., K) with integer labels (...) of i32 or i64; each
// row of K logits is one sample (for (B, T, K) the caller passes the token count as
// global_batch). Label smoothing s: the target is (1 - s) * onehot + s / K (Keras). Labels
// equal to ignore_index contribute nothing (padding tokens); other labels must lie in
// [0, K), else an InputError names the label.
class SoftmaxCrossEntropy : public Loss {
 public:
  explicit SoftmaxCrossEntropy(double label_smoothing = 0.0, int64_t ignore_index = -100);
  std::string name() const override { return "softmax_cross_entropy"; }
  Tensor forward(const Tensor& logits, const Tensor& labels, int64_t global_batch, SavedState& saved) override;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
  double label_smoothing() const { return label_smoothing_; }
  int64_t ignore_index() const { return ignore_index_; }

 private:
  double label_smoothing_;
  int64_t ignore_index_;
};

// Mean squared error: sum((p - t)^2) / (global_batch * D), D = elements per sample, so that
// global_batch == N gives PyTorch's MSELoss(reduction='mean'). targets: f32, p's shape.
class MeanSquaredError : public Loss {
 public:
  std::string name() const override { return "mean_squared_error"; }
  Tensor forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch, SavedState& saved) override;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
};

}  // namespace tnt
