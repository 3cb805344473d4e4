// The fused attention core on CUDA (FlashAttention-2 style; semantics in attention_cuda.hpp).
//
// The idea: a block owns a tile of 64 rows (query rows in the forward and the dQ kernel,
// key rows in the dK/dV kernel) of one (b, h) and walks over the tiles of the other side,
// so the (Tq, Tk) logits exist only one 64 x 64 tile at a time, in shared memory.
//   forward   per key tile: S = Q K^T (f32), online softmax per query row (running max m
//             and sum l; earlier output rescaled by exp(m_old - m_new)), O += P V with P
//             unnormalised (times the dropout mask); at the end o = O / l, and (m, 1/l)
//             saved per row for the backward.
//   backward  delta_i = dO_i . O_i (one warp per row); then two kernels that rebuild
//             P = exp(S - m) / l and dS = P (dP Z - delta) with dP = dO V^T and Z the
//             dropout mask (drawn again from the same Philox counters, never stored):
//             dkdv: per key tile over all query tiles, dV += Pd^T dO, dK += dS^T Q;
//             dq:   per query tile over all key tiles, dQ += dS K (times scale).
//             No atomics: every output element is summed by one block in a fixed order,
//             so the results are deterministic.
// The 4 warps of a block each own 16 of its 64 rows: products through WMMA (16x16x16,
// bf16/f16 in, f32 accumulators); accumulators round-trip through f32 shared memory because
// a fragment's element layout is unspecified, and the row-wise work (masks, softmax,
// dropout) reads the f32 tile there, a warp per row. Between the block's barriers (tile
// loads) a warp touches only its own rows, so __syncwarp orders its steps.
// Masks follow the unfused engine exactly: +(-1e9) as a float add for padding keys and
// causally hidden keys; positions past Tq or Tk inside a tile are no keys at all (p = 0).
// Depths below the kernel's D (32, 64, 128) are zero columns: they add nothing to S or dP.
#include "layers/attention_fused_cuda.hpp"

#include "layers/attention_fused_tiles.cuh"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

namespace tnt::cuda {

namespace {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TNT_FUSED_ATTENTION_UNSUPPORTED 1  // bf16 WMMA needs sm_80; the host never launches there
#endif

// Grid (B*H, ceil(Tq / 64)), kThreads threads, forward_smem<D>() bytes.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) fused_forward_kernel(FusedParams p) {
#ifdef TNT_FUSED_ATTENTION_UNSUPPORTED
  __trap();
#else
  using L = Ld<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  float* s_tile = reinterpret_cast<float*>(smem);  // (64, 64) scores of the key tile
  float* o_acc = s_tile + kTile * L::s;             // (64, D) unnormalised output
  float* row_m = o_acc + kTile * L::o;              // (64) running max
  float* row_l = row_m + kTile;                     // (64) running sum
  T* q_t = reinterpret_cast<T*>(row_l + kTile);     // (64, D) q * scale
  T* k_t = q_t + kTile * L::h;                      // (64, D)
  T* v_t = k_t + kTile * L::h;                      // (64, D)
  T* p_t = v_t + kTile * L::h;                      // (64, 64) probabilities (unnormalised, dropped)
  uint8_t* pad = reinterpret_cast<uint8_t*>(p_t + kTile * L::p);  // (64)

  const int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t tq = p.tq, tk = p.tk, row_stride = p.heads * p.d;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, w0 = warp * 16;
  const bool dropout = p.rate > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - p.rate) : 1.0f;

