// LayerNorm on CUDA: fused kernels, one warp per row. Rows of up to 1,024 features are kept
// in registers (8, 16 or 32 values per lane): read once forward, x and dy once backward.
// Longer rows are read again from L1/L2 (any D works). Both give the same bits: each lane
// sums the same terms in the same order. Weight and bias
// gradients are deterministic two-pass column sums (reduce.cuh's column_sum).
#include "layers/layer_norm_cuda.hpp"

#include "backend/cuda/reduce.cuh"

namespace tnt::cuda {

namespace {

constexpr int kRowsPerBlock = kBlock / kWarp;

template <typename T>
__global__ void layer_norm_forward_kernel(const T* __restrict__ x,      // (R, D)
                                          const float* __restrict__ w,  // (D)
                                          const float* __restrict__ b,  // (D)
                                          T* __restrict__ y,            // (R, D)
                                          float* __restrict__ stats,    // (R, 2): mean, 1/std
                                          int64_t rows, int64_t d, float eps) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const T* xr = x + r * d;
  float sum = 0.0f;
  for (int64_t j = lane; j < d; j += kWarp) sum += to_float(xr[j]);
  const float mean = warp_sum(sum) / static_cast<float>(d);
  float sq = 0.0f;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float c = to_float(xr[j]) - mean;
    sq += c * c;
  }
  const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(d) + eps);
  T* yr = y + r * d;
  for (int64_t j = lane; j < d; j += kWarp) yr[j] = from_float<T>((to_float(xr[j]) - mean) * rstd * w[j] + b[j]);
  if (lane == 0) {
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

template <typename T>
__global__ void layer_norm_backward_kernel(const T* __restrict__ x,          // (R, D)
                                           const T* __restrict__ dy,         // (R, D)
                                           const float* __restrict__ w,      // (D)
                                           const float* __restrict__ stats,  // (R, 2)
                                           T* __restrict__ dx,               // (R, D)
                                           int64_t rows, int64_t d) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const T* xr = x + r * d;
  const T* gr = dy + r * d;
  const float mean = stats[2 * r], rstd = stats[2 * r + 1];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float gw = to_float(gr[j]) * w[j];
    sum_g += gw;
    sum_gx += gw * (to_float(xr[j]) - mean) * rstd;
  }
  const float mg = warp_sum(sum_g) / static_cast<float>(d);
  const float mgx = warp_sum(sum_gx) / static_cast<float>(d);
  T* dr = dx + r * d;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float xhat = (to_float(xr[j]) - mean) * rstd;
    dr[j] = from_float<T>(rstd * (to_float(gr[j]) * w[j] - mg - xhat * mgx));
  }
}

// The kernels above for rows of d <= K * 32 features, each lane's K values in registers.
template <typename T, int K>
__global__ void layer_norm_forward_rows_kernel(const T* __restrict__ x, const float* __restrict__ w,
                                               const float* __restrict__ b, T* __restrict__ y,
                                               float* __restrict__ stats, int64_t rows, int64_t d, float eps) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const T* xr = x + r * d;
  float v[K];
  float sum = 0.0f;
#pragma unroll
  for (int t = 0; t < K; ++t) {
    const int64_t j = lane + t * kWarp;
    v[t] = j < d ? to_float(xr[j]) : 0.0f;
    if (j < d) sum += v[t];
  }
  const float mean = warp_sum(sum) / static_cast<float>(d);
  float sq = 0.0f;
#pragma unroll
  for (int t = 0; t < K; ++t) {
    if (lane + t * kWarp < d) {
      const float c = v[t] - mean;
      sq += c * c;
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(d) + eps);
  T* yr = y + r * d;
#pragma unroll
  for (int t = 0; t < K; ++t) {
    const int64_t j = lane + t * kWarp;
    if (j < d) yr[j] = from_float<T>((v[t] - mean) * rstd * w[j] + b[j]);
  }
  if (lane == 0) {
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

template <typename T, int K>
__global__ void layer_norm_backward_rows_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                                const float* __restrict__ w, const float* __restrict__ stats,
                                                T* __restrict__ dx, int64_t rows, int64_t d) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const T* xr = x + r * d;
  const T* gr = dy + r * d;
  const float mean = stats[2 * r], rstd = stats[2 * r + 1];
  float xv[K], gv[K];
  float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
  for (int t = 0; t < K; ++t) {
    const int64_t j = lane + t * kWarp;
    xv[t] = 0.0f;
    gv[t] = 0.0f;
    if (j < d) {
      xv[t] = to_float(xr[j]);
      gv[t] = to_float(gr[j]);
      const float gw = gv[t] * w[j];
      sum_g += gw;
      sum_gx += gw * (xv[t] - mean) * rstd;
    }
  }
  const float mg = warp_sum(sum_g) / static_cast<float>(d);
  const float mgx = warp_sum(sum_gx) / static_cast<float>(d);
  T* dr = dx + r * d;
#pragma unroll
  for (int t = 0; t < K; ++t) {
    const int64_t j = lane + t * kWarp;
    if (j < d) {
      const float xhat = (xv[t] - mean) * rstd;
      dr[j] = from_float<T>(rstd * (gv[t] * w[j] - mg - xhat * mgx));
    }
  }
}

