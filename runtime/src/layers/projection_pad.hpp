// The rules of TNT_GEMM_PAD (embedding_projection_cuda.hpp): when a 16-bit product over a
// vocabulary runs on zero-padded copies, how the rows are cut into chunks, and when a trial
// takes the padded path. Plain C++ (no CUDA), so that the CPU tests check the arithmetic.
//
// Why: cuBLAS's Hopper kernels read and write 16-bit matrices with the tensor memory
// accelerator, which needs every row to start on a 16-byte boundary; a row of 33,708 bf16
// logits (the Transformer's vocabulary) is 8-byte aligned only, so all three products of
// the output projection may fall back to older, slower kernels (not measured here yet: the
// trial of embedding_projection_cuda.hpp times both). Padding the vocabulary to a
// multiple of 8 (33,712) with zero rows of the weight and zero columns of the gradient
// gives the same sums, plus one copy of the logits each way.
#pragma once

#include "tarantella/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace tnt::projection_pad {

// Elements a 16-byte row boundary holds in a 16-bit dtype.
inline constexpr int64_t kAlign = 8;
// Largest padded chunk of logits or of their gradient held at once (each chunk's product
// is still a large GEMM: at 33,712 columns, about 8k rows).
inline constexpr size_t kChunkBytes = size_t{512} << 20;
// Rows of a chunk are a multiple of this (tiles of the products), where there are enough.
inline constexpr int64_t kChunkRowMultiple = 64;
// The padded path must win by this fraction of the direct path's time (measurement noise
// between runs of the same kernels is below 1% on a quiet GPU).
inline constexpr double kFaster = 0.02;
// The trial's check: padded and direct results may differ by this fraction of the largest
// |direct| value. Both sum the same f32 products in different orders (the padded sums have
// zero terms more) and round 16-bit outputs once: a difference of one bf16 step (at most
// 2^-7 of the value) at most; a wrong row or column gives differences of the values' own size.
inline constexpr double kAgree = 1.0 / 64;
// Rows of the trial's check and its chunk rows: several chunks and a short last one, so that
// a wrong chunk offset or copy shows.
inline constexpr int64_t kCheckRows = 300, kCheckChunkRows = 128;

// Whether a product with `v` columns in `dtype` can gain from padding: 16-bit, and rows not
// 16-byte aligned.
constexpr bool applies(DType dtype, int64_t v) { return is_half(dtype) && v > 0 && v % kAlign != 0; }

// v rounded up to a multiple of kAlign.
constexpr int64_t padded_width(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Rows per chunk for `rows` rows of `vp` padded columns of `elem_bytes` each, within
// `max_bytes`: as few chunks as fit, as even as kChunkRowMultiple allows (the last may be
// short), at least 1 row.
inline int64_t chunk_rows(int64_t rows, int64_t vp, size_t elem_bytes, size_t max_bytes = kChunkBytes) {
  if (rows <= 0) return 1;
  const int64_t row_bytes = std::max<int64_t>(1, vp * static_cast<int64_t>(elem_bytes));
  const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(max_bytes) / row_bytes);
  if (rows <= fit) return rows;
  const int64_t chunks = (rows + fit - 1) / fit;
  const int64_t even = (rows + chunks - 1) / chunks;
  const int64_t rounded = (even + kChunkRowMultiple - 1) / kChunkRowMultiple * kChunkRowMultiple;
  return rounded <= fit ? rounded : even;  // even <= fit: as many chunks either way
}

// The trial's choice: padded where it is kFaster faster.
inline bool prefer_padded(double padded_ms, double direct_ms) {
  return padded_ms > 0 && direct_ms > 0 && padded_ms < (1.0 - kFaster) * direct_ms;
}

// The trial's check of one result: {max |padded - direct|, max |direct|} (NaN counted as
// infinite by the caller). An all-zero result must be matched exactly.
inline bool agrees(double diff, double largest) {
  return std::isfinite(diff) && std::isfinite(largest) && diff <= kAgree * largest;
}

// Trials are per power-of-two class of rows (the data pipeline's buckets give a batch many
// lengths; the choice turns on the alignment, not on the exact count).
inline int rows_class(int64_t rows) {
  int c = 0;
  while (c < 62 && (int64_t{1} << c) < rows) ++c;
  return c;
}

}  // namespace tnt::projection_pad