  load_head_tile<T, D>(p, p.q, b, h, tq, q0, q_t, p.scale, true);
  for (int idx = threadIdx.x; idx < kTile * L::o; idx += kThreads) o_acc[idx] = 0.0f;
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    row_m[r] = -INFINITY;
    row_l[r] = 0.0f;
  }
  // Causal without padding and Tq <= Tk: key tiles past the last row's bound hold only
  // hidden keys, whose probabilities are exactly 0 (attention_fused.hpp).
  const int64_t k_end = fused_attention_key_end(p.skip_causal, q0, tq, tk);
  for (int64_t k0 = 0; k0 < k_end; k0 += kTile) {
    __syncthreads();  // the previous tile's k_t, v_t, pad are no longer read
    load_head_tile<T, D>(p, p.k, b, h, tk, k0, k_t, 1.0f, false);
    load_head_tile<T, D>(p, p.v, b, h, tk, k0, v_t, 1.0f, false);
    load_pad(p, b, k0, pad);
    __syncthreads();
    // S (16 rows of this warp, 64 keys) = Q K^T
    scores<T, D>(q_t + w0 * L::h, k_t, s_tile + w0 * L::s);
    __syncwarp();
    for (int r = w0; r < w0 + 16; ++r) {
      const int64_t i = q0 + r;
      float x[2];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = lane + t * kWarp;
        const int64_t j = k0 + c;
        x[t] = j < tk ? biased(p, s_tile[r * L::s + c], pad[c] != 0, i, j) : -INFINITY;
      }
      const float m_old = row_m[r];
      // Finite: key k0 < Tk is in the tile.
      const float m_new = fmaxf(m_old, warp_max(fmaxf(x[0], x[1])));
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = lane + t * kWarp;
        const float e = __expf(x[t] - m_new);  // 0 past Tk
        sum += e;
        float pd = e;
        // (No draw where nothing is kept anyway: a zero probability, or a row past Tq.)
        if (dropout) pd = (e != 0.0f && i < tq && kept(p, bh, i, k0 + c)) ? e * keep_scale : 0.0f;
        p_t[r * L::p + c] = from_float<T>(pd);
      }
      sum = warp_sum(sum);
      const float corr = __expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
      __syncwarp();                              // every lane has read row_m[r]
      if (lane == 0) {
        row_m[r] = m_new;
        row_l[r] = row_l[r] * corr + sum;
      }
      for (int c = lane; c < D; c += kWarp) o_acc[r * L::o + c] *= corr;
    }
    __syncwarp();
    // O (16, D) += P (16, 64) V (64, D)
    accumulate<T, D>(o_acc + w0 * L::o, p_t + w0 * L::p, v_t);
  }
  __syncthreads();  // every lane sees the accumulators and row statistics (and the zeroing, always)
  T* o = static_cast<T*>(p.out);
  for (int r = w0; r < w0 + 16; ++r) {
    const int64_t i = q0 + r;
    if (i >= tq) break;
    const float inv = 1.0f / row_l[r];
    T* orow = o + (b * tq + i) * row_stride + h * p.d;
    for (int c = lane; c < p.d; c += kWarp) orow[c] = from_float<T>(o_acc[r * L::o + c] * inv);
    if (lane == 0) {
      p.stats[(bh * tq + i) * 2] = row_m[r];
      p.stats[(bh * tq + i) * 2 + 1] = inv;
    }
  }
#endif
}

// delta (B, H, Tq) = sum over the depth of dO * O, a warp per row (float sums of the dtype's
// values).
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
}

// Grid (B*H, ceil(Tk / 64)), kThreads threads, dkdv_smem<D>() bytes. Rows of this block's
// tiles are keys; S^T and dP^T are computed directly (K Q^T, V dO^T).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) fused_dkdv_kernel(FusedParams p) {
#ifdef TNT_FUSED_ATTENTION_UNSUPPORTED
  __trap();