// Values per lane for rows of d features: 8, 16 or 32 (d <= 1024), else 0 (the kernels that
// read the row again).
int row_values(int64_t d) { return d <= 8 * kWarp ? 8 : d <= 16 * kWarp ? 16 : d <= 32 * kWarp ? 32 : 0; }

// dy * xhat at a flat index (the weight gradient's summand).
template <typename T>
struct DyXhat {
  const T* x;
  const T* dy;
  const float* stats;
  int64_t d;
  __device__ float operator()(int64_t idx, int64_t) const {
    const int64_t r = idx / d;
    return to_float(dy[idx]) * (to_float(x[idx]) - stats[2 * r]) * stats[2 * r + 1];
  }
};

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

std::vector<Tensor> layer_norm_forward(LayerNorm& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);
  int device = common_device({&x, &layer.weight().value}, "LayerNorm");
  const int64_t d = layer.features(), rows = x.numel() / d;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor stats = Tensor::empty({rows, 2}, DType::f32, x.device());
  if (rows > 0) {
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "LayerNorm", {
      const auto* xs = static_cast<const scalar_t*>(x.raw());
      const auto* ws = static_cast<const float*>(layer.weight().value.raw());
      const auto* bs = static_cast<const float*>(layer.bias().value.raw());
      auto* ys = static_cast<scalar_t*>(y.raw());
      auto* ss = static_cast<float*>(stats.raw());
      const float eps = static_cast<float>(layer.eps());
      cudaStream_t st = compute_stream(device);
      switch (row_values(d)) {
        case 8:
          layer_norm_forward_rows_kernel<scalar_t, 8>
              <<<row_blocks(rows), kBlock, 0, st>>>(xs, ws, bs, ys, ss, rows, d, eps);
          break;
        case 16:
          layer_norm_forward_rows_kernel<scalar_t, 16>
              <<<row_blocks(rows), kBlock, 0, st>>>(xs, ws, bs, ys, ss, rows, d, eps);
          break;
        case 32:
          layer_norm_forward_rows_kernel<scalar_t, 32>
              <<<row_blocks(rows), kBlock, 0, st>>>(xs, ws, bs, ys, ss, rows, d, eps);
          break;
        default:
          layer_norm_forward_kernel<scalar_t><<<row_blocks(rows), kBlock, 0, st>>>(xs, ws, bs, ys, ss, rows, d, eps);
      }
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  saved.tensors = {x, stats};
  return {y};
}

std::vector<Tensor> layer_norm_backward(LayerNorm& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  (void)rc;
  const Tensor& x = saved.tensors.at(0);
  const Tensor& stats = saved.tensors.at(1);
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&x, &dy}, "LayerNorm backward");
  TNT_CHECK(dy.numel() == x.numel() && dy.dtype() == x.dtype(), "LayerNorm '{}': gradient {} for input {}",
            layer.name(), dy.str(), x.str());
  const int64_t d = layer.features(), rows = x.numel() / d;
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) return {dx};
  TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "LayerNorm", {
    const auto* xs = static_cast<const scalar_t*>(x.raw());
    const auto* gs = static_cast<const scalar_t*>(dy.raw());
    const auto* st = static_cast<const float*>(stats.raw());
    const auto* ws = static_cast<const float*>(layer.weight().value.raw());
    auto* ds = static_cast<scalar_t*>(dx.raw());
    cudaStream_t cs = compute_stream(device);
    switch (row_values(d)) {
      case 8:
        layer_norm_backward_rows_kernel<scalar_t, 8><<<row_blocks(rows), kBlock, 0, cs>>>(xs, gs, ws, st, ds, rows, d);
        break;
      case 16:
        layer_norm_backward_rows_kernel<scalar_t, 16><<<row_blocks(rows), kBlock, 0, cs>>>(xs, gs, ws, st, ds, rows, d);
        break;
      case 32:
        layer_norm_backward_rows_kernel<scalar_t, 32><<<row_blocks(rows), kBlock, 0, cs>>>(xs, gs, ws, st, ds, rows, d);
        break;
      default:
        layer_norm_backward_kernel<scalar_t><<<row_blocks(rows), kBlock, 0, cs>>>(xs, gs, ws, st, ds, rows, d);
    }
    TNT_CUDA_CHECK_LAUNCH();
    // column_sum, not channel_sum(rows, d, 1, ...): that one gives each 32 columns ONE block
    // that walks every row (D = 1024: 32 blocks on a 132-SM GPU, each reading 16k rows);
    // column_sum cuts the rows into stripes first, so the whole GPU takes part.
    column_sum(rows, d, DyXhat<scalar_t>{xs, gs, st, d}, 1.0f, static_cast<float*>(layer.weight().grad.raw()),
               device);
    column_sum(rows, d, LoadAsFloat<scalar_t>{gs}, 1.0f, static_cast<float*>(layer.bias().grad.raw()), device);
  });
  return {dx};
}

}  // namespace tnt::cuda
