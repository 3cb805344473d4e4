// The fused attention kernels' shared pieces (attention_fused_cuda.cu has the idea): tile
// geometry and shared-memory layouts, the kernels' parameters, the tile loads, the masks and
// the tensor-core products (mma.sync m16n8k16 with operands from ldmatrix, accumulators in
// registers). Included by attention_fused_cuda.cu only (its definitions are internal).
#pragma once

#include "backend/cuda/device_common.cuh"
#include "core/philox.hpp"
#include "layers/attention_fused.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>

// The kernels trap there (the host never launches them below sm_80: mma.sync bf16).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TNT_FUSED_ATTENTION_UNSUPPORTED 1  // bf16 WMMA needs sm_80; the host never launches there
#endif

namespace tnt::cuda {
namespace {

constexpr int kTile = static_cast<int>(kFusedAttentionTile);  // rows of a tile (queries or keys)
constexpr int kWarps = kTile / 16;                             // a warp per 16 rows
constexpr int kThreads = kWarps * kWarp;
constexpr float kMaskBias = -1e9f;

// Leading dimension (elements) of the (64, D) shared-memory tiles of q, k, v and dO: 16
// bytes of padding per row put the 8 row addresses of an ldmatrix in different banks, and
// keep every row 16-byte aligned (ldmatrix reads 16-byte rows).
template <int D>
struct Ld {
  static constexpr int h = D + 8;
  static_assert((h * 2) % 16 == 0, "ldmatrix rows are 16-byte aligned");
};

// Shared memory (bytes) of each kernel: f32 and u32 arrays first, then the (64, D) tiles in
// T, then padding flags. The kernels carve it in the same order. The tiles a kernel walks
// over (k, v in the forward and dQ kernels; q, dO in the dK/dV kernel) have two buffers:
// the next one loads (cp.async) while the current one is used.
// The forward's block has MT 64-row q tiles (MT = 2: warps of 32 rows).
template <int D, int MT = 1>
constexpr size_t forward_smem() {
  return 2 * ((MT + 4) * kTile * Ld<D>::h) + 2 * kTile;  // MT x q, 2 x (k, v); 2 x pad
}
template <int D>
constexpr size_t dkdv_smem() {
  // 2 x (m, 1/l, delta, keep bits); k, v, 2 x (q, dO); pad
  return 2 * 4 * (3 * kTile + kWarps * kWarp) + 2 * (6 * kTile * Ld<D>::h) + kTile;
}
template <int D>
constexpr size_t dq_smem() {
  return 2 * (6 * kTile * Ld<D>::h) + 2 * kTile;  // q, dO, 2 x (k, v); 2 x pad
}
template <int D>
constexpr size_t dq_stored_smem() {
  return 2 * 2 * kTile * (Ld<D>::h + Ld<kTile>::h);  // 2 x (k, dS)
}
// The 32-row forward (MT = 2; depths up to 64) takes 55.4 KB at D = 64 and 30.8 KB at
// D = 32, exactly the dQ kernel's: wherever the kernels fit (fused_attention_fits), it fits.
static_assert(forward_smem<64, 2>() == dq_smem<64>() && forward_smem<32, 2>() == dq_smem<32>());

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
  void* qs;         // (B, Tq, H*d): q * scale rounded to T, backward only (the delta kernel's)
  void* out;        // forward: o; dkdv: dk; dq: dq
  void* out2;       // dkdv: dv
  int64_t heads, tq, tk;
  int d;  // depth, <= the kernel's D
  float scale;
  bool causal;
  bool skip_causal;  // key tiles wholly past the causal bound skipped (attention_fused.hpp)
  float rate;
  uint64_t key, base;
  // Dropout's keep decisions as the forward drew them, one bit each, for the backward (which
  // then draws nothing): per (b*H + h, query tile, key tile) 128 words, word w*32 + n*4 + e
  // of warp w holding in bit `lane` the element that lane has in C tile n, element e, of
  // the forward's score tile (rows queries, columns keys). Null without dropout.
  uint32_t* keep;
  int64_t q_tiles, k_tiles;
  // dS = P (dP Z - delta), rounded to T, of every tile pair the backward visits, stored by
  // the dK/dV kernel for the stored-dS dQ kernel: (B*H, q_tiles * 64, k_tiles * 64), row
  // i of head bh at ((bh * q_tiles * 64) + i) * k_tiles * 64, whole tiles (zeros past Tq and
  // Tk). Null: the dQ kernel computes dS itself.
  void* ds;
};

// Element (query i, key j) of head bh of the stored dS (FusedParams::ds).
template <typename T>
__device__ __forceinline__ T* ds_at(const FusedParams& p, int64_t bh, int64_t i, int64_t j) {
  const int64_t ld = p.k_tiles * kTile;
  return static_cast<T*>(p.ds) + (bh * p.q_tiles * kTile + i) * ld + j;
}

// The 128 words of keep bits of tile pair (query tile qt, key tile kt) of head bh.
__device__ __forceinline__ uint32_t* keep_words(const FusedParams& p, int64_t bh, int64_t qt, int64_t kt) {
  return p.keep + ((bh * p.q_tiles + qt) * p.k_tiles + kt) * (kWarps * kWarp);
}

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

// --- cp.async: global -> shared without registers, waited for by groups ---------------------
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  // bytes < 16: the rest of the 16 is zero-filled (0: nothing is read).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// load_head_tile without scaling, through cp.async (rows past T and columns past d are
// zero-filled): visible to the block after cp_async_wait and a barrier. t0 < t.
template <typename T, int D>
__device__ void async_head_tile(const FusedParams& p, const void* src, int64_t b, int64_t h, int64_t t, int64_t t0,
                                T* dst) {
  constexpr int kChunks = D / 8;
  const int64_t row_stride = p.heads * p.d;
  const T* base = static_cast<const T*>(src) + (b * t + t0) * row_stride + h * p.d;  // row t0 exists
  const int64_t rows_left = t - t0;
  for (int idx = threadIdx.x; idx < kTile * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const bool in = r < rows_left && c < p.d;
    cp_async16(dst + r * Ld<D>::h + c, in ? base + r * row_stride + c : base, in ? 16 : 0);
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

// The key tile at k0 into buffer u of the forward and dQ kernels: k and v by cp.async
// (k at kv + 2u tiles, v at kv + 2u + 1), the padding flags at pads + 64u.
template <typename T, int D>
__device__ void stage_key_tile(const FusedParams& p, int64_t b, int64_t h, int64_t k0, T* kv, uint8_t* pads, int u) {
  constexpr int kTileElems = kTile * Ld<D>::h;
  async_head_tile<T, D>(p, p.k, b, h, p.tk, k0, kv + 2 * u * kTileElems);
  async_head_tile<T, D>(p, p.v, b, h, p.tk, k0, kv + (2 * u + 1) * kTileElems);
  load_pad(p, b, k0, pads + u * kTile);
}

// The logit of (i, j) with its mask bias: l + (-1e9) where key j is padding or causally
// hidden, as a float add (the unfused engine's rule).
__device__ __forceinline__ float biased(const FusedParams& p, float l, bool padded, int64_t i, int64_t j) {
  return (padded || (p.causal && j > i + (p.tk - p.tq))) ? l + kMaskBias : l;
}

// Whether none of the 64 keys whose padding flags lie at pad (4-byte aligned, shared
// memory) is padding. Warp-uniform: every lane of the warp calls it.
__device__ __forceinline__ bool warp_no_padding(const uint8_t* pad, int lane) {
  const uint32_t w = lane < kTile / 4 ? reinterpret_cast<const uint32_t*>(pad)[lane] : 0u;
  return !__any_sync(0xffffffffu, w != 0u);
}

// Whether every (query, key) pair of queries [i_first, i_last] and keys up to j_last holds
// a plain logit: all exist (i_last < Tq, j_last < Tk), no key is padding (no_padding)
// and, when causal, even the last key is visible to the first query. Then biased() and the
// bounds checks change nothing, and a kernel may skip them for the block of scores: the same
// bits, without the per-score compares and the shared-memory read of the padding flag (most
// of a tile's scalar work besides exp).
__device__ __forceinline__ bool plain_scores(const FusedParams& p, int64_t i_first, int64_t i_last, int64_t j_last,
                                             bool no_padding) {
  return no_padding && i_last < p.tq && j_last < p.tk && (!p.causal || j_last <= i_first + (p.tk - p.tq));
}

// The Philox words of this lane's 4 elements of an 8-key C tile (keys j8 .. j8 + 7): word[e]
// for (row e < 2 ? row0 : row1, key j8 + 2 t + (e & 1)), t = lane % 4; keep iff
// word_uniform(word[e]) >= rate, which is uniform4 of the unfused engines' counter
// base + ((b*H + h)*Tq + i)*Tk + j. A block holds 4 consecutive counters, and the lanes 2m
// and 2m + 1 of a group together hold keys j8 + 4m .. j8 + 4m + 3 of both rows: the even lane
// draws them for the first row, the odd lane for the second (1 block, or 2 where the 4
// counters straddle a block boundary), and each hands the other the 2 words it needs. So a
// block serves 4 probabilities where a block per probability was drawn before. Every lane of
// the warp must call it (shuffles); rows past Tq and keys past Tk get words that are not used.
__device__ __forceinline__ void keep_words8(const FusedParams& p, int64_t bh, int64_t row0, int64_t row1, int64_t j8,
                                            int lane, uint32_t (&word)[4]) {
  const int t4 = lane & 3;
  const bool odd = (t4 & 1) != 0;
  const int64_t i = odd ? row1 : row0;
  const uint64_t c = p.base + static_cast<uint64_t>((bh * p.tq + i) * p.tk + j8 + 4 * (t4 >> 1));
  // w[k] = word (off + k) of block c / 4 then the next, off = c % 4. off is 0 in the common
  // case (Tk and the rank's first counter multiples of 4; uniform over the grid), where the
  // second block is not drawn. Selects over constant indices keep everything in registers.
  const int off = static_cast<int>(c & 3);
  uint32_t a[4], b[4] = {0, 0, 0, 0};
  philox::block(p.key, c >> 2, 0, a);
  if (off != 0) philox::block(p.key, (c >> 2) + 1, 0, b);
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t v = a[k];
#pragma unroll
    for (int q = 1; q < 4; ++q) {
      if (q + k < 4) v = off == q ? a[q + k] : v;
      else v = off == q ? b[q + k - 4] : v;
    }
    w[k] = v;
  }
  // w[k]: key j8 + 4 (t4 >> 1) + k of row i. The even lane keeps keys +0, +1 of rows[0] and
  // takes the odd lane's +0, +1 of rows[1]; the odd lane keeps +2, +3 of rows[1] and takes the
  // even lane's +2, +3 of rows[0].
  const uint32_t ra = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[2], 1);
  const uint32_t rb = __shfl_xor_sync(0xffffffffu, odd ? w[1] : w[3], 1);
  word[0] = odd ? ra : w[0];
  word[1] = odd ? rb : w[1];
  word[2] = odd ? w[2] : ra;
  word[3] = odd ? w[3] : rb;
}

// --- tensor cores: mma.sync m16n8k16 (f32 accumulators) and ldmatrix -------------------
// Fragments (PTX ISA, "matrix fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16 x 16, 4 regs of 2 elements): {row g, cols 2t, 2t+1}, {row g+8, same}, {row g,
//     cols 2t+8, 2t+9}, {row g+8, same};
//   B (16 x 8, 2 regs): {rows 2t, 2t+1 of col g}, {rows 2t+8, 2t+9 of col g};
//   C (16 x 8, 4 floats): {row g, cols 2t, 2t+1}, {row g+8, same}.
// So the C tiles of columns [16c, 16c + 16) of a product, rounded pairwise, are the A
// fragment of k-step c of the next product (P V after S = Q K^T): no shared memory between.

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 matrices of 16-bit elements from shared memory; lanes 8m..8m+7 give the row
// addresses of matrix m, which lands in r[m]. trans: each matrix transposed on the way.
template <bool Trans>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at)
                 : "memory");
  }
}

