// Losses on CUDA, mirroring losses.cpp: SavedState holds the same tensors (the softmax
// probabilities, the labels and the sample weights; each element's weighted slope), so
// backward is one element-wise pass. Per-row and total sums accumulate in double in fixed
// trees; the loss is written as a 1-element f32 tensor on the device without a host round
// trip. A label outside [0, K) (a target outside [0, 1] for binary cross-entropy) is found
// on the device: the first one's index and value go to two words of the step's readback
// (step/step_scalars.hpp), and the host raises the CPU engine's InputError when it reads
// them: inside a training step at the step's one copy, in a direct call before it returns.
#include "layers/losses/losses_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "core/device_api.hpp"
#include "step/step_scalars.cuh"
#include "step/step_scalars.hpp"

#include <memory>
#include <string>

namespace tnt::cuda {

namespace {

struct CudaLossSaved {
  double denominator = 1;  // what the summed loss was divided by
};

unsigned row_threads(int64_t k) {
  int64_t t = (k + kWarp - 1) / kWarp * kWarp;
  return static_cast<unsigned>(t < kBlock ? t : kBlock);
}

// One block per row (grid-stride over rows). probs = softmax(x); row_loss = lse -
// (1 - s) x[label] - s / K * sum(x), 0 for ignored rows; bad labels lower *bad_row.
template <typename T, typename L>
__global__ void xent_forward_kernel(const T* __restrict__ logits,  // (R, K)
                                    const L* __restrict__ labels,  // (R)
                                    const float* __restrict__ weights,  // (N) or null: all 1
                                    int64_t rows_per_sample,            // R / N
                                    int64_t rows, int64_t k, double smoothing, int64_t ignore_index,
                                    float* __restrict__ probs,             // (R, K)
                                    double* __restrict__ row_loss,         // (R)
                                    unsigned long long* __restrict__ bad_row) {  // (1)
  __shared__ float fscratch[kWarp];
  __shared__ double dscratch[kWarp];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * k;
    float* pr = probs + r * k;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) mx = fmaxf(mx, to_float(xr[j]));
    mx = block_max(mx, fscratch, -INFINITY);
    // The CPU engine's arithmetic: e = exp(x - max) in double, stored as a float, then
    // divided by the double sum; so the probabilities agree but for the order of the sum.
    double z = 0.0, xsum = 0.0;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      const float v = to_float(xr[j]);
      const double e = exp(static_cast<double>(v) - static_cast<double>(mx));
      pr[j] = static_cast<float>(e);
      z += e;
      xsum += v;
    }
    z = block_sum(z, dscratch);
    xsum = block_sum(xsum, dscratch);
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) pr[j] = static_cast<float>(static_cast<double>(pr[j]) / z);
    if (threadIdx.x == 0) {
      const int64_t label = static_cast<int64_t>(labels[r]);
      double loss = 0.0;
      if (label != ignore_index) {
        if (label < 0 || label >= k) {
          atomicMin(bad_row, static_cast<unsigned long long>(r));
        } else {
          const double lse = static_cast<double>(mx) + log(z);
          loss = lse - (1.0 - smoothing) * to_float(xr[label]) - smoothing / static_cast<double>(k) * xsum;
          if (weights) loss = losses::weighted(loss, weights[r / rows_per_sample]);
        }
      }
      row_loss[r] = loss;
    }
  }
}

template <typename L>
__global__ void xent_backward_kernel(const float* __restrict__ probs,  // (R, K)
                                     const L* __restrict__ labels,     // (R)
                                     const float* __restrict__ weights,  // (N) or null: all 1
                                     int64_t rows_per_sample,            // R / N
                                     int64_t rows, int64_t k, int64_t ignore_index, float f, float smooth, float hit,
                                     float* __restrict__ grad) {  // (R, K)
  const int64_t n = rows * k;
  TNT_KERNEL_LOOP(i, n) {
    const int64_t r = i / k, j = i % k;
    const int64_t label = static_cast<int64_t>(labels[r]);
    float g = label == ignore_index ? 0.0f : (probs[i] - smooth - (j == label ? hit : 0.0f)) * f;
    if (weights) g = losses::weighted(g, weights[r / rows_per_sample]);
    grad[i] = g;
  }
}

// One block: out[0] = float(sum(values) / denominator).
__global__ void sum_divide_kernel(const double* __restrict__ values,  // (n)
                                  int64_t n, double denominator, float* __restrict__ out) {
  __shared__ double scratch[kWarp];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += values[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc / denominator);
}

