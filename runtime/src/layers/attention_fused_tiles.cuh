// The fused attention kernels' shared pieces (attention_fused_cuda.cu has the idea): tile
// geometry and shared-memory layouts, the kernels' parameters, the tile loads, the masks and
// the WMMA products. Included by attention_fused_cuda.cu only (its definitions are internal).
#pragma once

#include "backend/cuda/device_common.cuh"
#include "core/philox.hpp"
#include "layers/attention_fused.hpp"

#include <mma.h>

#include <cstdint>
#include <type_traits>

namespace tnt::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = static_cast<int>(kFusedAttentionTile);  // rows of a tile (queries or keys)
constexpr int kWarps = kTile / 16;                             // a warp per 16 rows
constexpr int kThreads = kWarps * kWarp;
constexpr float kMaskBias = -1e9f;

// Leading dimensions (elements) of the shared-memory tiles, padded against bank conflicts.
// WMMA needs them multiples of 16 bytes, and every fragment pointer 32-byte aligned: row
// offsets are multiples of 16 rows, column offsets multiples of 16 elements, and every
// array's size is a multiple of 32 bytes (checked below).
template <int D>
struct Ld {
  static constexpr int h = D + 8;      // (64, D) tiles of q, k, v, dO in T
  static constexpr int s = kTile + 4;  // (64, 64) f32 tiles of S, dP
  static constexpr int o = D + 4;      // (64, D) f32 accumulators of O, dK, dV, dQ
  static constexpr int p = kTile + 8;  // (64, 64) tiles of P, dS in T
  static_assert(h % 8 == 0 && s % 4 == 0 && o % 4 == 0 && p % 8 == 0, "WMMA leading dimensions");
  static_assert((kTile * h * 2) % 32 == 0 && (kTile * s * 4) % 32 == 0 && (kTile * o * 4) % 32 == 0 &&
                    (kTile * p * 2) % 32 == 0,
                "32-byte aligned arrays");
};

// Shared memory (bytes) of each kernel: f32 arrays first, then the T arrays, then the
// padding flags of the key tile. The kernels carve it in the same order.
template <int D>
constexpr size_t forward_smem() {
  using L = Ld<D>;
  return 4 * (kTile * L::s + kTile * L::o + 2 * kTile) + 2 * (3 * kTile * L::h + kTile * L::p) + kTile;
}
template <int D>
constexpr size_t dkdv_smem() {
  using L = Ld<D>;
  return 4 * (2 * kTile * L::s + 2 * kTile * L::o + 3 * kTile) + 2 * (4 * kTile * L::h + 2 * kTile * L::p) + kTile;
}
template <int D>
constexpr size_t dq_smem() {
  using L = Ld<D>;
  return 4 * (2 * kTile * L::s + kTile * L::o + 3 * kTile) + 2 * (4 * kTile * L::h + kTile * L::p) + kTile;
}

struct FusedParams {
  const void* q;    // (B, Tq, H*d)
  const void* k;    // (B, Tk, H*d)
  const void* v;    // (B, Tk, H*d)
  const void* ids;  // (B, Tk) i32 or i64, or null
  bool ids64;
  const void* o;    // (B, Tq, H*d), backward only
  const void* d_o;  // (B, Tq, H*d), backward only
  float* stats;     // (B, H, Tq, 2): row max, 1 / row sum
  float* delta;     // (B, H, Tq), backward only
  void* out;        // forward: o; dkdv: dk; dq: dq
  void* out2;       // dkdv: dv
  int64_t heads, tq, tk;
  int d;  // depth, <= the kernel's D
  float scale;
  bool causal;
  bool skip_causal;  // key tiles wholly past the causal bound skipped (attention_fused.hpp)
  float rate;
  uint64_t key, base;
};

// (64, D) tile of a (B, T, H*d) tensor, rows [r0, r0 + 64) of (b, h) -> shared memory in T,
// rows past T and columns past d zero; times s when `scaled` (q: float product, then one
// rounding, as the unfused engine's split does). 16-byte loads: d is a multiple of 16 and
// the base pointers 16-byte aligned (checked by the caller).
template <typename T, int D>
__device__ void load_tile(const T* __restrict__ src, int64_t row_stride, int64_t rows_left, int d, T* dst, float s,
                          bool scaled) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < kTile * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows_left && c < d) {
      val = *reinterpret_cast<const uint4*>(src + r * row_stride + c);
      if (scaled) {
        T* e = reinterpret_cast<T*>(&val);
#pragma unroll
        for (int x = 0; x < 8; ++x) e[x] = from_float<T>(to_float(e[x]) * s);
      }
    }
    *reinterpret_cast<uint4*>(dst + r * Ld<D>::h + c) = val;
  }
}

