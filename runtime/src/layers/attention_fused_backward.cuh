// The fused attention core's backward kernels (the scheme: the top of
// attention_fused_cuda.cu, which launches them): delta, dK/dV, and dQ, which either
// computes dS again from S and dP or reads the dS the dK/dV kernel stored
// (TNT_FUSED_ATTENTION_STORED_DS).
#pragma once

#include "layers/attention_fused_tiles.cuh"

namespace tnt::cuda {

namespace {
// delta (B, H, Tq) = sum over the depth of dO * O, a warp per row (float sums of the dtype's
// values); and qs = q * scale.
template <typename T>
__global__ void fused_delta_kernel(FusedParams p, int64_t rows) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kBlock / kWarp) + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int64_t bh = r / p.tq, i = r % p.tq, b = bh / p.heads, h = bh % p.heads;
  const int64_t at = (b * p.tq + i) * p.heads * p.d + h * p.d;
  const T* o = static_cast<const T*>(p.o) + at;
  const T* g = static_cast<const T*>(p.d_o) + at;
  float dot = 0.0f;
  for (int c = lane; c < p.d; c += kWarp) dot += to_float(o[c]) * to_float(g[c]);
  dot = warp_sum(dot);
  if (lane == 0) p.delta[r] = dot;
  // q * scale rounded to T (load_tile's rule), which the dK/dV kernel streams by cp.async.
  const T* q = static_cast<const T*>(p.q) + at;
  T* qs = static_cast<T*>(p.qs) + at;
  for (int c = lane; c < p.d; c += kWarp) qs[c] = from_float<T>(to_float(q[c]) * p.scale);
}

// Grid (B*H, ceil(Tk / 64)), kThreads threads, dkdv_smem<D>() bytes. Rows of this block's
// tiles are keys; S^T and dP^T are computed directly (K Q^T, V dO^T).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) fused_dkdv_kernel(FusedParams p) {
#ifdef TNT_FUSED_ATTENTION_UNSUPPORTED
  __trap();
