// Losses. forward() returns the loss as a 1-element f32 tensor on the predictions' device:
// the SUM of the per-sample losses of this rank's samples divided by `global_batch`, the
// number the caller supplies; 0 means this call's own sample count. Model passes:
//   - in training, the number of real samples of the GLOBAL batch (or its real tokens, see
//     normalizes_by_tokens), so that the allreduced gradients equal the serial ones;
//   - in evaluation (evaluate, and validation inside fit), 1: the plain sum of this rank's
//     per-sample losses, which Model sums over the ranks and divides by the global count.
// forward() only ever sees real samples: the padding rows of a last partial batch are cut
// off before the call. backward() returns d(loss)/d(predictions) times `scale` (loss scaling).
//
// A bad label (target) is an InputError. Called directly, forward() throws it before it
// returns. Inside Model's steps it is raised at the step's end with the step's other results
// (on CUDA the check runs on the device and is read in the step's one copy), on every rank
// (model.hpp); forward() and backward() meanwhile leave the bad element out.
//
// The built-in losses that take sample weights compute both ways in forward_weighted():
// their forward() is final (a subclass overriding it would be bypassed in training, which
// calls forward_weighted); for a loss of your own, derive from Loss.
//
// Sample weights (Keras' sample_weight): forward_weighted() multiplies sample i's loss by
// w_i and still divides the sum by global_batch, sum_i(w_i * l_i) / global_batch (not by the
// sum of the weights), so weights of 1 equal no weights, a weight of 0 takes the sample out of
// the sum (and its gradient is 0) while global_batch stays, and p ranks on a global batch
// equal one rank. backward() after it returns each sample's gradient times w_i. A sample of
// weight 0 contributes exactly 0 even when its own loss is infinite.
#pragma once

#include "tarantella/layer.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tnt {

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  // The name and the settings, "softmax_cross_entropy(label_smoothing=0.1, ignore_index=-100)":
  // fit checks that every rank's is the same. A loss of the user's with settings overrides it.
  virtual std::string describe() const { return name(); }
  virtual Tensor forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch,
                         SavedState& saved) = 0;
  virtual Tensor backward(SavedState& saved, double scale = 1.0) = 0;
  static double value(const Tensor& loss);  // the loss as a double (copies from the device)
  // sample_weights: (N) f32 on the predictions' device, N = predictions.dim(0), each finite
  // and >= 0 (the caller checks; Model does, on the host); undefined = no weights (forward).
  // Losses that do not support weights (supports_sample_weights() false) refuse defined
  // weights with an InputError naming the loss.
  virtual bool supports_sample_weights() const { return false; }
  virtual Tensor forward_weighted(const Tensor& predictions, const Tensor& targets, const Tensor& sample_weights,
                                  int64_t global_batch, SavedState& saved);
  // For class weights (Keras' class_weight): the class of each sample, from host targets.
  // Losses whose targets are not one class per sample refuse with an InputError that names
  // the loss and the reason (the default; SoftmaxCrossEntropy and BinaryCrossEntropy override).
  virtual std::vector<int64_t> sample_classes(const Tensor& targets) const;
  // How many classes predictions of this shape (the batch dimension -1) hold, -1 when the loss
  // does not say: class_weight keys from 0 to that count - 1 exist, others are refused.
  virtual int64_t class_count(const Shape& predictions) const;
  // What global_batch counts. By default samples: Model passes the global number of real
  // samples. A loss that averages over tokens returns true and counts the real tokens of
  // its targets in count_tokens; Model then passes the sum of count_tokens over the ranks
  // (one small allreduce per step), so p ranks on a global batch equal one rank on it, and
  // logs the loss per token.
  virtual bool normalizes_by_tokens() const { return false; }
  // Whether forward takes f16/bf16 predictions on `device` as they are (computing in float)
  // and backward then returns its gradient in their dtype: a mixed-precision Model then
  // skips widening the network's outputs to f32 (RunContext::half_outputs). The results
  // are those of the widened predictions, bit for bit: widening is exact, and the f32
  // gradient would be rounded to the half dtype at the network's edge anyway.
  virtual bool reads_half_predictions(const Device& device) const {
    (void)device;
    return false;
  }
  virtual int64_t count_tokens(const Tensor& targets) const {
    (void)targets;
    return 0;
  }
  // With normalizes_by_tokens: whether targets (N, ...) of this shape hold one unit per
  // sample, each counted, so that the global count is the global batch's samples (Model then
  // skips the step's allreduce of the count).
  virtual bool one_unit_per_sample(const Shape& targets) const {
    (void)targets;
    return false;
  }
};

