// LabelSmoothingCrossEntropy on CUDA (semantics in label_smoothing_cuda.hpp): one block per
// row, one pass over it for max, log-sum-exp and the row's loss; a one-block fixed-order sum
// for the total; backward one element-wise pass from the logits and the row's lse. Both
// read 4 logits an access where the rows allow it (Transformer-big's 33,708-way rows do).
#include "layers/losses/label_smoothing_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/vector_io.cuh"
#include "core/device_api.hpp"
#include "step/step_scalars.cuh"
#include "step/step_scalars.hpp"
#include "tarantella/runtime.hpp"

#include <memory>
#include <type_traits>

namespace tnt::cuda {

namespace {

struct SmoothSaved {
  double denominator = 1;
};

unsigned row_threads(int64_t v) {
  int64_t t = (v + kWarp - 1) / kWarp * kWarp;
  return static_cast<unsigned>(t < kBlock ? t : kBlock);
}

// W logits of a row at j (W > 1: one W-element access; the caller checked V % W == 0 and
// the logits' alignment, so every row starts aligned), widened to float.
template <int W, typename T>
__device__ __forceinline__ void load_logits(const T* xr, int64_t j, float (&x)[W]) {
  if constexpr (W == 1) {
    x[0] = to_float(xr[j]);
  } else {
    load_as_float<W>(xr + j, x);
  }
}

// One pass over each row: a thread keeps the running max m of the logits it has seen and
// z = sum of exp(x - m) over them (each term in float, summed in double), multiplied by
// exp(m_old - m_new) when m grows; the block then takes the row's max M and sums
// z * exp(m - M) (the two passes over the row before read each logit twice). The row's
// loss from lse = M + log(z) and the sum of its logits as before.
template <typename T, typename L, int W>
__global__ void smooth_forward_kernel(const T* __restrict__ logits,  // (R, V)
                                      const L* __restrict__ labels,  // (R)
                                      int64_t rows, int64_t v, double conf, double low, double c, int64_t pad,
                                      float* __restrict__ lse,               // (R)
                                      double* __restrict__ row_loss,         // (R)
                                      unsigned long long* __restrict__ bad_row) {  // (1)
  __shared__ float fscratch[kWarp];
  __shared__ double dscratch[kWarp];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * v;
    float m = -INFINITY;
    double z = 0.0, xsum = 0.0;
    for (int64_t j = static_cast<int64_t>(threadIdx.x) * W; j < v; j += static_cast<int64_t>(blockDim.x) * W) {
      float x[W];
      load_logits<W>(xr, j, x);
      float mw = x[0];
#pragma unroll
      for (int k = 1; k < W; ++k) mw = fmaxf(mw, x[k]);
      if (mw > m) {
        z *= static_cast<double>(expf(m - mw));  // 0 on the first values (m = -inf)
        m = mw;
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        // (m = -inf: every logit so far is -inf, and adds 0, not exp(NaN).)
        if (m != -INFINITY) z += static_cast<double>(expf(x[k] - m));
        xsum += x[k];
      }
    }
    const float mx = block_max(m, fscratch, -INFINITY);
    // A thread without logits (V below the block's width) has z = 0 and m = -inf.
    z = block_sum(z == 0.0 ? 0.0 : z * exp(static_cast<double>(m) - static_cast<double>(mx)), dscratch);
    xsum = block_sum(xsum, dscratch);
    if (threadIdx.x == 0) {
      const double l = static_cast<double>(mx) + log(z);
      lse[r] = static_cast<float>(l);
      const int64_t y = static_cast<int64_t>(labels[r]);
      double loss = 0.0;
      if (y != pad) {
        if (y < 0 || y >= v) {
          atomicMin(bad_row, static_cast<unsigned long long>(r));
        } else {
          const double xy = to_float(xr[y]);
          loss = l - conf * xy - low * (xsum - xy) - c;
        }
      }
      row_loss[r] = loss;
    }
  }
}

// Rows over blocks (grid-stride), the row's columns over the block's threads: no 64-bit
// division per element. The gradient is stored in G: f32, or the logits' half dtype (the
// same bits as the f32 value rounded at the network's edge). grad may be logits itself (no
// __restrict__ on either): each element is read, then written, by one thread.
template <typename T, typename L, typename G, int W>
__global__ void smooth_backward_kernel(const T* logits,                // (R, V)
                                       const L* __restrict__ labels,   // (R)
                                       const float* __restrict__ lse,  // (R)
                                       int64_t rows, int64_t v, int64_t pad, float f, float conf, float low,
                                       G* grad) {  // (R, V)
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t y = static_cast<int64_t>(labels[r]);
    // A label outside [0, V) reaches here inside a step whose error is raised at its end:
    // its row is left at 0, as the CPU engine leaves it (the forward counted nothing for it).
    const bool skip = y == pad || y < 0 || y >= v;
    const float l = lse[r];
    const T* xr = logits + r * v;
    G* gr = grad + r * v;
    for (int64_t j = static_cast<int64_t>(threadIdx.x) * W; j < v; j += static_cast<int64_t>(blockDim.x) * W) {
      float x[W], g[W];
      load_logits<W>(xr, j, x);
#pragma unroll
      for (int k = 0; k < W; ++k) g[k] = skip ? 0.0f : (expf(x[k] - l) - (j + k == y ? conf : low)) * f;
      if constexpr (W == 1) {
        gr[j] = from_float<G>(g[0]);
      } else {
        store_from_float<W>(gr + j, g);
      }
    }
  }
}