#else
  constexpr int kN = kTile / 8;
  constexpr int kTileElems = kTile * Ld<D>::h;
  constexpr int kRowVals = 3 * kTile + kWarps * kWarp;  // m, 1/l, delta (64 each), keep bits (128)
  extern __shared__ __align__(128) unsigned char smem[];
  float* row_vals = reinterpret_cast<float*>(smem);  // buffer u at row_vals + u * kRowVals
  T* k_t = reinterpret_cast<T*>(row_vals + 2 * kRowVals);  // (64, D)
  T* v_t = k_t + kTileElems;                               // (64, D)
  T* qd_t = v_t + kTileElems;  // buffer u: q * scale at qd_t + 2u tiles, dO at qd_t + (2u + 1) tiles
  uint8_t* pad = reinterpret_cast<uint8_t*>(qd_t + 4 * kTileElems);  // (64)

  const int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t tq = p.tq, tk = p.tk, row_stride = p.heads * p.d;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, w0 = warp * 16;
  const int g = lane >> 2, t4 = lane & 3;
  const bool dropout = p.rate > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - p.rate) : 1.0f;
  const int64_t keys[2] = {k0 + w0 + g, k0 + w0 + g + 8};  // this lane's two key rows
  // With causal skipping, from the tile of the first query row that sees key k0.
  const int64_t q_begin = fused_attention_query_begin(p.skip_causal, k0, tq, tk);
  // The query tile at q0 into buffer u: q * scale and dO by cp.async (one group); the row
  // values and the tile pair's keep bits.
  auto stage = [&](int64_t q0, int u) {
    async_head_tile<T, D>(p, p.qs, b, h, tq, q0, qd_t + 2 * u * kTileElems);
    async_head_tile<T, D>(p, p.d_o, b, h, tq, q0, qd_t + (2 * u + 1) * kTileElems);
    float* vals = row_vals + u * kRowVals;
    for (int c = threadIdx.x; c < kTile; c += kThreads) {
      const int64_t i = q0 + c;
      const bool valid = i < tq;
      vals[c] = valid ? p.stats[(bh * tq + i) * 2] : 0.0f;
      vals[kTile + c] = valid ? p.stats[(bh * tq + i) * 2 + 1] : 0.0f;
      vals[2 * kTile + c] = valid ? p.delta[bh * tq + i] : 0.0f;
    }
    if (dropout) {
      const uint32_t* words = keep_words(p, bh, q0 / kTile, k0 / kTile);
      uint32_t* keep_s = reinterpret_cast<uint32_t*>(vals + 3 * kTile);
      for (int c = threadIdx.x; c < kWarps * kWarp; c += kThreads) keep_s[c] = words[c];
    }
  };
  if (q_begin < tq) stage(q_begin, 0);
  cp_async_commit();

  load_head_tile<T, D>(p, p.k, b, h, tk, k0, k_t, 1.0f, false);
  load_head_tile<T, D>(p, p.v, b, h, tk, k0, v_t, 1.0f, false);
  load_pad(p, b, k0, pad);
  __syncthreads();
  uint32_t kf[D / 16][4], vf[D / 16][4];
  load_a_rows<T, D>(kf, k_t, w0, lane);
  load_a_rows<T, D>(vf, v_t, w0, lane);
  const bool padded[2] = {pad[w0 + g] != 0, pad[w0 + g + 8] != 0};
  const bool no_padding = !__any_sync(0xffffffffu, padded[0] || padded[1]);  // this warp's 16 keys
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  }
  for (int64_t q0 = q_begin, it = 0; q0 < tq; q0 += kTile, ++it) {
    const int u = static_cast<int>(it & 1);
    if (q0 + kTile < tq) stage(q0 + kTile, 1 - u);  // into the buffer the previous tile left
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* q_t = qd_t + 2 * u * kTileElems;
    const T* do_t = qd_t + (2 * u + 1) * kTileElems;
    const float* q_m = row_vals + u * kRowVals;
    const float* q_inv = q_m + kTile;
    const float* q_delta = q_inv + kTile;
    const uint32_t* keep_s = reinterpret_cast<const uint32_t*>(q_delta + kTile);
    // S^T (this warp's 16 keys, 64 queries) = K Q^T; dP^T = V dO^T
    float st[kN][4], dpt[kN][4];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
    }
    mma_abt<T, D>(st, kf, q_t, lane);
    mma_abt<T, D>(dpt, vf, do_t, lane);
    // Every score of this tile pair plain (warp-uniform): no bounds or masks to apply, and a
    // loop compiled without them (the same values: plain_scores).
    auto tile_scores = [&](auto plain_c) {
      constexpr bool kPlain = decltype(plain_c)::value;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, c = n * 8 + 2 * t4 + (e & 1);
          const int64_t i = q0 + c, j = keys[r];
          float pd = 0.0f, ds = 0.0f;
          if (kPlain || (i < tq && j < tk)) {
            const float logit = kPlain ? st[n][e] : biased(p, st[n][e], padded[r], i, j);
            const float prob = __expf(logit - q_m[c]) * q_inv[c];
            float dp = dpt[n][e];
            pd = prob;
            if (dropout) {
              // The forward's bit of (i, j) (its fragment layout is this one transposed: see
              // FusedParams::keep). prob 0: dS and Pd are 0 either way.
              const int word = (n >> 1) * kWarp + (2 * warp + r) * 4 + (n & 1) * 2 + (g & 1);
              const int bit = (2 * t4 + (e & 1)) * 4 + (g >> 1);
              const bool keep = prob != 0.0f && ((keep_s[word] >> bit) & 1u) != 0;
              pd = keep ? prob * keep_scale : 0.0f;
              dp = keep ? dp * keep_scale : 0.0f;
            }
            ds = prob * (dp - q_delta[c]);
          }
          st[n][e] = pd;
          dpt[n][e] = ds;
        }
      }
    };
    // (Not at D = 128, where the kernel already spills: a second copy of the loop spills more.)
    if constexpr (D <= 64) {
      if (plain_scores(p, q0, q0 + kTile - 1, k0 + w0 + 15, no_padding)) {
        tile_scores(std::true_type{});
      } else {
        tile_scores(std::false_type{});
      }
    } else {
      tile_scores(std::false_type{});
    }
    if (p.ds != nullptr) {
      // dS of the whole tile pair for the stored-dS dQ kernel, as the products below round
      // it (zeros past Tq and Tk): element (n, e) is query q0 + n*8 + 2t4 + (e & 1), key
      // k0 + w0 + g + 8 (e >> 1); a store instruction writes 16 bytes in each of 4 rows.
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          *ds_at<T>(p, bh, q0 + n * 8 + 2 * t4 + (e & 1), k0 + w0 + g + 8 * (e >> 1)) = from_float<T>(dpt[n][e]);
        }
      }
    }
    // dV (16 keys, D) += Pd^T (16, 64) dO (64, D); dK += dS^T Q (q carries the scale)
    mma_xb<T, D>(dv, st, do_t, lane);
    mma_xb<T, D>(dk, dpt, q_t, lane);
    __syncthreads();  // buffer u is free for the load two tiles on
  }
  T* dk_out = static_cast<T*>(p.out);
  T* dv_out = static_cast<T*>(p.out2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = keys[r];
    if (j >= tk) continue;
    const int64_t at = (b * tk + j) * row_stride + h * p.d;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int c = n * 8 + 2 * t4;
      if (c >= p.d) continue;
      *reinterpret_cast<uint32_t*>(dk_out + at + c) = pack2<T>(dk[n][2 * r], dk[n][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dv_out + at + c) = pack2<T>(dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
#endif
}

// This lane's two rows (row0 and row0 + 8) of a dQ accumulator (16 rows, D), times the scale, into p.out (rows
// past Tq skipped): the end of both dQ kernels.
template <typename T, int D>
__device__ __forceinline__ void store_dq(const FusedParams& p, const float (&dq)[D / 8][4], int64_t b, int64_t h,
                                         int64_t tq, int64_t row_stride, int64_t row0, int t4) {
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row0 + 8 * r;
    if (i >= tq) continue;
    T* row = out + (b * tq + i) * row_stride + h * p.d;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int c = n * 8 + 2 * t4;
      if (c < p.d) *reinterpret_cast<uint32_t*>(row + c) = pack2<T>(dq[n][2 * r] * p.scale, dq[n][2 * r + 1] * p.scale);
    }
  }
}

