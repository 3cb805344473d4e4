// Losses on the CPU. Cross-entropy works from log-sum-exp in double per row (stable for
// any logit range) and keeps the softmax for backward, so backward is one pass. The
// element-wise losses keep each element's slope (times its sample's weight) instead, so
// their backward is one multiplication, whatever the rule.
#include "tarantella/loss.hpp"

#include "backend/dispatch.hpp"
#include "layers/losses/losses_cuda.hpp"
#include "layers/losses/pointwise_rules.hpp"
#include "tarantella/check.hpp"
#include "tarantella/ops.hpp"
#include "step/step_scalars.hpp"

#include <cmath>

namespace tnt {

double Loss::value(const Tensor& loss) { return ops::item(loss); }

Tensor Loss::forward_weighted(const Tensor& predictions, const Tensor& targets, const Tensor& sample_weights,
                              int64_t global_batch, SavedState& saved) {
  TNT_INPUT_CHECK(!sample_weights.defined(), "{} does not support sample weights (nor class weights)", name());
  return forward(predictions, targets, global_batch, saved);
}

std::vector<int64_t> Loss::sample_classes(const Tensor& targets) const {
  (void)targets;
  TNT_INPUT_ERROR("class_weight needs a loss whose targets are class labels (softmax_cross_entropy, or "
                  "binary_cross_entropy with 0/1 targets); {} has none",
                  name());
}

int64_t Loss::class_count(const Shape& predictions) const {
  (void)predictions;
  return -1;
}

int64_t SoftmaxCrossEntropy::class_count(const Shape& logits) const {
  return logits.size() >= 2 && logits.back() > 0 ? logits.back() : -1;
}

void check_class_weight(const ClassWeight& class_weight, int64_t classes) {
  for (const auto& [cls, w] : class_weight) {
    TNT_INPUT_CHECK(cls >= 0, "class_weight: class {} is negative; classes are indices 0, 1, ...", cls);
    // Keras refuses such a key too: a weight that can never apply is a mistake (often a
    // class numbered from 1).
    TNT_INPUT_CHECK(classes <= 0 || cls < classes,
                    "class_weight: class {} does not exist; the model's predictions have {} classes, 0 to {}", cls,
                    classes, classes - 1);
    TNT_INPUT_CHECK(std::isfinite(w) && w >= 0, "class_weight: the weight {} of class {} is not finite and >= 0",
                    w, cls);
  }
}

std::vector<double> sample_weights_for_classes(const Loss& loss, const Tensor& targets,
                                               const ClassWeight& class_weight) {
  check_class_weight(class_weight);
  std::vector<int64_t> classes = loss.sample_classes(targets.device().is_cpu() ? targets : targets.to(Device::cpu()));
  std::vector<double> w(classes.size(), 1.0);
  for (size_t i = 0; i < classes.size(); ++i) {
    auto it = class_weight.find(classes[i]);
    if (it != class_weight.end()) w[i] = it->second;
  }
  return w;
}

namespace {

struct LossSaved {
  double denominator = 1;  // what the summed loss was divided by
};

int64_t label_at(const Tensor& labels, int64_t i) {
  return labels.dtype() == DType::i32 ? labels.data<int32_t>()[i] : labels.data<int64_t>()[i];
}

// sample_weights, when given: (N) f32 beside the predictions.
void check_sample_weights(const char* what, const Tensor& weights, const Tensor& predictions) {
  if (!weights.defined()) return;
  TNT_INPUT_CHECK(predictions.ndim() >= 1 && weights.dtype() == DType::f32 && weights.ndim() == 1 &&
                      weights.dim(0) == predictions.dim(0),
                  "{}: sample weights {} must be f32 (N) for predictions {} (one weight per sample)", what,
                  weights.str(), predictions.str());
  TNT_INPUT_CHECK(weights.device() == predictions.device(), "{}: predictions on {} but sample weights on {}", what,
                  predictions.device().str(), weights.device().str());
}

}  // namespace

SoftmaxCrossEntropy::SoftmaxCrossEntropy(double label_smoothing, int64_t ignore_index)
    : label_smoothing_(label_smoothing), ignore_index_(ignore_index) {
  TNT_INPUT_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
                  "SoftmaxCrossEntropy: label_smoothing {} is not in [0, 1]", label_smoothing);
}