// 4 logits an access where every row starts 4-element aligned (V % 4 == 0 and an aligned
// base: 8-byte accesses in a half dtype, 16 in f32), else 1.
int logit_width(const Tensor& logits, int64_t v) {
  const size_t bytes = 4 * dtype_size(logits.dtype());
  return v % 4 == 0 && reinterpret_cast<uintptr_t>(logits.raw()) % bytes == 0 ? 4 : 1;
}

__global__ void sum_divide_kernel(const double* __restrict__ values,  // (n)
                                  int64_t n, double denominator, float* __restrict__ out) {
  __shared__ double scratch[kWarp];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += values[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc / denominator);
}

}  // namespace

Tensor label_smoothing_forward(LabelSmoothingCrossEntropy& loss, const Tensor& logits, const Tensor& labels,
                               int64_t global_batch, SavedState& saved) {
  int device = common_device({&logits, &labels}, "LabelSmoothingCrossEntropy");
  const int64_t v = logits.dim(-1), rows = logits.numel() / v;
  cudaStream_t stream = compute_stream(device);
  Tensor lse = Tensor::empty({rows}, DType::f32, logits.device());
  Tensor result = Tensor::empty({1}, DType::f32, logits.device());
  auto info = std::make_shared<SmoothSaved>();
  info->denominator = static_cast<double>(global_batch);
  if (rows == 0) {
    TNT_CUDA_CHECK(cudaMemsetAsync(result.raw(), 0, sizeof(float), stream));
  } else {
    tnt::detail::StepScalars::For out(logits.device());
    // (first row with a label outside the vocabulary, that label): the step's readback
    uint64_t* check = out->reserve(0, 2, [v](const uint64_t* w) {
      if (tnt::detail::bad_index(w) < 0) return;
      TNT_INPUT_ERROR("LabelSmoothingCrossEntropy: label {} of token {} is outside the vocabulary [0, {})",
                      static_cast<int64_t>(tnt::detail::bad_value(w)), tnt::detail::bad_index(w), v);
    });
    auto* bad_row = reinterpret_cast<unsigned long long*>(check);
    Workspace ws(static_cast<size_t>(rows) * sizeof(double), device);
    double* row_loss = ws.as<double>();  // (R)
    const unsigned grid = static_cast<unsigned>(rows < 65535 ? rows : 65535);
    const double conf = 1.0 - loss.smoothing(), low = loss.smoothing() / static_cast<double>(v - 1);
    TNT_CUDA_DISPATCH_FLOAT(logits.dtype(), "LabelSmoothingCrossEntropy", {
      TNT_CUDA_DISPATCH_LABEL(labels.dtype(), "LabelSmoothingCrossEntropy", {
        auto launch = [&](auto width) {
          constexpr int W = decltype(width)::value;
          smooth_forward_kernel<scalar_t, label_t, W><<<grid, row_threads((v + W - 1) / W), 0, stream>>>(
              static_cast<const scalar_t*>(logits.raw()), static_cast<const label_t*>(labels.raw()), rows, v, conf,
              low, loss.min_entropy(v), loss.pad_id(), lse.data<float>(), row_loss, bad_row);
        };
        if (logit_width(logits, v) == 4) {
          launch(std::integral_constant<int, 4>{});
        } else {
          launch(std::integral_constant<int, 1>{});
        }
      });
    });
    TNT_CUDA_CHECK_LAUNCH();
    sum_divide_kernel<<<1, kBlock, 0, stream>>>(row_loss, rows, info->denominator, result.data<float>());
    TNT_CUDA_CHECK_LAUNCH();
    TNT_CUDA_DISPATCH_LABEL(labels.dtype(), "LabelSmoothingCrossEntropy",
                            { value_at_bad(static_cast<const label_t*>(labels.raw()), check, device); });
    out.finish();
  }
  saved.tensors = {logits, labels, lse};
  saved.extra = info;
  return result;
}