// Two floats rounded to T (nearest even, as from_float), the first in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

// The A fragments of this warp's 16 rows [w0, w0 + 16) of a (64, D) tile (ld Ld<D>::h):
// a[kk] covers columns [16kk, 16kk + 16).
template <typename T, int D>
__device__ __forceinline__ void load_a_rows(uint32_t (&a)[D / 16][4], const T* tile, int w0, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldsm_x4<false>(a[kk], tile + (w0 + (lane & 15)) * Ld<D>::h + kk * 16 + (lane >> 4) * 8);
}

// acc (16 rows, 64 columns: 8 C tiles) += a (16, D) b^T, b the (64, D) tile (ld Ld<D>::h):
// the scores of this warp's rows against the 64 rows of the other side.
template <typename T, int D>
__device__ __forceinline__ void mma_abt(float (&acc)[kTile / 8][4], const uint32_t (&a)[D / 16][4], const T* b,
                                        int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kTile / 16; ++np) {
      uint32_t f[4];  // columns 16np..16np+7 (f[0], f[1]) and 16np+8.. (f[2], f[3])
      ldsm_x4<false>(f, b + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * Ld<D>::h + kk * 16 + ((lane >> 3) & 1) * 8);
      mma16816<T>(acc[2 * np], a[kk], f[0], f[1]);
      mma16816<T>(acc[2 * np + 1], a[kk], f[2], f[3]);
    }
  }
}