std::string SoftmaxCrossEntropy::describe() const {
  return fmt::format("{}(label_smoothing={:.17g}, ignore_index={})", name(), label_smoothing_, ignore_index_);
}

Tensor SoftmaxCrossEntropy::forward(const Tensor& logits, const Tensor& labels, int64_t global_batch,
                                    SavedState& saved) {
  return forward_weighted(logits, labels, Tensor(), global_batch, saved);
}

std::vector<int64_t> SoftmaxCrossEntropy::sample_classes(const Tensor& labels) const {
  TNT_INPUT_CHECK((labels.dtype() == DType::i32 || labels.dtype() == DType::i64) && labels.ndim() >= 1 &&
                      labels.numel() == labels.dim(0),
                  "class_weight with {} needs one integer label per sample, got labels {}", name(), labels.str());
  std::vector<int64_t> classes(static_cast<size_t>(labels.numel()));
  for (int64_t i = 0; i < labels.numel(); ++i) classes[i] = label_at(labels, i);
  return classes;
}

namespace {

// The engines work on (R, K) rows; the gradient goes back in the logits' own shape (a
// (B, T, K) network output wants a (B, T, K) gradient: before, (B*T, K) was refused by the
// network's backward at the first step).
struct SceSaved {
  Shape logits;
  std::shared_ptr<void> engine;  // the engine's own saved.extra
};

Tensor sce_forward_rows(SoftmaxCrossEntropy& self, const Tensor& logits, const Tensor& labels,
                        const Tensor& sample_weights, int64_t global_batch, SavedState& saved) {
  TNT_CHECK(logits.defined() && labels.defined(), "SoftmaxCrossEntropy: undefined logits or labels");
  TNT_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0, "SoftmaxCrossEntropy: logits {} are not (..., K)", logits.str());
  const int64_t k = logits.dim(-1), rows = logits.numel() / k;
  TNT_INPUT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
                  "SoftmaxCrossEntropy: labels must be i32 or i64 class indices, got {}", labels.str());
  TNT_CHECK(labels.numel() == rows, "SoftmaxCrossEntropy: {} labels for {} rows of logits {}", labels.numel(), rows,
            logits.str());
  TNT_CHECK(labels.device() == logits.device(), "SoftmaxCrossEntropy: logits on {} but labels on {}",
            logits.device().str(), labels.device().str());
  TNT_CHECK(global_batch >= 0, "SoftmaxCrossEntropy: negative batch size {}", global_batch);
  TNT_CHECK(logits.dtype() == DType::f32 || logits.device().is_cuda(),
            "SoftmaxCrossEntropy: the CPU engine computes in f32, got {}", logits.str());
  TNT_INPUT_CHECK(!sample_weights.defined() || logits.ndim() >= 2,
                  "SoftmaxCrossEntropy: sample weights need logits (N, ..., K), got {}", logits.str());
  check_sample_weights("SoftmaxCrossEntropy", sample_weights, logits);
  if (global_batch == 0) {
    // This call's own count (count_tokens): its samples with one label each, else the labels
    // not ignored.
    global_batch = std::max<int64_t>(self.count_tokens(labels), 1);
  }
  TNT_CUDA_DISPATCH(logits.device(),
                    cuda::softmax_cross_entropy_forward(self, logits, labels, sample_weights, global_batch, saved));

  Tensor probs = Tensor::empty({rows, k}, DType::f32);  // (R, K)
  const float* x = logits.data<float>();                // (R, K)
  float* p = probs.data<float>();
  const float* w = sample_weights.defined() ? sample_weights.data<float>() : nullptr;  // (N)
  const int64_t rows_per_sample = logits.dim(0) > 0 ? rows / logits.dim(0) : 1;         // T of (N, T, K)
  const double s = self.label_smoothing();
  double total = 0;
  int64_t bad_row = -1;
