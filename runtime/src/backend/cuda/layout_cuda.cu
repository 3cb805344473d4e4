// Memory-format conversion: per image, a transpose of a (C, HW) matrix into (HW, C) (to
// channels_last) or of (HW, C) into (C, HW) (back to contiguous).
//
// Each block moves 32 x 32 tiles through shared memory. It reads a tile row by row with the
// threads of a warp along the source's contiguous axis, and writes it row by row with the
// threads along the destination's contiguous axis, so both the reads and the writes of a
// warp are coalesced; the extra column of the shared tile puts the 32 elements of a tile
// column in different banks. Tiles at the right and bottom edges are partial, so any C and
// HW work. Blocks loop over the tiles of all images (grid-stride): the tile count may
// exceed what one launch dimension holds. Elements move as raw words of their size (1, 2,
// 4 or 8 bytes). The accumulating variant reads f32/f16/bf16 and adds in float into an f32
// destination, for the filter gradients that Conv2D computes in KRSC (conv2d_cuda.cu).
#include "backend/cuda/layout.hpp"

#include "backend/cuda/device_common.cuh"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tnt::cuda {

namespace {

constexpr int kTile = 32;
constexpr int kTileRowsPerPass = 8;  // block (32, 8): each thread moves 4 elements of a tile

struct Store {
  template <typename S>
  __device__ void operator()(S* dst, S v) const {
    *dst = v;
  }
};

// The word holds a T (f32, f16 or bf16); added in float.
template <typename T>
struct AddAsFloat {
  template <typename W>
  __device__ void operator()(float* dst, W word) const {
    static_assert(sizeof(W) == sizeof(T), "a word per element");
    T v;
    memcpy(&v, &word, sizeof(T));
    *dst += to_float(v);
  }
};

// src: `count` row-major matrices of (rows, cols) of raw words S, one after the other;
// dst: their transposes (cols, rows), in the same order. op(destination pointer, word)
// stores. (Raw words in shared memory: the half types' constructors are not allowed there.)
template <typename S, typename D, typename Op>
__global__ void transpose_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t count, int64_t rows,
                                 int64_t cols, int64_t tiles_r, int64_t tiles_c, Op op) {
  __shared__ S tile[kTile][kTile + 1];
  const int64_t per_matrix = tiles_r * tiles_c, total = count * per_matrix, elements = rows * cols;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const int64_t m = t / per_matrix, in_m = t - m * per_matrix;
    const int64_t tr = in_m / tiles_c;
    const int64_t r0 = tr * kTile, c0 = (in_m - tr * tiles_c) * kTile;
    const S* s = src + m * elements;
    D* d = dst + m * elements;
    // tile[i][j] = s[r0 + i][c0 + j]: threadIdx.x runs along a source row.
    for (int i = threadIdx.y; i < kTile; i += kTileRowsPerPass) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = s[r * cols + c];
    }
    __syncthreads();
    // d[c0 + i][r0 + j] = tile[j][i]: threadIdx.x runs along a destination row. The same
    // bounds test as the read, so only written tile entries are read.
    for (int i = threadIdx.y; i < kTile; i += kTileRowsPerPass) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) op(d + c * rows + r, tile[threadIdx.x][i]);
    }
    __syncthreads();  // the next iteration overwrites the tile
  }
}

template <typename S, typename D, typename Op>
void launch_transpose(const S* src, D* dst, int64_t count, int64_t rows, int64_t cols, Op op, int device) {
  const int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = count * tiles_r * tiles_c;
  // grid_for with one "element" per block: one block per tile, at most enough to fill the GPU.
  const unsigned grid = grid_for(tiles, 1, device);
  transpose_kernel<S, D, Op><<<grid, dim3(kTile, kTileRowsPerPass), 0, compute_stream(device)>>>(
      src, dst, count, rows, cols, tiles_r, tiles_c, op);
  TNT_CUDA_CHECK_LAUNCH();
}

// The matrices of a conversion from src's format: (C, HW) per image from contiguous, (HW, C)
// from channels_last.
struct Matrices {
  int64_t count, rows, cols;
};

Matrices matrices_of(const Tensor& src) {
  const int64_t n = src.dim(0), c = src.dim(1), hw = src.dim(2) * src.dim(3);
  return src.is_channels_last() ? Matrices{n, hw, c} : Matrices{n, c, hw};
}

template <typename W>
void convert_words(const Tensor& src, const Tensor& dst, int device) {
  const Matrices m = matrices_of(src);
  launch_transpose(static_cast<const W*>(src.raw()), static_cast<W*>(dst.raw()), m.count, m.rows, m.cols, Store{},
                   device);
}

}  // namespace

void convert_memory_format(const Tensor& src, const Tensor& dst) {
  TNT_CHECK(src.ndim() == 4 && src.shape() == dst.shape() && src.dtype() == dst.dtype() &&
                src.device() == dst.device() && src.memory_format() != dst.memory_format(),
            "convert_memory_format: {} into {}", src.str(), dst.str());
  if (src.numel() == 0) return;
  const int device = common_device({&src, &dst}, "convert_memory_format");
  switch (dtype_size(src.dtype())) {
    case 1: convert_words<uint8_t>(src, dst, device); break;
    case 2: convert_words<uint16_t>(src, dst, device); break;
    case 4: convert_words<uint32_t>(src, dst, device); break;
    case 8: convert_words<uint64_t>(src, dst, device); break;
    default: TNT_THROW("convert_memory_format: unsupported element size {}", dtype_size(src.dtype()));
  }
}

void accumulate_converted_as_float(const Tensor& src, const Tensor& dst) {
  TNT_CHECK(src.ndim() == 4 && src.shape() == dst.shape() && dst.dtype() == DType::f32 &&
                src.memory_format() != dst.memory_format(),
            "accumulate_converted_as_float: {} into {}", src.str(), dst.str());
  const int device = common_device({&src, &dst}, "accumulate_converted_as_float");
  if (src.numel() == 0) return;
  const Matrices m = matrices_of(src);
  TNT_CUDA_DISPATCH_FLOAT(src.dtype(), "accumulate_converted_as_float", {
    using word_t = std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint16_t>;
    launch_transpose(static_cast<const word_t*>(src.raw()), static_cast<float*>(dst.raw()), m.count, m.rows,
                     m.cols, AddAsFloat<scalar_t>{}, device);
  });
}

}  // namespace tnt::cuda
