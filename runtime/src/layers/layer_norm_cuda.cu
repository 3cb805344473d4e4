// LayerNorm on CUDA: fused kernels, one warp per row. Rows of up to 1,024 features are kept
// in registers (8, 16 or 32 values per lane): read once forward, x and dy once backward.
// Longer rows are read again from L1/L2 (any D works). Both give the same bits for y and dx:
// each lane sums the same terms in the same order.
//
// Backward of rows in registers: the weight gradient (sum over rows of dy * xhat) and the
// bias gradient (sum of dy) are taken from the values the dx pass already holds, instead of
// two column sums that read x and dy again (at the Transformer's 32k x 1024 bf16 rows that
// was 5 reads of 64 MB where 2 suffice). Each block walks a fixed stripe of rows, a warp a
// row at a time; a lane adds dy * xhat and dy of its own columns across its rows in
// registers; the block adds its warps' sums in warp order (shared memory) and writes one
// row of partial sums; a second small kernel adds the blocks' rows in a fixed order (as
// column_sum's second pass) into the gradients. No atomics: the bits depend on the shape
// and the grid, which is one full wave of resident blocks on the GPU (so, for a given build
// and GPU model, on the shape alone). Longer rows keep the two column_sum passes
// (reduce.cuh). Floor at 32k x 1024 bf16: x and dy read, dx written, 192 MB, ~40 us at the
// H200's 4.8 TB/s (the partial sums add ~3 MB); the three passes moved 384 MB, ~80 us.
#include "layers/layer_norm_cuda.hpp"

#include "backend/cuda/reduce.cuh"

#include <algorithm>

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

// Warps per block of the fused backward. Its registers (x, dy and two sums: 4K floats a
// lane; 168 registers at K = 32 with CUDA 13) allow 3 blocks of 4 warps an SM, where
// 256-thread blocks would leave room for only one (8 warps).
constexpr int kFusedWarps = 4;
constexpr int kFusedBlock = kFusedWarps * kWarp;
// At least this many rows per warp, so that a short input does not write more partial sums
// than it has rows; and at most this many blocks, so that the scratch stays <= 8 MiB.
constexpr int64_t kMinRowsPerWarp = 4;
constexpr int64_t kMaxFusedBlocks = 1024;

// Adds the warps' per-lane column sums of one block in warp order and writes them to
// out[0, d). Every thread of the block must call it (two barriers).
template <int K>
__device__ __forceinline__ void store_block_column_sums(const float (&acc)[K], float (*tile)[K * kWarp],
                                                        float* __restrict__ out, int64_t d) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int t = 0; t < K; ++t) tile[warp][t * kWarp + lane] = acc[t];  // lanes on consecutive banks
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += kFusedBlock) {
    float total = 0.0f;
#pragma unroll
    for (int v = 0; v < kFusedWarps; ++v) total += tile[v][c];
    out[c] = total;
  }
  __syncthreads();  // the tile is written again by the next call
}

// dx as layer_norm_backward_kernel, rows of d <= K * 32 in registers, plus this block's
// column sums of dy * xhat and of dy over its stripe of rows [r0, r1): warp w takes rows
// r0 + w, r0 + w + kFusedWarps, ... Lane l holds columns l + 32 t, t < K; columns >= d hold 0.
template <typename T, int K>
__global__ void __launch_bounds__(kFusedBlock)
    layer_norm_backward_fused_kernel(const T* __restrict__ x,          // (R, D)
                                     const T* __restrict__ dy,         // (R, D)
                                     const float* __restrict__ w,      // (D)
                                     const float* __restrict__ stats,  // (R, 2)
                                     T* __restrict__ dx,               // (R, D)
                                     float* __restrict__ partial,      // (2, blocks, D): dy * xhat, dy
                                     int64_t rows, int64_t d, int64_t rows_per_block) {
  __shared__ float tile[kFusedWarps][K * kWarp];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  float acc_w[K], acc_b[K];
#pragma unroll
  for (int t = 0; t < K; ++t) {
    acc_w[t] = 0.0f;
    acc_b[t] = 0.0f;
  }
  // r depends on the warp only: the whole warp takes part in every warp_sum.
  for (int64_t r = r0 + warp; r < r1; r += kFusedWarps) {
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
        acc_w[t] += gv[t] * xhat;
        acc_b[t] += gv[t];
      }
    }
  }
  // Warps without rows (a short last stripe) add zeros, and reach both barriers.
  const int64_t blocks = gridDim.x;
  store_block_column_sums<K>(acc_w, tile, partial + static_cast<int64_t>(blockIdx.x) * d, d);
  store_block_column_sums<K>(acc_b, tile, partial + (blocks + blockIdx.x) * d, d);
}