using LossPtr = std::shared_ptr<Loss>;

// Softmax cross-entropy on logits (..., K) with integer labels (...) of i32 or i64; each
// row of K logits is one prediction. Label smoothing s: the target is (1 - s) * onehot +
// s / K (Keras). Labels equal to ignore_index contribute nothing (padding tokens); other
// labels must lie in [0, K), else an InputError names the label. A sample weight applies to
// every row of its sample. sample_classes: labels (N) or (N, 1), one per sample.
// What the sum is divided by (normalizes_by_tokens): with one label per sample, (N) or
// (N, 1), the samples, an ignored one included (as a sample weight of 0 leaves it in the
// count); with several, (B, T, ...), the labels that are not ignored, over the global batch
// (PyTorch's CrossEntropyLoss and Keras' mean over tokens: logits (B, T, K) give the mean
// per token). The gradient has the logits' shape.
class SoftmaxCrossEntropy : public Loss {
 public:
  explicit SoftmaxCrossEntropy(double label_smoothing = 0.0, int64_t ignore_index = -100);
  std::string name() const override { return "softmax_cross_entropy"; }
  Tensor forward(const Tensor& logits, const Tensor& labels, int64_t global_batch, SavedState& saved) override final;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
  bool supports_sample_weights() const override { return true; }
  Tensor forward_weighted(const Tensor& logits, const Tensor& labels, const Tensor& sample_weights,
                          int64_t global_batch, SavedState& saved) override;
  std::vector<int64_t> sample_classes(const Tensor& labels) const override;
  int64_t class_count(const Shape& logits) const override;  // the last dimension
  double label_smoothing() const { return label_smoothing_; }
  std::string describe() const override;
  int64_t ignore_index() const { return ignore_index_; }
  bool normalizes_by_tokens() const override { return true; }
  int64_t count_tokens(const Tensor& labels) const override;
  bool one_unit_per_sample(const Shape& labels) const override;

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
// When the saved state is the only owner left of the logits' memory (the caller let go of
// its own, as Model's step does), backward writes the gradient over them (the same values:
// one (..., V) buffer less at the step's peak) and the saved state is spent.
class LabelSmoothingCrossEntropy : public Loss {
 public:
  explicit LabelSmoothingCrossEntropy(double smoothing = 0.1, int64_t pad_id = 0);
  std::string name() const override { return "label_smoothing_cross_entropy"; }
  Tensor forward(const Tensor& logits, const Tensor& labels, int64_t global_batch, SavedState& saved) override;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
  bool normalizes_by_tokens() const override { return true; }
  int64_t count_tokens(const Tensor& labels) const override;  // labels != pad_id
  bool reads_half_predictions(const Device& device) const override { return device.is_cuda(); }  // the CUDA engine
  double smoothing() const { return smoothing_; }
  std::string describe() const override;
  int64_t pad_id() const { return pad_id_; }
  // The constant c above for V classes (0 without smoothing).
  double min_entropy(int64_t vocab) const;

