// Label-smoothed cross entropy with padding on the CPU (see loss.hpp). Per row of V logits:
// log-sum-exp in double; the loss needs only lse, x_y and sum_j x_j. Backward recomputes
// softmax from the logits and the saved lse instead of keeping (R, V) probabilities, which
// for a 32k vocabulary would be as large as the logits themselves.
#include "tarantella/loss.hpp"

#include "backend/dispatch.hpp"
#include "layers/losses/label_smoothing_cuda.hpp"
#include "tarantella/check.hpp"
#include "step/step_scalars.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>

namespace tnt {

namespace {

int64_t label_at(const Tensor& labels, int64_t i) {
  return labels.dtype() == DType::i32 ? labels.data<int32_t>()[i] : labels.data<int64_t>()[i];
}

struct SmoothSaved {
  double denominator = 1;
};

}  // namespace

LabelSmoothingCrossEntropy::LabelSmoothingCrossEntropy(double smoothing, int64_t pad_id)
    : smoothing_(smoothing), pad_id_(pad_id) {
  TNT_CHECK(smoothing >= 0 && smoothing < 1, "LabelSmoothingCrossEntropy: smoothing {} is not in [0, 1)", smoothing);
}

std::string LabelSmoothingCrossEntropy::describe() const {
  return fmt::format("{}(smoothing={:.17g}, pad_id={})", name(), smoothing_, pad_id_);
}

double LabelSmoothingCrossEntropy::min_entropy(int64_t vocab) const {
  const double conf = 1.0 - smoothing_;
  const double low = vocab > 1 ? smoothing_ / static_cast<double>(vocab - 1) : 0.0;
  return -(conf * std::log(conf) + static_cast<double>(vocab - 1) * low * std::log(low + 1e-20));
}

int64_t LabelSmoothingCrossEntropy::count_tokens(const Tensor& labels) const {
  TNT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
            "LabelSmoothingCrossEntropy: labels must be i32 or i64 token ids, got {}", labels.str());
  Tensor host = labels.device().is_cpu() ? labels : labels.to(Device::cpu());
  int64_t n = 0;
  for (int64_t i = 0; i < host.numel(); ++i) n += label_at(host, i) != pad_id_;
  return n;
}

Tensor LabelSmoothingCrossEntropy::forward(const Tensor& logits, const Tensor& labels, int64_t global_batch,
                                           SavedState& saved) {
  TNT_CHECK(logits.defined() && labels.defined(), "LabelSmoothingCrossEntropy: undefined logits or labels");
  TNT_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 1, "LabelSmoothingCrossEntropy: logits {} are not (..., V), V > 1",
            logits.str());
  const int64_t v = logits.dim(-1), rows = logits.numel() / v;
  TNT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
            "LabelSmoothingCrossEntropy: labels must be i32 or i64 token ids, got {}", labels.str());
  TNT_CHECK(labels.numel() == rows, "LabelSmoothingCrossEntropy: {} labels for {} rows of logits {}", labels.numel(),
            rows, logits.str());
  TNT_CHECK(labels.device() == logits.device(), "LabelSmoothingCrossEntropy: logits on {} but labels on {}",
            logits.device().str(), labels.device().str());
  TNT_CHECK(global_batch >= 0, "LabelSmoothingCrossEntropy: negative token count {}", global_batch);
  TNT_CHECK(logits.dtype() == DType::f32 || logits.device().is_cuda(),
            "LabelSmoothingCrossEntropy: the CPU engine computes in f32, got {}", logits.str());
  if (global_batch == 0) global_batch = std::max<int64_t>(count_tokens(labels), 1);
  TNT_CUDA_DISPATCH(logits.device(), cuda::label_smoothing_forward(*this, logits, labels, global_batch, saved));

  const float* x = logits.data<float>();  // (R, V)
  Tensor lse = Tensor::empty({rows}, DType::f32);
  float* ls = lse.data<float>();
  const double conf = 1.0 - smoothing_, low = smoothing_ / static_cast<double>(v - 1);
  const double c = min_entropy(v);
  double total = 0;
  int64_t bad_row = -1;