// Grid (B*H, ceil(Tq / 64)), kThreads threads, dq_smem<D>() bytes.
template <typename T, int D>
// At D <= 64 at most 168 registers, so that 3 blocks fit an SM (the plain-score loop took it
// to 174 and 2 blocks otherwise; no spills at 168).
__global__ void __launch_bounds__(kThreads, D <= 64 ? 3 : 1) fused_dq_kernel(FusedParams p) {
#ifdef TNT_FUSED_ATTENTION_UNSUPPORTED
  __trap();
#else
  constexpr int kN = kTile / 8;
  constexpr int kTileElems = kTile * Ld<D>::h;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_t = reinterpret_cast<T*>(smem);  // (64, D) q * scale
  T* do_t = q_t + kTileElems;           // (64, D)
  T* kv_t = do_t + kTileElems;          // buffer u: k at kv_t + 2u tiles, v at kv_t + (2u + 1) tiles
  uint8_t* pads = reinterpret_cast<uint8_t*>(kv_t + 4 * kTileElems);  // buffer u: (64) at pads + 64u

  const int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t tq = p.tq, tk = p.tk, row_stride = p.heads * p.d;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, w0 = warp * 16;
  const int g = lane >> 2, t4 = lane & 3;
  const bool dropout = p.rate > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - p.rate) : 1.0f;
  const int64_t rows[2] = {q0 + w0 + g, q0 + w0 + g + 8};
  const int64_t k_end = fused_attention_key_end(p.skip_causal, q0, tq, tk);
  auto stage = [&](int64_t k0, int u) { stage_key_tile<T, D>(p, b, h, k0, kv_t, pads, u); };
  stage(0, 0);
  cp_async_commit();
  float m[2], inv[2], delta[2];  // the forward's row max and 1 / row sum, and delta (0 past Tq)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = rows[r] < tq;
    m[r] = valid ? p.stats[(bh * tq + rows[r]) * 2] : 0.0f;
    inv[r] = valid ? p.stats[(bh * tq + rows[r]) * 2 + 1] : 0.0f;
    delta[r] = valid ? p.delta[bh * tq + rows[r]] : 0.0f;
  }

  load_head_tile<T, D>(p, p.q, b, h, tq, q0, q_t, p.scale, true);
  load_head_tile<T, D>(p, p.d_o, b, h, tq, q0, do_t, 1.0f, false);
  __syncthreads();
  uint32_t qf[D / 16][4], of[D / 16][4];
  load_a_rows<T, D>(qf, q_t, w0, lane);
  load_a_rows<T, D>(of, do_t, w0, lane);
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int64_t k0 = 0, it = 0; k0 < k_end; k0 += kTile, ++it) {
    const int u = static_cast<int>(it & 1);
    if (k0 + kTile < k_end) stage(k0 + kTile, 1 - u);  // into the buffer the previous tile left
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* k_t = kv_t + 2 * u * kTileElems;
    const T* v_t = kv_t + (2 * u + 1) * kTileElems;
    const uint8_t* pad = pads + u * kTile;
    // S (this warp's 16 queries, 64 keys) = Q K^T; dP = dO V^T
    float s[kN][4], dp[kN][4];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
    }
    mma_abt<T, D>(s, qf, k_t, lane);
    mma_abt<T, D>(dp, of, v_t, lane);
    // The forward's keep bits of this tile pair, in this kernel's fragment layout.
    const uint32_t keep_word = dropout ? keep_words(p, bh, blockIdx.y, k0 / kTile)[warp * kWarp + lane] : 0u;
    // Every score of this warp's 16 rows plain (warp-uniform): no bounds or masks to apply,
    // and a loop compiled without them (the same values: plain_scores).
    auto tile_scores = [&](auto plain_c) {
      constexpr bool kPlain = decltype(plain_c)::value;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, c = n * 8 + 2 * t4 + (e & 1);
          const int64_t i = rows[r], j = k0 + c;
          const bool bit = dropout && ((__shfl_sync(0xffffffffu, keep_word, n * 4 + e) >> lane) & 1u) != 0;
          float ds = 0.0f;
          if (kPlain || (i < tq && j < tk)) {
            const float logit = kPlain ? s[n][e] : biased(p, s[n][e], pad[c] != 0, i, j);
            const float prob = __expf(logit - m[r]) * inv[r];
            float d = dp[n][e];
            if (dropout) d = prob != 0.0f && bit ? d * keep_scale : 0.0f;
            ds = prob * (d - delta[r]);
          }
          s[n][e] = ds;
        }
      }
    };
    if (plain_scores(p, q0 + w0, q0 + w0 + 15, k0 + kTile - 1, p.ids == nullptr || warp_no_padding(pad, lane))) {
      tile_scores(std::true_type{});
    } else {
      tile_scores(std::false_type{});
    }
    // dQ (16, D) += dS (16, 64) K (64, D)
    mma_xb<T, D>(dq, s, k_t, lane);
    __syncthreads();  // buffer u is free for the load two tiles on
  }
  store_dq<T, D>(p, dq, b, h, tq, row_stride, rows[0], t4);