 private:
  double smoothing_;
  int64_t pad_id_;
};

// The element-wise losses below share one contract. predictions: (N, ...) f32 (f16/bf16 on
// CUDA); targets: f32 with N rows and as many elements as the predictions ((N, 1)
// predictions take (N) targets too), else an InputError names both shapes. With d = p - t
// per element, the loss is sum(w_n * f(d)) / (global_batch * D), D = elements per sample,
// so global_batch == N without weights gives PyTorch's reduction='mean'. The per-element
// rules f, f' are written once for both engines (losses/pointwise_rules.hpp).

// Mean squared error: f = d^2, f' = 2d.
class MeanSquaredError : public Loss {
 public:
  std::string name() const override { return "mean_squared_error"; }
  Tensor forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch, SavedState& saved) override final;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
  bool supports_sample_weights() const override { return true; }
  Tensor forward_weighted(const Tensor& predictions, const Tensor& targets, const Tensor& sample_weights,
                          int64_t global_batch, SavedState& saved) override;
};

// Mean absolute error: f = |d|, f' = sign(d), 0 at d = 0 (as PyTorch's L1Loss).
class MeanAbsoluteError : public Loss {
 public:
  std::string name() const override { return "mean_absolute_error"; }
  Tensor forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch, SavedState& saved) override final;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
  bool supports_sample_weights() const override { return true; }
  Tensor forward_weighted(const Tensor& predictions, const Tensor& targets, const Tensor& sample_weights,
                          int64_t global_batch, SavedState& saved) override;
};

// Huber loss with threshold delta > 0 (an InputError otherwise): f = d^2 / 2 for |d| <= delta,
// delta * (|d| - delta / 2) beyond; f' = d, resp. delta * sign(d). Both pieces meet with
// equal value and slope at |d| = delta (Keras' Huber, PyTorch's HuberLoss).
class Huber : public Loss {
 public:
  explicit Huber(double delta = 1.0);
  std::string name() const override { return "huber"; }
  Tensor forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch, SavedState& saved) override final;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
  bool supports_sample_weights() const override { return true; }
  Tensor forward_weighted(const Tensor& predictions, const Tensor& targets, const Tensor& sample_weights,
                          int64_t global_batch, SavedState& saved) override;
  double delta() const { return delta_; }
  std::string describe() const override;

 private:
  double delta_;
};

// Binary cross-entropy on logits x with targets t in [0, 1] (a target outside, or NaN, is an
// InputError naming it): f = max(x, 0) - x t + log(1 + exp(-|x|)), which equals
// -t log(sigmoid(x)) - (1 - t) log(1 - sigmoid(x)) but never overflows, whatever |x|;
// f' = sigmoid(x) - t. sample_classes: one target per sample, each exactly 0 or 1.
class BinaryCrossEntropy : public Loss {
 public:
  std::string name() const override { return "binary_cross_entropy"; }
  Tensor forward(const Tensor& logits, const Tensor& targets, int64_t global_batch, SavedState& saved) override final;
  Tensor backward(SavedState& saved, double scale = 1.0) override;
  bool supports_sample_weights() const override { return true; }
  Tensor forward_weighted(const Tensor& logits, const Tensor& targets, const Tensor& sample_weights,
                          int64_t global_batch, SavedState& saved) override;
  std::vector<int64_t> sample_classes(const Tensor& targets) const override;
  int64_t class_count(const Shape&) const override { return 2; }  // targets 0 and 1
};

// Keras' class_weight: class index -> weight. sample_weights_for_classes gives sample i the
// weight of its class (loss.sample_classes(targets)); classes absent from the map weigh 1.
// Keys must be >= 0 (and below `classes`, when that is known: Loss::class_count) and weights
// finite and >= 0, else an InputError names the class.
using ClassWeight = std::map<int64_t, double>;
void check_class_weight(const ClassWeight& class_weight, int64_t classes = -1);
std::vector<double> sample_weights_for_classes(const Loss& loss, const Tensor& targets,
                                               const ClassWeight& class_weight);

}  // namespace tnt