#pragma omp parallel for reduction(+ : total) schedule(static) if (rows * v > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * v;
    float mx = xr[0];
    for (int64_t j = 1; j < v; ++j) mx = std::max(mx, xr[j]);
    double z = 0, xsum = 0;
    for (int64_t j = 0; j < v; ++j) {
      z += std::exp(static_cast<double>(xr[j]) - mx);
      xsum += xr[j];
    }
    const double l = mx + std::log(z);
    ls[r] = static_cast<float>(l);
    const int64_t y = label_at(labels, r);
    if (y == pad_id_) continue;
    if (y < 0 || y >= v) {
#pragma omp critical
      bad_row = bad_row < 0 ? r : std::min(bad_row, r);
      continue;
    }
    // -sum_j q_j (x_j - lse) = lse - conf x_y - low (xsum - x_y)
    total += l - conf * xr[y] - low * (xsum - xr[y]) - c;
  }
  if (bad_row >= 0) {
    // Its row counted nothing, and backward leaves it at 0 (below).
    detail::raise_input_error(
        fmt::format("LabelSmoothingCrossEntropy: label {} of token {} is outside the vocabulary [0, {})",
                    label_at(labels, bad_row), bad_row, v));
  }
  auto info = std::make_shared<SmoothSaved>();
  info->denominator = static_cast<double>(global_batch);
  saved.tensors = {logits, labels, lse};
  saved.extra = info;
  return Tensor::full({1}, total / info->denominator, DType::f32);
}

Tensor LabelSmoothingCrossEntropy::backward(SavedState& saved, double scale) {
  TNT_CHECK(saved.tensors.size() == 3 && saved.extra, "LabelSmoothingCrossEntropy: backward without a forward");
  TNT_CUDA_DISPATCH(saved.tensors[0].device(), cuda::label_smoothing_backward(*this, saved, scale));
  const Tensor& logits = saved.tensors[0];
  const Tensor& labels = saved.tensors[1];
  const float* ls = saved.tensors[2].data<float>();
  const double denom = std::static_pointer_cast<SmoothSaved>(saved.extra)->denominator;
  const int64_t v = logits.dim(-1), rows = logits.numel() / v;
  // Over the logits when this saved state is their storage's only owner (loss.hpp; as the
  // CUDA engine): each row reads its label's logit before the loop writes over it.
  const bool in_place = config().loss_grad_in_place && logits.storage().use_count() == 1;
  Tensor grad = in_place ? logits : Tensor::empty(logits.shape(), DType::f32);  // (R, V)
  const float* x = logits.data<float>();
  float* g = grad.data<float>();
  const float f = static_cast<float>(scale / denom);
  const float conf = static_cast<float>(1.0 - smoothing_);
  const float low = static_cast<float>(smoothing_ / static_cast<double>(v - 1));
#pragma omp parallel for schedule(static) if (rows * v > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t y = label_at(labels, r);
    float* gr = g + r * v;
    // A label outside [0, V) only gets here inside a step whose error is raised at its end
    // (raise_input_error): its row must not be indexed by it.
    if (y == pad_id_ || y < 0 || y >= v) {
      for (int64_t j = 0; j < v; ++j) gr[j] = 0.0f;
      continue;
    }
    const float* xr = x + r * v;
    const float l = ls[r];
    const float xy = xr[y];
    for (int64_t j = 0; j < v; ++j) gr[j] = (std::exp(xr[j] - l) - low) * f;
    gr[y] = (std::exp(xy - l) - conf) * f;
  }
  if (in_place) {
    saved.tensors.clear();  // spent: a second backward says "backward without a forward"
    saved.extra.reset();
  }
  return grad;
}

}  // namespace tnt