#else
  using L = Ld<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  float* s_t = reinterpret_cast<float*>(smem);    // (64 keys, 64 queries) S^T
  float* dp_t = s_t + kTile * L::s;               // (64, 64) dP^T
  float* dk_acc = dp_t + kTile * L::s;            // (64, D)
  float* dv_acc = dk_acc + kTile * L::o;          // (64, D)
  float* q_m = dv_acc + kTile * L::o;             // (64) of the query tile: row max
  float* q_inv = q_m + kTile;                     // (64) 1 / row sum
  float* q_delta = q_inv + kTile;                 // (64) delta
  T* k_t = reinterpret_cast<T*>(q_delta + kTile);  // (64, D)
  T* v_t = k_t + kTile * L::h;                     // (64, D)
  T* q_t = v_t + kTile * L::h;                     // (64, D) q * scale
  T* do_t = q_t + kTile * L::h;                    // (64, D)
  T* pd_t = do_t + kTile * L::h;                   // (64 keys, 64 queries) Pd^T
  T* ds_t = pd_t + kTile * L::p;                   // (64, 64) dS^T
  uint8_t* pad = reinterpret_cast<uint8_t*>(ds_t + kTile * L::p);  // (64)

  const int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t tq = p.tq, tk = p.tk, row_stride = p.heads * p.d;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, w0 = warp * 16;
  const bool dropout = p.rate > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - p.rate) : 1.0f;

  load_head_tile<T, D>(p, p.k, b, h, tk, k0, k_t, 1.0f, false);
  load_head_tile<T, D>(p, p.v, b, h, tk, k0, v_t, 1.0f, false);
  load_pad(p, b, k0, pad);
  for (int idx = threadIdx.x; idx < kTile * L::o; idx += kThreads) {
    dk_acc[idx] = 0.0f;
    dv_acc[idx] = 0.0f;
  }
  // With causal skipping, from the tile of the first query row that sees key k0.
  const int64_t q_begin = fused_attention_query_begin(p.skip_causal, k0, tq, tk);
  for (int64_t q0 = q_begin; q0 < tq; q0 += kTile) {
    __syncthreads();  // the previous query tile is no longer read (and the loads above are done)
    load_head_tile<T, D>(p, p.q, b, h, tq, q0, q_t, p.scale, true);
    load_head_tile<T, D>(p, p.d_o, b, h, tq, q0, do_t, 1.0f, false);
    load_row_stats(p, bh, q0, q_m, q_inv, q_delta);
    __syncthreads();
    // S^T (16 keys of this warp, 64 queries) = K Q^T; dP^T = V dO^T
    scores<T, D>(k_t + w0 * L::h, q_t, s_t + w0 * L::s);
    scores<T, D>(v_t + w0 * L::h, do_t, dp_t + w0 * L::s);
    __syncwarp();
    for (int r = w0; r < w0 + 16; ++r) {
      const int64_t j = k0 + r;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = lane + t * kWarp;
        const int64_t i = q0 + c;
        float pd = 0.0f, ds = 0.0f;
        if (i < tq && j < tk) {
          const float prob = __expf(biased(p, s_t[r * L::s + c], pad[r] != 0, i, j) - q_m[c]) * q_inv[c];
          float dp = dp_t[r * L::s + c];
          pd = prob;
          if (dropout) {
            const bool keep = prob != 0.0f && kept(p, bh, i, j);  // prob 0: dS and Pd are 0 either way
            pd = keep ? prob * keep_scale : 0.0f;
            dp = keep ? dp * keep_scale : 0.0f;
          }
          ds = prob * (dp - q_delta[c]);
        }
        pd_t[r * L::p + c] = from_float<T>(pd);
        ds_t[r * L::p + c] = from_float<T>(ds);
      }
    }
    __syncwarp();
    // dV (16 keys, D) += Pd^T (16, 64) dO (64, D); dK += dS^T Q (q carries the scale)
    accumulate<T, D>(dv_acc + w0 * L::o, pd_t + w0 * L::p, do_t);
    accumulate<T, D>(dk_acc + w0 * L::o, ds_t + w0 * L::p, q_t);
  }
  __syncthreads();  // every lane sees the accumulators (and the zeroing, always)
  T* dk = static_cast<T*>(p.out);
  T* dv = static_cast<T*>(p.out2);
  for (int r = w0; r < w0 + 16; ++r) {
    const int64_t j = k0 + r;
    if (j >= tk) break;
    const int64_t at = (b * tk + j) * row_stride + h * p.d;
    for (int c = lane; c < p.d; c += kWarp) {
      dk[at + c] = from_float<T>(dk_acc[r * L::o + c]);
      dv[at + c] = from_float<T>(dv_acc[r * L::o + c]);
    }
  }
#endif
}

// Grid (B*H, ceil(Tq / 64)), kThreads threads, dq_smem<D>() bytes.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) fused_dq_kernel(FusedParams p) {
#ifdef TNT_FUSED_ATTENTION_UNSUPPORTED
  __trap();