#pragma omp parallel for reduction(+ : total) schedule(static) if (rows * k > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    float* pr = p + r * k;
    float mx = xr[0];
    for (int64_t j = 1; j < k; ++j) mx = std::max(mx, xr[j]);
    double z = 0, xsum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double e = std::exp(static_cast<double>(xr[j]) - mx);
      pr[j] = static_cast<float>(e);
      z += e;
      xsum += xr[j];
    }
    for (int64_t j = 0; j < k; ++j) pr[j] = static_cast<float>(pr[j] / z);
    const int64_t label = label_at(labels, r);
    if (label == self.ignore_index()) continue;
    if (label < 0 || label >= k) {
#pragma omp critical
      bad_row = bad_row < 0 ? r : std::min(bad_row, r);
      continue;
    }
    const double lse = mx + std::log(z);
    // -sum_j q_j log p_j with q = (1 - s) onehot + s / K, and log p_j = x_j - lse
    const double row_loss = lse - (1 - s) * xr[label] - s / static_cast<double>(k) * xsum;
    total += w ? losses::weighted(row_loss, w[r / rows_per_sample]) : row_loss;
  }
  if (bad_row >= 0) {
    // Its row counted nothing; backward gives it no label term (it never indexes by it).
    detail::raise_input_error(
        fmt::format("SoftmaxCrossEntropy: label {} of row {} of this rank's batch is outside the {} classes [0, {})",
                    label_at(labels, bad_row), bad_row, k, k));
  }
  auto info = std::make_shared<LossSaved>();
  info->denominator = static_cast<double>(global_batch);
  saved.tensors = {probs, labels};
  if (sample_weights.defined()) saved.tensors.push_back(sample_weights);
  saved.extra = info;
  return Tensor::full({1}, total / info->denominator, DType::f32);
}

Tensor sce_backward_rows(SoftmaxCrossEntropy& self, SavedState& saved, double scale) {
  TNT_CHECK((saved.tensors.size() == 2 || saved.tensors.size() == 3) && saved.extra,
            "SoftmaxCrossEntropy: backward without a forward");
  TNT_CUDA_DISPATCH(saved.tensors[0].device(), cuda::softmax_cross_entropy_backward(self, saved, scale));
  const Tensor& probs = saved.tensors[0];  // (R, K)
  const Tensor& labels = saved.tensors[1];
  const double denom = std::static_pointer_cast<LossSaved>(saved.extra)->denominator;
  const int64_t rows = probs.dim(0), k = probs.dim(1);
  Tensor grad = Tensor::empty({rows, k}, DType::f32);  // (R, K), reshaped to the logits' shape below
  const float* p = probs.data<float>();
  float* g = grad.data<float>();
  const float f = static_cast<float>(scale / denom);
  const float smooth = static_cast<float>(self.label_smoothing() / static_cast<double>(k));
  const float hit = static_cast<float>(1.0 - self.label_smoothing());
  const float* w = saved.tensors.size() == 3 ? saved.tensors[2].data<float>() : nullptr;  // (N)
  const int64_t rows_per_sample = w && saved.tensors[2].dim(0) > 0 ? rows / saved.tensors[2].dim(0) : 1;
#pragma omp parallel for schedule(static) if (rows * k > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = label_at(labels, r);
    float* gr = g + r * k;
    if (label == self.ignore_index()) {
      for (int64_t j = 0; j < k; ++j) gr[j] = 0;
      continue;
    }
    for (int64_t j = 0; j < k; ++j) gr[j] = (p[r * k + j] - smooth - (j == label ? hit : 0.0f)) * f;
    if (w) {
      for (int64_t j = 0; j < k; ++j) gr[j] = losses::weighted(gr[j], w[r / rows_per_sample]);
    }
  }
  return grad;
}

}  // namespace

bool SoftmaxCrossEntropy::one_unit_per_sample(const Shape& labels) const {
  int64_t per_sample = 1;
  for (size_t d = 1; d < labels.size(); ++d) per_sample *= labels[d];
  return per_sample == 1;
}

int64_t SoftmaxCrossEntropy::count_tokens(const Tensor& labels) const {
  if (labels.ndim() == 0) return 1;
  if (one_unit_per_sample(labels.shape())) return labels.dim(0);  // no read of the labels
  Tensor host = labels.device().is_cpu() ? labels : labels.to(Device::cpu());
  TNT_INPUT_CHECK(host.dtype() == DType::i32 || host.dtype() == DType::i64,
                  "SoftmaxCrossEntropy: labels must be i32 or i64 class indices, got {}", host.str());
  int64_t n = 0;
  for (int64_t i = 0; i < host.numel(); ++i) n += label_at(host, i) != ignore_index_;
  return n;
}

Tensor SoftmaxCrossEntropy::forward_weighted(const Tensor& logits, const Tensor& labels, const Tensor& sample_weights,
                                             int64_t global_batch, SavedState& saved) {
  Tensor loss = sce_forward_rows(*this, logits, labels, sample_weights, global_batch, saved);
  saved.extra = std::make_shared<SceSaved>(SceSaved{logits.shape(), std::move(saved.extra)});
  return loss;
}