// The fused backward's second pass, column_sum's second pass for both gradients in one
// launch (blockIdx.y: 0 weight, 1 bias): block (x, y) sums 32 columns of the (blocks, D)
// partial matrix y, thread (tx, ty) the blocks ty, ty + 8, ... in order, then the 8 stripes
// in order, and ADDS the total to the gradient (the layer may have run at several call
// sites of one step).
__global__ void layer_norm_param_grad_kernel(const float* __restrict__ partial,  // (2, blocks, D)
                                             int64_t blocks, int64_t d,
                                             float* __restrict__ dw,  // (D)
                                             float* __restrict__ db) {  // (D)
  __shared__ float tile[kColTileY][kColTileX];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTileX + threadIdx.x;
  const float* p = partial + static_cast<int64_t>(blockIdx.y) * blocks * d;
  float acc = 0.0f;
  if (c < d) {
    for (int64_t b = threadIdx.y; b < blocks; b += kColTileY) acc += p[b * d + c];
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    float total = 0.0f;
    for (int y = 0; y < kColTileY; ++y) total += tile[y][threadIdx.x];
    float* out = blockIdx.y == 0 ? dw : db;
    out[c] = out[c] + total;
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

// The fused backward of rows in registers: dx, and dy * xhat and dy summed into the weight
// and bias gradients. One full wave of resident blocks (as many as fit each SM at once,
// from the kernel's registers and shared memory) spreads the rows evenly; more blocks would
// only add partial rows to sum.
template <typename T, int K>
void layer_norm_backward_fused(const T* x, const T* dy, const float* w, const float* stats, T* dx, float* dw,
                               float* db, int64_t rows, int64_t d, int device) {
  int sms = 1, per_sm = 1;
  TNT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  TNT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, layer_norm_backward_fused_kernel<T, K>,
                                                               kFusedBlock, 0));
  const int64_t wave = std::clamp<int64_t>(static_cast<int64_t>(sms) * std::max(per_sm, 1), 1, kMaxFusedBlocks);
  const int64_t wanted = (rows + kFusedWarps * kMinRowsPerWarp - 1) / (kFusedWarps * kMinRowsPerWarp);
  int64_t blocks = std::min(wave, wanted);  // >= 1: rows > 0
  const int64_t rows_per_block = (rows + blocks - 1) / blocks;
  blocks = (rows + rows_per_block - 1) / rows_per_block;  // no block without rows
  // Freed at scope exit: safe, the kernels that use it are queued on the compute stream.
  Workspace partial(static_cast<size_t>(2 * blocks * d) * sizeof(float), device);
  cudaStream_t stream = compute_stream(device);
  layer_norm_backward_fused_kernel<T, K><<<static_cast<unsigned>(blocks), kFusedBlock, 0, stream>>>(
      x, dy, w, stats, dx, partial.as<float>(), rows, d, rows_per_block);
  TNT_CUDA_CHECK_LAUNCH();
  const unsigned col_tiles = static_cast<unsigned>((d + kColTileX - 1) / kColTileX);
  layer_norm_param_grad_kernel<<<dim3(col_tiles, 2), dim3(kColTileX, kColTileY), 0, stream>>>(
      partial.as<float>(), blocks, d, dw, db);
  TNT_CUDA_CHECK_LAUNCH();
}

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
    auto* dw = static_cast<float*>(layer.weight().grad.raw());
    auto* db = static_cast<float*>(layer.bias().grad.raw());
    switch (row_values(d)) {
      case 8:
        layer_norm_backward_fused<scalar_t, 8>(xs, gs, ws, st, ds, dw, db, rows, d, device);
        break;
      case 16:
        layer_norm_backward_fused<scalar_t, 16>(xs, gs, ws, st, ds, dw, db, rows, d, device);
        break;
      case 32:
        layer_norm_backward_fused<scalar_t, 32>(xs, gs, ws, st, ds, dw, db, rows, d, device);
        break;
      default:
        layer_norm_backward_kernel<scalar_t>
            <<<row_blocks(rows), kBlock, 0, compute_stream(device)>>>(xs, gs, ws, st, ds, rows, d);
        TNT_CUDA_CHECK_LAUNCH();
        // column_sum, not channel_sum(rows, d, 1, ...): that one gives each 32 columns ONE
        // block that walks every row; column_sum cuts the rows into stripes first, so the
        // whole GPU takes part.
        column_sum(rows, d, DyXhat<scalar_t>{xs, gs, st, d}, 1.0f, dw, device);
        column_sum(rows, d, LoadAsFloat<scalar_t>{gs}, 1.0f, db, device);
    }
  });
  return {dx};
}

}  // namespace tnt::cuda