#else
  using L = Ld<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  float* s_tile = reinterpret_cast<float*>(smem);  // (64 queries, 64 keys) S
  float* dp_tile = s_tile + kTile * L::s;          // (64, 64) dP
  float* dq_acc = dp_tile + kTile * L::s;          // (64, D)
  float* q_m = dq_acc + kTile * L::o;              // (64) row max
  float* q_inv = q_m + kTile;                      // (64) 1 / row sum
  float* q_delta = q_inv + kTile;                  // (64)
  T* q_t = reinterpret_cast<T*>(q_delta + kTile);  // (64, D) q * scale
  T* do_t = q_t + kTile * L::h;                    // (64, D)
  T* k_t = do_t + kTile * L::h;                    // (64, D)
  T* v_t = k_t + kTile * L::h;                     // (64, D)
  T* ds_t = v_t + kTile * L::h;                    // (64, 64) dS
  uint8_t* pad = reinterpret_cast<uint8_t*>(ds_t + kTile * L::p);  // (64)

  const int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t tq = p.tq, tk = p.tk, row_stride = p.heads * p.d;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, w0 = warp * 16;
  const bool dropout = p.rate > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - p.rate) : 1.0f;

  load_head_tile<T, D>(p, p.q, b, h, tq, q0, q_t, p.scale, true);
  load_head_tile<T, D>(p, p.d_o, b, h, tq, q0, do_t, 1.0f, false);
  load_row_stats(p, bh, q0, q_m, q_inv, q_delta);
  for (int idx = threadIdx.x; idx < kTile * L::o; idx += kThreads) dq_acc[idx] = 0.0f;
  const int64_t k_end = fused_attention_key_end(p.skip_causal, q0, tq, tk);
  for (int64_t k0 = 0; k0 < k_end; k0 += kTile) {
    __syncthreads();  // the previous key tile is no longer read
    load_head_tile<T, D>(p, p.k, b, h, tk, k0, k_t, 1.0f, false);
    load_head_tile<T, D>(p, p.v, b, h, tk, k0, v_t, 1.0f, false);
    load_pad(p, b, k0, pad);
    __syncthreads();
    // S (16 queries of this warp, 64 keys) = Q K^T; dP = dO V^T
    scores<T, D>(q_t + w0 * L::h, k_t, s_tile + w0 * L::s);
    scores<T, D>(do_t + w0 * L::h, v_t, dp_tile + w0 * L::s);
    __syncwarp();
    for (int r = w0; r < w0 + 16; ++r) {
      const int64_t i = q0 + r;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = lane + t * kWarp;
        const int64_t j = k0 + c;
        float ds = 0.0f;
        if (i < tq && j < tk) {
          const float prob = __expf(biased(p, s_tile[r * L::s + c], pad[c] != 0, i, j) - q_m[r]) * q_inv[r];
          float dp = dp_tile[r * L::s + c];
          if (dropout) dp = prob != 0.0f && kept(p, bh, i, j) ? dp * keep_scale : 0.0f;
          ds = prob * (dp - q_delta[r]);
        }
        ds_t[r * L::p + c] = from_float<T>(ds);
      }
    }
    __syncwarp();
    // dQ (16, D) += dS (16, 64) K (64, D)
    accumulate<T, D>(dq_acc + w0 * L::o, ds_t + w0 * L::p, k_t);
  }
  __syncthreads();  // every lane sees the accumulator (and the zeroing, always)
  T* dq = static_cast<T*>(p.out);
  for (int r = w0; r < w0 + 16; ++r) {
    const int64_t i = q0 + r;
    if (i >= tq) break;
    T* row = dq + (b * tq + i) * row_stride + h * p.d;
    for (int c = lane; c < p.d; c += kWarp) row[c] = from_float<T>(dq_acc[r * L::o + c] * p.scale);
  }
#endif
}

FusedParams make_params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                        const AttentionCoreArgs& a) {
  FusedParams p{};
  p.q = q.raw();
  p.k = k.raw();
  p.v = v.raw();
  p.ids = key_ids.defined() ? key_ids.raw() : nullptr;
  p.ids64 = key_ids.defined() && key_ids.dtype() == DType::i64;
  if (key_ids.defined()) {
    TNT_CHECK(key_ids.dtype() == DType::i32 || key_ids.dtype() == DType::i64,
              "MultiHeadAttention: key ids must be i32 or i64, got {}", key_ids.str());
  }
  p.heads = a.heads;
  p.tq = a.tq;
  p.tk = a.tk;
  p.d = static_cast<int>(a.depth);
  p.scale = a.scale;
  p.causal = a.causal;
  p.skip_causal = fused_attention_causal_skip(a.causal, key_ids.defined(), a.tq, a.tk);
  p.rate = a.rate;
  p.key = a.key;
  p.base = a.base;
  return p;
}

// The opt-in shared memory of a kernel is set once per device (a host call per launch
// otherwise: three per attention layer and step).
template <typename Kernel>
void launch(Kernel kernel, dim3 grid, size_t smem, int device, const FusedParams& p) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  {
    std::lock_guard<std::mutex> lock(mu);
    const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), device};
    if (!done.count(key)) {
      TNT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      done.insert(key);
    }
  }
  kernel<<<grid, kThreads, smem, compute_stream(device)>>>(p);
  TNT_CUDA_CHECK_LAUNCH();
}

// Runs the statement with scalar_t (the element type) and kD (the kernel depth) bound.
#define TNT_FUSED_DISPATCH(dtype, depth, ...)                                                       \
  do {                                                                                               \
    const int64_t tnt_kd_ = fused_attention_kernel_depth(depth);                                     \
    TNT_CHECK(((dtype) == DType::bf16 || (dtype) == DType::f16) && tnt_kd_ != 0,                     \
              "fused attention: dtype {} depth {} not supported", dtype_name(dtype), depth);         \
    if ((dtype) == DType::bf16) {                                                                    \
      using scalar_t = __nv_bfloat16;                                                                \
      if (tnt_kd_ == 32) { constexpr int kD = 32; __VA_ARGS__; }                                            \
      else if (tnt_kd_ == 64) { constexpr int kD = 64; __VA_ARGS__; }                                       \
      else { constexpr int kD = 128; __VA_ARGS__; }                                                         \
    } else {                                                                                         \
      using scalar_t = __half;                                                                       \
      if (tnt_kd_ == 32) { constexpr int kD = 32; __VA_ARGS__; }                                            \
      else if (tnt_kd_ == 64) { constexpr int kD = 64; __VA_ARGS__; }                                       \
      else { constexpr int kD = 128; __VA_ARGS__; }                                                         \
    }                                                                                                \
  } while (0)