Tensor SoftmaxCrossEntropy::backward(SavedState& saved, double scale) {
  TNT_CHECK(saved.extra, "SoftmaxCrossEntropy: backward without a forward");
  const std::shared_ptr<SceSaved> mine = std::static_pointer_cast<SceSaved>(saved.extra);
  saved.extra = mine->engine;
  Tensor grad;
  try {
    grad = sce_backward_rows(*this, saved, scale);
  } catch (...) {
    saved.extra = mine;
    throw;
  }
  saved.extra = mine;
  return grad.shape() == mine->logits ? grad : grad.reshape(mine->logits);
}

namespace {

// The element-wise losses' shared engine (the rules: pointwise_rules.hpp). Saves the slope of
// every element times its sample's weight, so backward is slope * scale / denominator.
Tensor pointwise_forward(const char* what, const losses::PointwiseRule& rule, const Tensor& predictions,
                         const Tensor& targets, const Tensor& sample_weights, int64_t global_batch,
                         SavedState& saved) {
  TNT_CHECK(predictions.defined() && targets.defined(), "{}: undefined predictions or targets", what);
  TNT_CHECK(predictions.ndim() >= 1, "{}: predictions {} have no batch dimension", what, predictions.str());
  TNT_INPUT_CHECK(targets.dtype() == DType::f32 && targets.ndim() >= 1 && targets.dim(0) == predictions.dim(0) &&
                      targets.numel() == predictions.numel(),
                  "{}: targets {} do not match predictions {} (f32, the same samples and elements per sample)",
                  what, targets.str(), predictions.str());
  TNT_CHECK(targets.device() == predictions.device(), "{}: predictions on {} but targets on {}", what,
            predictions.device().str(), targets.device().str());
  TNT_CHECK(global_batch >= 0, "{}: negative batch size {}", what, global_batch);
  TNT_CHECK(predictions.dtype() == DType::f32 || predictions.device().is_cuda(),
            "{}: the CPU engine computes in f32, got {}", what, predictions.str());
  check_sample_weights(what, sample_weights, predictions);
  const int64_t n = predictions.dim(0);
  if (global_batch == 0) global_batch = std::max<int64_t>(n, 1);
  TNT_CUDA_DISPATCH(predictions.device(), cuda::pointwise_loss_forward(what, rule, predictions, targets,
                                                                       sample_weights, global_batch, saved));
  const int64_t total_n = predictions.numel();
  const int64_t per_sample = n > 0 ? total_n / n : 1;
  const float* p = predictions.data<float>();
  const float* t = targets.data<float>();
  const float* w = sample_weights.defined() ? sample_weights.data<float>() : nullptr;  // (N)
  if (rule.kind == losses::Pointwise::logistic) {
    for (int64_t i = 0; i < total_n; ++i) {
      if (!losses::valid_probability(t[i])) {
        // The rule stays finite for any target: the step can go on until the error is raised.
        detail::raise_input_error(
            fmt::format("{}: target {} of sample {} (element {}) is outside [0, 1]", what, t[i], i / per_sample, i));
        break;
      }
    }
  }
  Tensor slope = Tensor::empty(predictions.shape(), DType::f32);  // df/dp times the sample's weight
  float* g = slope.data<float>();
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (total_n > 32768)
  for (int64_t i = 0; i < total_n; ++i) {
    const losses::PointwiseTerm term = rule(p[i], t[i]);
    const float wi = w ? w[i / per_sample] : 1.0f;
    g[i] = w ? losses::weighted(term.slope, wi) : term.slope;
    total += w ? losses::weighted(term.value, wi) : term.value;
  }
  auto info = std::make_shared<LossSaved>();
  info->denominator = static_cast<double>(global_batch) * static_cast<double>(per_sample);
  saved.tensors = {slope};
  saved.extra = info;
  return Tensor::full({1}, total / info->denominator, DType::f32);
}

Tensor pointwise_backward(const char* what, SavedState& saved, double scale) {
  TNT_CHECK(saved.tensors.size() == 1 && saved.extra, "{}: backward without a forward", what);
  TNT_CUDA_DISPATCH(saved.tensors[0].device(), cuda::pointwise_loss_backward(saved, scale));
  const Tensor& slope = saved.tensors[0];
  const double denom = std::static_pointer_cast<LossSaved>(saved.extra)->denominator;
  Tensor grad = Tensor::empty(slope.shape(), DType::f32);
  const float f = static_cast<float>(scale / denom);
  const float* s = slope.data<float>();
  float* g = grad.data<float>();
  const int64_t n = slope.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) g[i] = s[i] * f;
  return grad;
}