#endif
}

// The dQ kernel with dS stored by the dK/dV kernel (FusedParams::ds): per key tile one
// product, dQ += dS K, instead of S = Q K^T, dP = dO V^T, the softmax's exp and dS again.
// Grid (B*H, ceil(Tq / 64)), kThreads threads, dq_stored_smem<D>() bytes; the key tiles
// visited are those of fused_dq_kernel, which the dK/dV kernel visits too (the causal rule of
// attention_fused.hpp gives both the same tile pairs), so every dS tile read was written.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) fused_dq_stored_kernel(FusedParams p) {
#ifdef TNT_FUSED_ATTENTION_UNSUPPORTED
  __trap();
#else
  constexpr int kKElems = kTile * Ld<D>::h, kSElems = kTile * Ld<kTile>::h;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_buf = reinterpret_cast<T*>(smem);  // buffer u: k at k_buf + u * kKElems
  T* s_buf = k_buf + 2 * kKElems;         // buffer u: dS (64 queries, 64 keys) at s_buf + u * kSElems

  const int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t tq = p.tq, tk = p.tk, row_stride = p.heads * p.d;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, w0 = warp * 16;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t rows[2] = {q0 + w0 + g, q0 + w0 + g + 8};
  const int64_t k_end = fused_attention_key_end(p.skip_causal, q0, tq, tk);
  auto stage = [&](int64_t k0, int u) {
    async_head_tile<T, D>(p, p.k, b, h, tk, k0, k_buf + u * kKElems);
    // 64 rows of 64 keys, 8 chunks of 16 bytes each (the stored tiles are whole).
    for (int idx = threadIdx.x; idx < kTile * (kTile / 8); idx += kThreads) {
      const int r = idx / (kTile / 8), c = (idx % (kTile / 8)) * 8;
      cp_async16(s_buf + u * kSElems + r * Ld<kTile>::h + c, ds_at<T>(p, bh, q0 + r, k0 + c), 16);
    }
  };
  stage(0, 0);
  cp_async_commit();
  float dq[1][D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[0][n][0] = dq[0][n][1] = dq[0][n][2] = dq[0][n][3] = 0.0f;
  for (int64_t k0 = 0, it = 0; k0 < k_end; k0 += kTile, ++it) {
    const int u = static_cast<int>(it & 1);
    if (k0 + kTile < k_end) stage(k0 + kTile, 1 - u);  // into the buffer the previous tile left
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t sf[1][kTile / 16][4];
    load_a_rows<T, kTile>(sf[0], s_buf + u * kSElems, w0, lane);
    // dQ (16, D) += dS (16, 64) K (64, D)
    mma_xb_mt<T, D, 1>(dq, sf, k_buf + u * kKElems, lane);
    __syncthreads();  // buffer u is free for the load two tiles on
  }
  store_dq<T, D>(p, dq[0], b, h, tq, row_stride, rows[0], t4);
#endif
}

}  // namespace

}  // namespace tnt::cuda