// slope = w_n f'(p, t); partials[block] = sum of w_n f(p, t) over the block's share;
// *bad = the lowest element whose BinaryCrossEntropy target is outside [0, 1].
template <typename T>
__global__ void pointwise_forward_kernel(losses::PointwiseRule rule,
                                         const T* __restrict__ p,            // (n)
                                         const float* __restrict__ t,        // (n)
                                         const float* __restrict__ weights,  // (N) or null: all 1
                                         int64_t per_sample,                 // D = n / N
                                         int64_t n, float* __restrict__ slope,  // (n)
                                         double* __restrict__ partials,        // (gridDim.x)
                                         unsigned long long* __restrict__ bad) {  // (1)
  __shared__ double scratch[kWarp];
  double acc = 0.0;
  const bool logistic = rule.kind == losses::Pointwise::logistic;
  TNT_KERNEL_LOOP(i, n) {
    const float ti = t[i];
    if (logistic && !losses::valid_probability(ti)) atomicMin(bad, static_cast<unsigned long long>(i));
    const losses::PointwiseTerm term = rule(to_float(p[i]), ti);
    if (weights) {
      const float w = weights[i / per_sample];
      slope[i] = losses::weighted(term.slope, w);
      acc += losses::weighted(term.value, w);
    } else {
      slope[i] = term.slope;
      acc += term.value;
    }
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void scale_copy_kernel(const float* __restrict__ in,  // (n)
                                  float f, int64_t n, float* __restrict__ out) {  // (n)
  TNT_KERNEL_LOOP(i, n) { out[i] = in[i] * f; }
}

}  // namespace

Tensor softmax_cross_entropy_forward(SoftmaxCrossEntropy& loss, const Tensor& logits, const Tensor& labels,
                                     const Tensor& sample_weights, int64_t global_batch, SavedState& saved) {
  int device = common_device({&logits, &labels}, "SoftmaxCrossEntropy");
  const int64_t k = logits.dim(-1), rows = logits.numel() / k;
  const float* weights = sample_weights.defined() ? sample_weights.data<float>() : nullptr;  // (N)
  const int64_t rows_per_sample = logits.dim(0) > 0 ? rows / logits.dim(0) : 1;
  cudaStream_t stream = compute_stream(device);
  Tensor probs = Tensor::empty({rows, k}, DType::f32, logits.device());  // (R, K)
  Tensor result = Tensor::empty({1}, DType::f32, logits.device());
  auto info = std::make_shared<CudaLossSaved>();
  info->denominator = static_cast<double>(global_batch);
  if (rows == 0) {
    TNT_CUDA_CHECK(cudaMemsetAsync(result.raw(), 0, sizeof(float), stream));
  } else {
    detail::StepScalars::For out(logits.device());
    // (first row with a bad label, that label)
    uint64_t* check = out->reserve(0, 2, [k](const uint64_t* w) {
      if (detail::bad_index(w) < 0) return;
      TNT_INPUT_ERROR("SoftmaxCrossEntropy: label {} of row {} of this rank's batch is outside the {} classes [0, {})",
                      static_cast<int64_t>(detail::bad_value(w)), detail::bad_index(w), k, k);
    });
    auto* bad_row = reinterpret_cast<unsigned long long*>(check);
    Workspace ws(static_cast<size_t>(rows) * sizeof(double), device);
    double* row_loss = ws.as<double>();  // (R)
    const unsigned grid = static_cast<unsigned>(rows < 65535 ? rows : 65535);
    TNT_CUDA_DISPATCH_FLOAT(logits.dtype(), "SoftmaxCrossEntropy", {
      TNT_CUDA_DISPATCH_LABEL(labels.dtype(), "SoftmaxCrossEntropy", {
        xent_forward_kernel<scalar_t, label_t><<<grid, row_threads(k), 0, stream>>>(
            static_cast<const scalar_t*>(logits.raw()), static_cast<const label_t*>(labels.raw()), weights,
            rows_per_sample, rows, k, loss.label_smoothing(), loss.ignore_index(), probs.data<float>(), row_loss,
            bad_row);
      });
    });
    TNT_CUDA_CHECK_LAUNCH();
    sum_divide_kernel<<<1, kBlock, 0, stream>>>(row_loss, rows, info->denominator, result.data<float>());
    TNT_CUDA_CHECK_LAUNCH();
    TNT_CUDA_DISPATCH_LABEL(labels.dtype(), "SoftmaxCrossEntropy",
                            { value_at_bad(static_cast<const label_t*>(labels.raw()), check, device); });
    out.finish();
  }
  saved.tensors = {probs, labels};
  if (sample_weights.defined()) saved.tensors.push_back(sample_weights);
  saved.extra = info;
  return result;
}

Tensor softmax_cross_entropy_backward(SoftmaxCrossEntropy& loss, SavedState& saved, double scale) {
  const Tensor& probs = saved.tensors.at(0);   // (R, K)
  const Tensor& labels = saved.tensors.at(1);  // (R)
  int device = common_device({&probs, &labels}, "SoftmaxCrossEntropy backward");
  const double denom = static_cast<const CudaLossSaved*>(saved.extra.get())->denominator;
  const int64_t rows = probs.dim(0), k = probs.dim(1);
  Tensor grad = Tensor::empty({rows, k}, DType::f32, probs.device());  // (R, K)
  const int64_t n = rows * k;
  if (n == 0) return grad;
  // The same float factors as the CPU engine.
  const float f = static_cast<float>(scale / denom);
  const float smooth = static_cast<float>(loss.label_smoothing() / static_cast<double>(k));
  const float hit = static_cast<float>(1.0 - loss.label_smoothing());
  const float* weights = saved.tensors.size() == 3 ? saved.tensors[2].data<float>() : nullptr;  // (N)
  const int64_t rows_per_sample = weights ? rows / saved.tensors[2].dim(0) : 1;
  TNT_CUDA_DISPATCH_LABEL(labels.dtype(), "SoftmaxCrossEntropy", {
    xent_backward_kernel<label_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
        probs.data<float>(), static_cast<const label_t*>(labels.raw()), weights, rows_per_sample, rows, k,
        loss.ignore_index(), f, smooth, hit, grad.data<float>());
  });
  TNT_CUDA_CHECK_LAUNCH();
  return grad;
}

