// Losses on the CPU. Cross-entropy works from log-sum-exp in double per row (stable for
// any logit range) and keeps the softmax for backward, so backward is one pass.
#include "tarantella/loss.hpp"

#include "backend/dispatch.hpp"
#include "layers/losses/losses_cuda.hpp"
#include "tarantella/check.hpp"
#include "tarantella/ops.hpp"

#include <cmath>

namespace tnt {

double Loss::value(const Tensor& loss) { return ops::item(loss); }

namespace {

struct LossSaved {
  double denominator = 1;  // what the summed loss was divided by
};

int64_t label_at(const Tensor& labels, int64_t i) {
  return labels.dtype() == DType::i32 ? labels.data<int32_t>()[i] : labels.data<int64_t>()[i];
}

}  // namespace

SoftmaxCrossEntropy::SoftmaxCrossEntropy(double label_smoothing, int64_t ignore_index)
    : label_smoothing_(label_smoothing), ignore_index_(ignore_index) {
  TNT_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "SoftmaxCrossEntropy: label_smoothing {} is not in [0, 1]",
            label_smoothing);
}

Tensor SoftmaxCrossEntropy::forward(const Tensor& logits, const Tensor& labels, int64_t global_batch,
                                    SavedState& saved) {
  TNT_CHECK(logits.defined() && labels.defined(), "SoftmaxCrossEntropy: undefined logits or labels");
  TNT_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0, "SoftmaxCrossEntropy: logits {} are not (..., K)", logits.str());
  const int64_t k = logits.dim(-1), rows = logits.numel() / k;
  TNT_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
            "SoftmaxCrossEntropy: labels must be i32 or i64 class indices, got {}", labels.str());
  TNT_CHECK(labels.numel() == rows, "SoftmaxCrossEntropy: {} labels for {} rows of logits {}", labels.numel(), rows,
            logits.str());
  TNT_CHECK(labels.device() == logits.device(), "SoftmaxCrossEntropy: logits on {} but labels on {}",
            logits.device().str(), labels.device().str());
  TNT_CHECK(global_batch >= 0, "SoftmaxCrossEntropy: negative batch size {}", global_batch);
  TNT_CHECK(logits.dtype() == DType::f32 || logits.device().is_cuda(),
            "SoftmaxCrossEntropy: the CPU engine computes in f32, got {}", logits.str());
  if (global_batch == 0) {
    // This call's own count of samples: rows whose label is not ignored.
    Tensor host = labels.device().is_cpu() ? labels : labels.to(Device::cpu());
    for (int64_t i = 0; i < rows; ++i) global_batch += label_at(host, i) != ignore_index_;
    if (global_batch == 0) global_batch = 1;
  }
  TNT_CUDA_DISPATCH(logits.device(),
                    cuda::softmax_cross_entropy_forward(*this, logits, labels, global_batch, saved));

  Tensor probs = Tensor::empty({rows, k}, DType::f32);  // (R, K)
  const float* x = logits.data<float>();                // (R, K)
  float* p = probs.data<float>();
  const double s = label_smoothing_;
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
    if (label == ignore_index_) continue;
    if (label < 0 || label >= k) {
#pragma omp critical
      bad_row = bad_row < 0 ? r : std::min(bad_row, r);
      continue;
    }
    const double lse = mx + std::log(z);
    // -sum_j q_j log p_j with q = (1 - s) onehot + s / K, and log p_j = x_j - lse
    total += lse - (1 - s) * xr[label] - s / static_cast<double>(k) * xsum;
  }
  if (bad_row >= 0) {
    TNT_INPUT_ERROR("SoftmaxCrossEntropy: label {} of sample {} is outside the {} classes [0, {})",
                    label_at(labels, bad_row), bad_row, k, k);
  }
  auto info = std::make_shared<LossSaved>();
  info->denominator = static_cast<double>(global_batch);
  saved.tensors = {probs, labels};
  saved.extra = info;
  return Tensor::full({1}, total / info->denominator, DType::f32);
}