// acc (16 rows, D: D/8 C tiles) += x (16, 64: the 8 C tiles of a score product, rounded to
// T here) b, b the (64, D) tile (ld Ld<D>::h) read transposed by ldmatrix.
template <typename T, int D>
__device__ __forceinline__ void mma_xb(float (&acc)[D / 8][4], const float (&x)[kTile / 8][4], const T* b, int lane) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    const uint32_t a[4] = {pack2<T>(x[2 * kk][0], x[2 * kk][1]), pack2<T>(x[2 * kk][2], x[2 * kk][3]),
                           pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]), pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t f[4];  // depth columns 16dp..16dp+7 (f[0], f[1]) and 16dp+8.. (f[2], f[3])
      ldsm_x4<true>(f, b + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * Ld<D>::h + dp * 16 + (lane >> 4) * 8);
      mma16816<T>(acc[2 * dp], a, f[0], f[1]);
      mma16816<T>(acc[2 * dp + 1], a, f[2], f[3]);
    }
  }
}

// mma_abt and mma_xb for MT m-tiles of 16 rows at once (the forward's 32-row warps: MT = 2):
// each B fragment read from shared memory feeds MT products. Per m-tile these are the same
// mma.sync instructions on the same fragments, each C tile accumulating over kk in the same
// order, as one mma_abt / mma_xb call per m-tile: the same bits. (mma_xb_mt takes x
// already rounded by pack_a, the rounding mma_xb does.)
template <typename T, int D, int MT>
__device__ __forceinline__ void mma_abt_mt(float (&acc)[MT][kTile / 8][4], const uint32_t (&a)[MT][D / 16][4],
                                           const T* b, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kTile / 16; ++np) {
      uint32_t f[4];
      ldsm_x4<false>(f, b + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * Ld<D>::h + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(acc[mt][2 * np], a[mt][kk], f[0], f[1]);
        mma16816<T>(acc[mt][2 * np + 1], a[mt][kk], f[2], f[3]);
      }
    }
  }
}