// Rows [t0, t0 + 64) of head h of batch row b of a (B, t, H*d) tensor -> a tile (load_tile).
template <typename T, int D>
__device__ void load_head_tile(const FusedParams& p, const void* src, int64_t b, int64_t h, int64_t t, int64_t t0,
                               T* dst, float s, bool scaled) {
  const int64_t row_stride = p.heads * p.d;
  load_tile<T, D>(static_cast<const T*>(src) + (b * t + t0) * row_stride + h * p.d, row_stride, t - t0, p.d, dst, s,
                  scaled);
}

// The backward's per-row values of query rows [q0, q0 + 64) of head bh: the forward's row
// max and 1 / row sum, and delta (0 past Tq).
__device__ void load_row_stats(const FusedParams& p, int64_t bh, int64_t q0, float* m, float* inv, float* delta) {
  for (int c = threadIdx.x; c < kTile; c += kThreads) {
    const int64_t i = q0 + c;
    const bool valid = i < p.tq;
    m[c] = valid ? p.stats[(bh * p.tq + i) * 2] : 0.0f;
    inv[c] = valid ? p.stats[(bh * p.tq + i) * 2 + 1] : 0.0f;
    delta[c] = valid ? p.delta[bh * p.tq + i] : 0.0f;
  }
}

// pad[c] = 1 where key k0 + c of batch row b is padding (id 0); 0 past Tk (those keys are
// excluded separately).
__device__ void load_pad(const FusedParams& p, int64_t b, int64_t k0, uint8_t* pad) {
  for (int c = threadIdx.x; c < kTile; c += kThreads) {
    const int64_t j = k0 + c;
    bool padded = false;
    if (p.ids != nullptr && j < p.tk) {
      const int64_t at = b * p.tk + j;
      padded = p.ids64 ? static_cast<const int64_t*>(p.ids)[at] == 0 : static_cast<const int32_t*>(p.ids)[at] == 0;
    }
    pad[c] = padded ? 1 : 0;
  }
}

// The logit of (i, j) with its mask bias: l + (-1e9) where key j is padding or causally
// hidden, as a float add (the unfused engine's rule).
__device__ __forceinline__ float biased(const FusedParams& p, float l, bool padded, int64_t i, int64_t j) {
  return (padded || (p.causal && j > i + (p.tk - p.tq))) ? l + kMaskBias : l;
}

// Dropout's keep decision of (b*H + h, i, j): the unfused engine's counter.
__device__ __forceinline__ bool kept(const FusedParams& p, int64_t bh, int64_t i, int64_t j) {
  const uint64_t idx = static_cast<uint64_t>((bh * p.tq + i) * p.tk + j);
  return philox::uniform(p.key, p.base + idx) >= p.rate;
}

// acc (16, 16) = sum over kk of a[:, 16kk..] b[16kk.., :], K16 steps: a (16, 16 K16) row-major
// at `a` (ld lda); b as B^T stored row-major (16, 16 K16) at `b` (ld ldb) when b_transposed,
// else b (16 K16, 16) row-major.
template <typename T, int K16, bool BTransposed>
__device__ __forceinline__ void mma_rows(wmma::fragment<wmma::accumulator, 16, 16, 16, float>& acc, const T* a,
                                         int lda, const T* b, int ldb) {
  using BLayout = std::conditional_t<BTransposed, wmma::col_major, wmma::row_major>;
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BLayout> fb;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
    wmma::load_matrix_sync(fb, BTransposed ? b + kk * 16 : b + kk * 16 * ldb, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// out (16, 64) f32 at `out` (ld Ld::s) = a (16, D) b^T, b (64, D): a's rows are this warp's
// 16 rows, b's the 64 rows of the other side.
template <typename T, int D>
__device__ __forceinline__ void scores(const T* a, const T* b, float* out) {
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    mma_rows<T, D / 16, true>(acc, a, Ld<D>::h, b + n * 16 * Ld<D>::h, Ld<D>::h);
    wmma::store_matrix_sync(out + n * 16, acc, Ld<D>::s, wmma::mem_row_major);
  }
}

// acc (16, D) f32 at `acc_smem` (ld Ld::o) += a (16, 64) (ld Ld::p) b (64, D) (ld Ld::h).
template <typename T, int D>
__device__ __forceinline__ void accumulate(float* acc_smem, const T* a, const T* b) {
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, acc_smem + n * 16, Ld<D>::o, wmma::mem_row_major);
    mma_rows<T, kTile / 16, false>(acc, a, Ld<D>::p, b + n * 16, Ld<D>::h);
    wmma::store_matrix_sync(acc_smem + n * 16, acc, Ld<D>::o, wmma::mem_row_major);
  }
}

}  // namespace
}  // namespace tnt::cuda