losses::PointwiseRule rule_of(losses::Pointwise kind, double delta = 1.0) {
  losses::PointwiseRule r;
  r.kind = kind;
  r.delta = delta;
  return r;
}

}  // namespace

Tensor MeanSquaredError::forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch,
                                 SavedState& saved) {
  return forward_weighted(predictions, targets, Tensor(), global_batch, saved);
}

Tensor MeanSquaredError::forward_weighted(const Tensor& predictions, const Tensor& targets,
                                          const Tensor& sample_weights, int64_t global_batch, SavedState& saved) {
  return pointwise_forward("MeanSquaredError", rule_of(losses::Pointwise::squared), predictions, targets,
                           sample_weights, global_batch, saved);
}

Tensor MeanSquaredError::backward(SavedState& saved, double scale) {
  return pointwise_backward("MeanSquaredError", saved, scale);
}

Tensor MeanAbsoluteError::forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch,
                                  SavedState& saved) {
  return forward_weighted(predictions, targets, Tensor(), global_batch, saved);
}

Tensor MeanAbsoluteError::forward_weighted(const Tensor& predictions, const Tensor& targets,
                                           const Tensor& sample_weights, int64_t global_batch, SavedState& saved) {
  return pointwise_forward("MeanAbsoluteError", rule_of(losses::Pointwise::absolute), predictions, targets,
                           sample_weights, global_batch, saved);
}

Tensor MeanAbsoluteError::backward(SavedState& saved, double scale) {
  return pointwise_backward("MeanAbsoluteError", saved, scale);
}

Huber::Huber(double delta) : delta_(delta) {
  TNT_INPUT_CHECK(std::isfinite(delta) && delta > 0, "Huber: delta {} must be finite and positive", delta);
}

std::string Huber::describe() const { return fmt::format("{}(delta={:.17g})", name(), delta_); }

Tensor Huber::forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch, SavedState& saved) {
  return forward_weighted(predictions, targets, Tensor(), global_batch, saved);
}

Tensor Huber::forward_weighted(const Tensor& predictions, const Tensor& targets, const Tensor& sample_weights,
                               int64_t global_batch, SavedState& saved) {
  return pointwise_forward("Huber", rule_of(losses::Pointwise::huber, delta_), predictions, targets, sample_weights,
                           global_batch, saved);
}

Tensor Huber::backward(SavedState& saved, double scale) { return pointwise_backward("Huber", saved, scale); }

Tensor BinaryCrossEntropy::forward(const Tensor& logits, const Tensor& targets, int64_t global_batch,
                                   SavedState& saved) {
  return forward_weighted(logits, targets, Tensor(), global_batch, saved);
}

Tensor BinaryCrossEntropy::forward_weighted(const Tensor& logits, const Tensor& targets, const Tensor& sample_weights,
                                            int64_t global_batch, SavedState& saved) {
  return pointwise_forward("BinaryCrossEntropy", rule_of(losses::Pointwise::logistic), logits, targets,
                           sample_weights, global_batch, saved);
}

Tensor BinaryCrossEntropy::backward(SavedState& saved, double scale) {
  return pointwise_backward("BinaryCrossEntropy", saved, scale);
}

std::vector<int64_t> BinaryCrossEntropy::sample_classes(const Tensor& targets) const {
  TNT_INPUT_CHECK(targets.ndim() >= 1 && targets.numel() == targets.dim(0),
                  "class_weight with {} needs one 0/1 target per sample, got targets {}", name(), targets.str());
  std::vector<double> t = targets.to_double_vector();
  std::vector<int64_t> classes(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    TNT_INPUT_CHECK(t[i] == 0.0 || t[i] == 1.0,
                    "class_weight with {} needs 0/1 targets (a class per sample); sample {} has target {}", name(),
                    i, t[i]);
    classes[i] = static_cast<int64_t>(t[i]);
  }
  return classes;
}

}  // namespace tnt