Tensor SoftmaxCrossEntropy::backward(SavedState& saved, double scale) {
  TNT_CHECK(saved.tensors.size() == 2 && saved.extra, "SoftmaxCrossEntropy: backward without a forward");
  TNT_CUDA_DISPATCH(saved.tensors[0].device(), cuda::softmax_cross_entropy_backward(*this, saved, scale));
  const Tensor& probs = saved.tensors[0];  // (R, K)
  const Tensor& labels = saved.tensors[1];
  const double denom = std::static_pointer_cast<LossSaved>(saved.extra)->denominator;
  const int64_t rows = probs.dim(0), k = probs.dim(1);
  Tensor grad = Tensor::empty({rows, k}, DType::f32);  // (R, K), reshaped to the logits' shape by the caller
  const float* p = probs.data<float>();
  float* g = grad.data<float>();
  const float f = static_cast<float>(scale / denom);
  const float smooth = static_cast<float>(label_smoothing_ / static_cast<double>(k));
  const float hit = static_cast<float>(1.0 - label_smoothing_);
#pragma omp parallel for schedule(static) if (rows * k > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = label_at(labels, r);
    float* gr = g + r * k;
    if (label == ignore_index_) {
      for (int64_t j = 0; j < k; ++j) gr[j] = 0;
      continue;
    }
    for (int64_t j = 0; j < k; ++j) gr[j] = (p[r * k + j] - smooth - (j == label ? hit : 0.0f)) * f;
  }
  return grad;
}

Tensor MeanSquaredError::forward(const Tensor& predictions, const Tensor& targets, int64_t global_batch,
                                 SavedState& saved) {
  TNT_CHECK(predictions.defined() && targets.defined(), "MeanSquaredError: undefined predictions or targets");
  TNT_CHECK(predictions.ndim() >= 1, "MeanSquaredError: predictions {} have no batch dimension", predictions.str());
  TNT_CHECK(targets.numel() == predictions.numel() && targets.dtype() == predictions.dtype(),
            "MeanSquaredError: targets {} do not match predictions {}", targets.str(), predictions.str());
  TNT_CHECK(targets.device() == predictions.device(), "MeanSquaredError: predictions on {} but targets on {}",
            predictions.device().str(), targets.device().str());
  TNT_CHECK(global_batch >= 0, "MeanSquaredError: negative batch size {}", global_batch);
  TNT_CHECK(predictions.dtype() == DType::f32 || predictions.device().is_cuda(),
            "MeanSquaredError: the CPU engine computes in f32, got {}", predictions.str());
  const int64_t n = predictions.dim(0);
  if (global_batch == 0) global_batch = std::max<int64_t>(n, 1);
  TNT_CUDA_DISPATCH(predictions.device(),
                    cuda::mean_squared_error_forward(*this, predictions, targets, global_batch, saved));
  const int64_t total_n = predictions.numel();
  const int64_t per_sample = n > 0 ? total_n / n : 1;
  Tensor diff = Tensor::empty(predictions.shape(), DType::f32);  // p - t
  const float* p = predictions.data<float>();
  const float* t = targets.data<float>();
  float* d = diff.data<float>();
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (total_n > 32768)
  for (int64_t i = 0; i < total_n; ++i) {
    d[i] = p[i] - t[i];
    total += static_cast<double>(d[i]) * d[i];
  }
  auto info = std::make_shared<LossSaved>();
  info->denominator = static_cast<double>(global_batch) * static_cast<double>(per_sample);
  saved.tensors = {diff};
  saved.extra = info;
  return Tensor::full({1}, total / info->denominator, DType::f32);
}

Tensor MeanSquaredError::backward(SavedState& saved, double scale) {
  TNT_CHECK(saved.tensors.size() == 1 && saved.extra, "MeanSquaredError: backward without a forward");
  TNT_CUDA_DISPATCH(saved.tensors[0].device(), cuda::mean_squared_error_backward(*this, saved, scale));
  const Tensor& diff = saved.tensors[0];
  const double denom = std::static_pointer_cast<LossSaved>(saved.extra)->denominator;
  Tensor grad = Tensor::empty(diff.shape(), DType::f32);
  const float f = static_cast<float>(2.0 * scale / denom);
  const float* d = diff.data<float>();
  float* g = grad.data<float>();
  const int64_t n = diff.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) g[i] = d[i] * f;
  return grad;
}

}  // namespace tnt