Tensor label_smoothing_backward(LabelSmoothingCrossEntropy& loss, SavedState& saved, double scale) {
  const Tensor& logits = saved.tensors.at(0);
  const Tensor& labels = saved.tensors.at(1);
  const Tensor& lse = saved.tensors.at(2);
  int device = common_device({&logits, &labels, &lse}, "LabelSmoothingCrossEntropy backward");
  const double denom = static_cast<const SmoothSaved*>(saved.extra.get())->denominator;
  const int64_t v = logits.dim(-1), rows = logits.numel() / v;
  // In the logits' dtype (Loss::reads_half_predictions): a half gradient is what the
  // network's edge would have made of an f32 one. It takes the logits' place when this
  // saved state is their storage's only owner: nothing else can read them any more (Model's
  // step hands its predictions over before the backward). At Transformer-big's 128 x 256
  // tokens that is 2.2 GB less at the step's peak. The saved state is then spent.
  const bool in_place = config().loss_grad_in_place && logits.storage().use_count() == 1 && logits.memory_format() == MemoryFormat::contiguous;
  Tensor grad = in_place ? logits : Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  const int64_t n = rows * v;
  if (n == 0) {
    if (in_place) {  // spent, as below
      saved.tensors.clear();
      saved.extra.reset();
    }
    return grad;
  }
  const float f = static_cast<float>(scale / denom);
  const float conf = static_cast<float>(1.0 - loss.smoothing());
  const float low = static_cast<float>(loss.smoothing() / static_cast<double>(v - 1));
  const unsigned grid = static_cast<unsigned>(rows < 65535 ? rows : 65535);
  TNT_CUDA_DISPATCH_FLOAT(logits.dtype(), "LabelSmoothingCrossEntropy", {
    TNT_CUDA_DISPATCH_LABEL(labels.dtype(), "LabelSmoothingCrossEntropy", {
      auto launch = [&](auto width) {
        constexpr int W = decltype(width)::value;
        smooth_backward_kernel<scalar_t, label_t, scalar_t, W>
            <<<grid, row_threads((v + W - 1) / W), 0, compute_stream(device)>>>(
                static_cast<const scalar_t*>(logits.raw()), static_cast<const label_t*>(labels.raw()),
                lse.data<float>(), rows, v, loss.pad_id(), f, conf, low, static_cast<scalar_t*>(grad.raw()));
      };
      // grad is new (as aligned as any allocation) or the logits: their width is its width.
      if (logit_width(logits, v) == 4) {
        launch(std::integral_constant<int, 4>{});
      } else {
        launch(std::integral_constant<int, 1>{});
      }
    });
  });
  TNT_CUDA_CHECK_LAUNCH();
  if (in_place) {
    saved.tensors.clear();  // a second backward says "backward without a forward"
    saved.extra.reset();
  }
  return grad;
}

}  // namespace tnt::cuda
