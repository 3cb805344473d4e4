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
  // What global_batch counts. By default samples: Model passes the global number of real
  // samples. A loss that averages over tokens returns true and counts the real tokens of
  // its targets in count_tokens; Model then passes the sum of count_tokens over the ranks
  // (one small allreduce per step), so p ranks on a global batch equal one rank on it, and
  // logs the loss per token.
  virtual bool normalizes_by_tokens() const { return false; }
  virtual int64_t count_tokens(const Tensor& targets) const {
    (void)targets;
    return 0;
  }
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

// The Transformer's loss (TensorFlow Model Garden's padded_cross_entropy_loss): logits
// (..., V), labels (...) i32 or i64 with pad_id (0) for padding. Per token with label y:
//   q_j = 1 - s for j == y, s / (V - 1) otherwise (s = smoothing, 0.1),
//   loss = -sum_j q_j log softmax(x)_j - c,  c = -((1 - s) ln(1 - s) + s ln(s / (V - 1) + 1e-20))
// (c: the smallest value the first term can take, so a perfect prediction costs 0); padding
// tokens count nothing. The sum is divided by global_batch, which counts TOKENS here
// (normalizes_by_tokens; 0 means this call's own real tokens). Labels outside [0, V) are an
// InputError. backward: (softmax(x) - q) * scale / global_batch on real tokens, 0 on padding.
class LabelSmoothingCrossEntropy : public Loss {
 public:
  explicit LabelSmoothingCrossEntropy(double smoothing = 0.1, int64_t pad_id = 0);
  std::string name() const override { return "label_smoothing_cross_entropy"; }
  Tensor forward(const Tensor& logits, const Tensor& labels, int64_t global_batch, SavedState& saved) override;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
  bool normalizes_by_tokens() const override { return true; }
  int64_t count_tokens(const Tensor& labels) const override;  // labels != pad_id
  double smoothing() const { return smoothing_; }
  int64_t pad_id() const { return pad_id_; }
  // The constant c above for V classes (0 without smoothing).
  double min_entropy(int64_t vocab) const;

 private:
  double smoothing_;
  int64_t pad_id_;
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
