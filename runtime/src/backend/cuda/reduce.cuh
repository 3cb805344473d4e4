// Deterministic per-channel sums over a (outer, C, inner) tensor, for bias gradients
// (Dense: (R, U, 1); Conv2D: (N, F, H*W)) and the BatchNorm inference backward.
// out[c] = beta * out[c] + sum_{o, i} f(o, c, i): fixed summation trees, no atomics.
// column_sum: the same over the rows of a tall (rows, C) matrix (channels_last tensors seen
// as (N*H*W, C)), in two passes so that millions of rows spread over the whole GPU.
#pragma once

#include "backend/cuda/device_common.cuh"

#include <algorithm>

namespace tnt::cuda {

constexpr int kColTileX = 32;  // columns per block (one warp wide: coalesced rows)
constexpr int kColTileY = 8;   // row stripes per block

// inner == 1: each block owns 32 adjacent columns; thread (x, y) sums rows y, y + 8, ...
// of column x, then the 8 stripes are added in order.
template <typename F>
__global__ void column_sum_kernel(int64_t rows, int64_t cols, F f,
                                  float beta, float* __restrict__ out) {  // (cols)
  __shared__ float tile[kColTileY][kColTileX];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTileX + threadIdx.x;
  float acc = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kColTileY) acc += f(r * cols + c, c);
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int y = 0; y < kColTileY; ++y) total += tile[y][threadIdx.x];
    out[c] = beta == 0.0f ? total : beta * out[c] + total;
  }
}

// inner > 1: one block per channel (grid-stride over channels), threads stride over the
// channel's outer * inner elements.
template <typename F>
__global__ void channel_sum_kernel(int64_t outer, int64_t channels, int64_t inner, F f,
                                   float beta, float* __restrict__ out) {  // (channels)
  __shared__ float scratch[kWarp];
  const int64_t per_channel = outer * inner;
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < per_channel; j += blockDim.x) {
      const int64_t o = j / inner, i = j % inner;
      acc += f((o * channels + c) * inner + i, c);
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[c] = beta == 0.0f ? acc : beta * out[c] + acc;
  }
}

template <typename F>
void column_sum(int64_t rows, int64_t cols, F f, float beta, float* out, int device);

// f(flat index, channel) -> float, summed per channel into out (f32, on the stream).
// inner == 1 is the (outer, channels) matrix of column_sum: its two passes, because one
// pass gives only ceil(channels / 32) blocks (16 for a LayerNorm of width 512, 3 for 96
// units) to sum every row, however many there are (Dense's and LayerNorm's B*T rows).
template <typename F>
void channel_sum(int64_t outer, int64_t channels, int64_t inner, F f, float beta, float* out, int device) {
  if (channels == 0) return;
  if (inner == 1) {
    column_sum(outer, channels, f, beta, out, device);
    return;
  }
  const unsigned grid = static_cast<unsigned>(channels < 65535 ? channels : 65535);
  channel_sum_kernel<F><<<grid, kBlock, 0, compute_stream(device)>>>(outer, channels, inner, f, beta, out);
  TNT_CUDA_CHECK_LAUNCH();
}

// column_sum's first pass: block (x, chunk) sums rows [chunk * chunk_rows, + chunk_rows)
// of 32 adjacent columns as column_sum_kernel does, into partial[chunk][column].
template <typename F>
__global__ void column_partial_kernel(int64_t rows, int64_t cols, int64_t chunk_rows, F f,
                                      float* __restrict__ partial) {  // (chunks, cols)
  __shared__ float tile[kColTileY][kColTileX];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTileX + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float acc = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColTileY) acc += f(r * cols + c, c);
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int y = 0; y < kColTileY; ++y) total += tile[y][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * cols + c] = total;
  }
}

struct LoadPartial {
  const float* p;
  __device__ float operator()(int64_t idx, int64_t) const { return p[idx]; }
};

// out[c] = beta * out[c] + sum_r f(r * cols + c, c) over a (rows, cols) matrix. The rows
// are cut into at most kMaxChunks stripes of chunk_rows (a function of the shape alone, so
// the summation order is too); each stripe's column sums go to a scratch (chunks, cols)
// matrix, whose columns the second pass sums in chunk order.
template <typename F>
void column_sum(int64_t rows, int64_t cols, F f, float beta, float* out, int device) {
  if (cols == 0) return;
  constexpr int64_t kMinChunkRows = 256, kMaxChunks = 512;
  const int64_t chunk_rows = std::max(kMinChunkRows, (rows + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  cudaStream_t stream = compute_stream(device);
  dim3 block(kColTileX, kColTileY);
  const unsigned col_tiles = static_cast<unsigned>((cols + kColTileX - 1) / kColTileX);
  if (chunks <= 1) {
    column_sum_kernel<F><<<col_tiles, block, 0, stream>>>(rows, cols, f, beta, out);
    TNT_CUDA_CHECK_LAUNCH();
    return;
  }
  // Freed at scope exit: safe, the kernels that use it are queued on the compute stream.
  Workspace partial(static_cast<size_t>(chunks * cols) * sizeof(float), device);
  column_partial_kernel<F><<<dim3(col_tiles, static_cast<unsigned>(chunks)), block, 0, stream>>>(
      rows, cols, chunk_rows, f, partial.as<float>());
  TNT_CUDA_CHECK_LAUNCH();
  column_sum_kernel<LoadPartial><<<col_tiles, block, 0, stream>>>(chunks, cols, LoadPartial{partial.as<float>()},
                                                                   beta, out);
  TNT_CUDA_CHECK_LAUNCH();
}

// The plain sum of a tensor's elements, read through its element type.
template <typename T>
struct LoadAsFloat {
  const T* x;
  __device__ float operator()(int64_t idx, int64_t) const { return to_float(x[idx]); }
};

}  // namespace tnt::cuda