// mma_abt_mt with the A fragments read from shared memory at each kk (rows [w0 + 16 mt,
// w0 + 16 mt + 16) of the (., D) tile a, ld Ld<D>::h) instead of held in registers: the same
// fragments (load_a_rows's addresses), the same products in the same order.
template <typename T, int D, int MT>
__device__ __forceinline__ void mma_abt_mt_smem(float (&acc)[MT][kTile / 8][4], const T* a_tile, int w0,
                                                const T* b, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldsm_x4<false>(a[mt], a_tile + (w0 + 16 * mt + (lane & 15)) * Ld<D>::h + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < kTile / 16; ++np) {
      uint32_t f[4];
      ldsm_x4<false>(f, b + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * Ld<D>::h + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(acc[mt][2 * np], a[mt], f[0], f[1]);
        mma16816<T>(acc[mt][2 * np + 1], a[mt], f[2], f[3]);
      }
    }
  }
}

// x (16, 64: the 8 C tiles of a score product) rounded to T as the A fragments of the next
// product: a[kk] covers columns [16kk, 16kk + 16) (mma_xb's rounding, done ahead).
template <typename T>
__device__ __forceinline__ void pack_a(uint32_t (&a)[kTile / 16][4], const float (&x)[kTile / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    a[kk][0] = pack2<T>(x[2 * kk][0], x[2 * kk][1]);
    a[kk][1] = pack2<T>(x[2 * kk][2], x[2 * kk][3]);
    a[kk][2] = pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
  }
}

// mma_xb for MT m-tiles whose x is already rounded (pack_a).
template <typename T, int D, int MT>
__device__ __forceinline__ void mma_xb_mt(float (&acc)[MT][D / 8][4], const uint32_t (&a)[MT][kTile / 16][4],
                                          const T* b, int lane) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t f[4];
      ldsm_x4<true>(f, b + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * Ld<D>::h + dp * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(acc[mt][2 * dp], a[mt][kk], f[0], f[1]);
        mma16816<T>(acc[mt][2 * dp + 1], a[mt][kk], f[2], f[3]);
      }
    }
  }
}

}  // namespace
}  // namespace tnt::cuda