Tensor pointwise_loss_forward(const char* what, const losses::PointwiseRule& rule, const Tensor& predictions,
                              const Tensor& targets, const Tensor& sample_weights, int64_t global_batch,
                              SavedState& saved) {
  int device = common_device({&predictions, &targets}, what);
  const int64_t n_samples = predictions.dim(0), total_n = predictions.numel();
  const int64_t per_sample = n_samples > 0 ? total_n / n_samples : 1;
  cudaStream_t stream = compute_stream(device);
  Tensor slope = Tensor::empty(predictions.shape(), DType::f32, predictions.device());  // w_n f'(p, t)
  Tensor result = Tensor::empty({1}, DType::f32, predictions.device());
  auto info = std::make_shared<CudaLossSaved>();
  info->denominator = static_cast<double>(global_batch) * static_cast<double>(per_sample);
  if (total_n == 0) {
    TNT_CUDA_CHECK(cudaMemsetAsync(result.raw(), 0, sizeof(float), stream));
  } else {
    const unsigned grid = grid_for(total_n, kBlock, device);
    Workspace ws(grid * sizeof(double), device);
    double* partials = ws.as<double>();  // (grid)
    // Only binary cross-entropy checks its targets: (first bad element, its target).
    const bool logistic = rule.kind == losses::Pointwise::logistic;
    detail::StepScalars::For out(predictions.device());
    uint64_t* check = nullptr;
    if (logistic) {
      check = out->reserve(0, 2, [what = std::string(what), per_sample](const uint64_t* w) {
        const int64_t i = detail::bad_index(w);
        if (i < 0) return;
        TNT_INPUT_ERROR("{}: target {} of sample {} (element {}) is outside [0, 1]", what, detail::bad_value(w),
                        i / per_sample, i);
      });
    }
    auto* bad = reinterpret_cast<unsigned long long*>(check);  // null: the kernel checks nothing
    const float* weights = sample_weights.defined() ? sample_weights.data<float>() : nullptr;
    TNT_CUDA_DISPATCH_FLOAT(predictions.dtype(), what, {
      pointwise_forward_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(
          rule, static_cast<const scalar_t*>(predictions.raw()), targets.data<float>(), weights, per_sample, total_n,
          slope.data<float>(), partials, bad);
    });
    TNT_CUDA_CHECK_LAUNCH();
    sum_divide_kernel<<<1, kBlock, 0, stream>>>(partials, grid, info->denominator, result.data<float>());
    TNT_CUDA_CHECK_LAUNCH();
    if (logistic) value_at_bad(targets.data<float>(), check, device);
    out.finish();
  }
  saved.tensors = {slope};
  saved.extra = info;
  return result;
}

Tensor pointwise_loss_backward(SavedState& saved, double scale) {
  const Tensor& slope = saved.tensors.at(0);
  int device = common_device({&slope}, "loss backward");
  const double denom = static_cast<const CudaLossSaved*>(saved.extra.get())->denominator;
  Tensor grad = Tensor::empty(slope.shape(), DType::f32, slope.device());
  const int64_t n = slope.numel();
  if (n == 0) return grad;
  // The CPU engine's float factor and product.
  const float f = static_cast<float>(scale / denom);
  scale_copy_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(slope.data<float>(), f, n,
                                                                                        grad.data<float>());
  TNT_CUDA_CHECK_LAUNCH();
  return grad;
}

}  // namespace tnt::cuda