size_t largest_smem(int64_t kernel_depth) {
  auto most = [](size_t a, size_t b, size_t c) { return std::max(a, std::max(b, c)); };
  if (kernel_depth == 32) return most(forward_smem<32>(), dkdv_smem<32>(), dq_smem<32>());
  if (kernel_depth == 64) return most(forward_smem<64>(), dkdv_smem<64>(), dq_smem<64>());
  return most(forward_smem<128>(), dkdv_smem<128>(), dq_smem<128>());
}

}  // namespace

bool fused_attention_fits(int64_t depth, int device) {
  const int64_t kd = fused_attention_kernel_depth(depth);
  if (kd == 0) return false;
  // The device's attributes, asked once per device (this runs at every forward).
  static std::mutex mu;
  static std::map<int, std::pair<int, int>> known;  // device -> (compute capability major, opt-in bytes)
  std::pair<int, int> attrs;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = known.find(device);
    if (it == known.end()) {
      int major = 0, optin = 0;
      TNT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
      TNT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      it = known.emplace(device, std::make_pair(major, optin)).first;
    }
    attrs = it->second;
  }
  return attrs.first >= 8 && largest_smem(kd) <= static_cast<size_t>(attrs.second);
}

void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                             const AttentionCoreArgs& a, Tensor& o, Tensor& stats, int device) {
  const int64_t B = a.batch, H = a.heads, Tq = a.tq, D = a.heads * a.depth;
  const DType dt = q.dtype();
  o = Tensor::empty({B, Tq, D}, dt, q.device());
  stats = Tensor::empty({B, H, Tq, 2}, DType::f32, q.device());
  FusedParams p = make_params(q, k, v, key_ids, a);
  p.out = o.raw();
  p.stats = static_cast<float*>(stats.raw());
  const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>((Tq + kTile - 1) / kTile));
  TNT_FUSED_DISPATCH(dt, a.depth, launch(fused_forward_kernel<scalar_t, kD>, grid, forward_smem<kD>(), device, p));
}

void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                              const Tensor& o, const Tensor& stats, const Tensor& d_o, const AttentionCoreArgs& a,
                              Tensor& dq, Tensor& dk, Tensor& dv, int device) {
  const int64_t B = a.batch, H = a.heads, Tq = a.tq, Tk = a.tk, D = a.heads * a.depth;
  const DType dt = q.dtype();
  const Device dev = q.device();
  Tensor delta = Tensor::empty({B, H, Tq}, DType::f32, dev);
  dq = Tensor::empty({B, Tq, D}, dt, dev);
  dk = Tensor::empty({B, Tk, D}, dt, dev);
  dv = Tensor::empty({B, Tk, D}, dt, dev);
  FusedParams p = make_params(q, k, v, key_ids, a);
  p.o = o.raw();
  p.d_o = d_o.raw();
  p.stats = static_cast<float*>(stats.raw());
  p.delta = static_cast<float*>(delta.raw());
  const int64_t rows = B * H * Tq;
  const unsigned row_grid = static_cast<unsigned>((rows + kBlock / kWarp - 1) / (kBlock / kWarp));
  const dim3 key_grid(static_cast<unsigned>(B * H), static_cast<unsigned>((Tk + kTile - 1) / kTile));
  const dim3 query_grid(static_cast<unsigned>(B * H), static_cast<unsigned>((Tq + kTile - 1) / kTile));
  TNT_FUSED_DISPATCH(dt, a.depth, {
    fused_delta_kernel<scalar_t><<<row_grid, kBlock, 0, compute_stream(device)>>>(p, rows);
    TNT_CUDA_CHECK_LAUNCH();
    FusedParams pk = p;
    pk.out = dk.raw();
    pk.out2 = dv.raw();
    launch(fused_dkdv_kernel<scalar_t, kD>, key_grid, dkdv_smem<kD>(), device, pk);
    FusedParams pq = p;
    pq.out = dq.raw();
    launch(fused_dq_kernel<scalar_t, kD>, query_grid, dq_smem<kD>(), device, pq);
  });
}

}  // namespace tnt::cuda
