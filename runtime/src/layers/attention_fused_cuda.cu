// The fused attention core on CUDA (FlashAttention-2 style; semantics in attention_cuda.hpp;
// the forward kernel and the launches here, the backward kernels in attention_fused_backward.cuh).
//
// The idea: a block owns a tile of 64 rows (query rows in the forward and the dQ kernel,
// key rows in the dK/dV kernel) of one (b, h) and walks over the tiles of the other side,
// so the (Tq, Tk) logits exist only one 64 x 64 tile at a time, in registers.
//   forward   per key tile: S = Q K^T (f32), online softmax per query row (running max m
//             and sum l; earlier output rescaled by exp(m_old - m_new)), O += P V with P
//             unnormalised (times the dropout mask); at the end o = O / l, and (m, 1/l)
//             saved per row for the backward.
//   backward  delta_i = dO_i . O_i (one warp per row); then two kernels that rebuild
//             P = exp(S - m) / l and dS = P (dP Z - delta) with dP = dO V^T and Z the
//             dropout mask (the forward draws a Philox block per 4 probabilities and keeps
//             its decisions as bits for the backward):
//             dkdv: per key tile over all query tiles, dV += Pd^T dO, dK += dS^T Q;
//             dq:   per query tile over all key tiles, dQ += dS K (times scale).
//             No atomics: every output element is summed by one block in a fixed order,
//             so the results are deterministic.
// The 4 warps of a block each own 16 of its 64 rows (the forward has a variant with 32 rows
// per warp and 128 per block, TNT_FUSED_ATTENTION_ROWS: the same bits, fewer shared-memory
// reads per product). Products are mma.sync m16n8k16 (bf16 or f16 in, f32 accumulators
// in registers) with operands from shared memory by ldmatrix;
// a score tile stays in registers, where the row-wise work (masks, online softmax, dropout)
// happens (a row's 64 columns lie with 4 lanes), and its C fragments, rounded to the
// dtype, are directly the A operand of the next product (P V, Pd^T dO, dS^T Q, dS K). Only
// the tiles of q, k, v and dO go through shared memory, read by every warp; the tiles a
// kernel walks over are double-buffered: the next one arrives by cp.async while the
// current one is used, a barrier at the end of each step freeing its buffer.
// Masks follow the unfused engine exactly: +(-1e9) as a float add for padding keys and
// causally hidden keys; positions past Tq or Tk inside a tile are no keys at all (p = 0).
// A warp whose scores of a tile need none of that (plain_scores: all keys and rows exist,
// no padding key, wholly below a causal diagonal; most tiles of a long sequence) runs a loop
// without the per-score compares and padding-flag reads: the same values, less scalar work.
// Depths below the kernel's D (32, 64, 128) are zero columns: they add nothing to S or dP.
#include "layers/attention_fused_cuda.hpp"

#include "layers/attention_fused_backward.cuh"
#include "layers/attention_fused_tiles.cuh"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

namespace tnt::cuda {

namespace {

// Grid (B*H, ceil(Tq / (64 MT))), kThreads threads, forward_smem<D, MT>() bytes. Each warp
// owns MT m-tiles of 16 query rows: MT = 1 is the 16-row kernel (a block of 64 rows), MT = 2
// the 32-row one (TNT_FUSED_ATTENTION_ROWS=32: a block of 128 rows, each k and v fragment
// read from shared memory feeding two products; depths up to 64, attention_fused.hpp).
// Warp w holds block rows [16 MT w, 16 MT (w + 1)), all inside one 64-row query tile, so
// its m-tile mt is what warp slot (MT w + mt) % 4 of 64-row tile qt holds in the 16-row
// kernel. Per row, the MT = 2 kernel does what the MT = 1 kernel does, operation for
// operation and in the same order: the same key tiles (a warp visits the key tiles of its
// own 64-row tile, not the block's: fused_attention_key_end), the same products with the
// same fragments accumulated in the same order (mma_abt_mt / mma_abt_mt_smem, pack_a and
// mma_xb_mt: the same mma.sync on the same values, q fragments read again from shared
// memory being the same values as held ones), the same masks, shuffles within the row's 4
// lanes, online-softmax updates (the same float expressions) and dropout words. So o, the
// statistics and the keep bits (stored at the 16-row kernel's words) are the same bits;
// the test "32 query rows per warp give the bits of 16" holds the kernels to it. (MT = 1
// compiles to the same PTX as the 16-row kernel had before MT existed.)
template <typename T, int D, int MT>
__global__ void __launch_bounds__(kThreads) fused_forward_kernel(FusedParams p) {
#ifdef TNT_FUSED_ATTENTION_UNSUPPORTED
  __trap();
#else
  static_assert(MT == 1 || MT == 2, "a warp's rows lie in one 64-row tile");
  constexpr int kN = kTile / 8;  // C tiles of a score row block (64 keys)
  constexpr int kTileElems = kTile * Ld<D>::h;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_t = reinterpret_cast<T*>(smem);  // (64 MT, D) q * scale
  T* kv_t = q_t + MT * kTileElems;      // buffer u: k at kv_t + 2u tiles, v at kv_t + (2u + 1) tiles
  uint8_t* pads = reinterpret_cast<uint8_t*>(kv_t + 4 * kTileElems);  // buffer u: (64) at pads + 64u

  const int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * (MT * kTile);
  const int64_t tq = p.tq, tk = p.tk, row_stride = p.heads * p.d;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, w0 = warp * 16 * MT;
  const int g = lane >> 2, t4 = lane & 3;
  const bool dropout = p.rate > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - p.rate) : 1.0f;
  // This warp's 64-row query tile (its index among all of them, for the keep words).
  // (Terms that are constant with MT = 1 are written so: its code is then the 16-row kernel's
  // as it was before the variant, instruction for instruction.)
  const int64_t q_tile = static_cast<int64_t>(blockIdx.y) * MT + (MT == 1 ? 0 : (MT * warp) / kWarps);
  // A warp of a block's second tile past Tq has no rows (MT = 2 only): it only helps load.
  const bool live = MT == 1 || q_tile * kTile < tq;
  int64_t rows[MT][2];  // this lane's two query rows of each m-tile
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    rows[mt][0] = q0 + w0 + 16 * mt + g;
    rows[mt][1] = q0 + w0 + 16 * mt + g + 8;
  }
  // Causal without padding and Tq <= Tk: key tiles past the last row's bound hold only
  // hidden keys, whose probabilities are exactly 0 (attention_fused.hpp). The block loads
  // the key tiles up to its last row's bound; a warp works on those up to its own tile's
  // (the 16-row kernel's bound for these rows: with MT = 1 the two are the same).
  const int64_t k_end = MT == 1 ? fused_attention_key_end(p.skip_causal, q0, tq, tk)
                                : fused_attention_block_key_end(p.skip_causal, q0, MT * kTile, tq, tk);
  const int64_t k_end_warp =
      MT == 1 ? k_end : live ? fused_attention_key_end(p.skip_causal, q_tile * kTile, tq, tk) : 0;
  auto stage = [&](int64_t k0, int u) { stage_key_tile<T, D>(p, b, h, k0, kv_t, pads, u); };

  stage(0, 0);
  cp_async_commit();
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (MT == 1 || q0 + i * kTile < tq) {
      load_head_tile<T, D>(p, p.q, b, h, tq, q0 + i * kTile, q_t + i * kTileElems, p.scale, true);
    }
  }
  __syncthreads();
  // The q fragments stay in registers, except with MT = 2 at D = 64, where they are read
  // from shared memory at each key tile: 32 registers fewer (no spills), for 8 ldmatrix per
  // key tile where k and v take 32.
  constexpr bool kQInRegs = MT == 1 || D <= 32;
  uint32_t qf[MT][kQInRegs ? D / 16 : 1][4];
  if constexpr (kQInRegs) {
    if (live) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) load_a_rows<T, D>(qf[mt], q_t, w0 + 16 * mt, lane);
    }
  }
  float acc[MT][D / 8][4];
  float row_m[MT][2], row_l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
    row_m[mt][0] = row_m[mt][1] = -INFINITY;
    row_l[mt][0] = row_l[mt][1] = 0.0f;
  }
  for (int64_t k0 = 0, it = 0; k0 < k_end; k0 += kTile, ++it) {
    const int u = static_cast<int>(it & 1);
    // The next tile loads while this one is used; its buffer was last read before the
    // barrier that ended the previous iteration.
    if (k0 + kTile < k_end) stage(k0 + kTile, 1 - u);
    cp_async_commit();  // (an empty group at the last tile)
    cp_async_wait<1>();  // this tile's group is complete
    __syncthreads();
    if (k0 < k_end_warp) {  // warp-uniform
      const T* k_t = kv_t + 2 * u * kTileElems;
      const T* v_t = kv_t + (2 * u + 1) * kTileElems;
      const uint8_t* pad = pads + u * kTile;
      const bool no_padding = p.ids == nullptr || warp_no_padding(pad, lane);
      // S (this warp's MT x 16 rows, 64 keys) = Q K^T, in registers
      float s[MT][kN][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int n = 0; n < kN; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
      }
      if constexpr (kQInRegs) {
        mma_abt_mt<T, D, MT>(s, qf, k_t, lane);
      } else {
        mma_abt_mt_smem<T, D, MT>(s, q_t, w0, k_t, lane);
      }
      // (MT = 2) P of each m-tile rounded to T once its softmax is done: half the registers.
      uint32_t pf[MT][kTile / 16][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float mx[2] = {-INFINITY, -INFINITY};
        const int64_t first_row = q0 + w0 + 16 * mt;  // warp-uniform
        if (plain_scores(p, first_row, first_row + 15, k0 + kTile - 1, no_padding)) {
#pragma unroll
          for (int n = 0; n < kN; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
          }
        } else {
#pragma unroll
          for (int n = 0; n < kN; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = n * 8 + 2 * t4 + (e & 1);
              const int64_t j = k0 + c;
              s[mt][n][e] = j < tk ? biased(p, s[mt][n][e], pad[c] != 0, rows[mt][e >> 1], j) : -INFINITY;
              mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
            }
          }
        }
        float m_new[2], sum[2] = {0.0f, 0.0f};
        uint32_t keep_word = 0;  // this lane's word of the tile's keep bits (word `lane` of the warp slot)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // A row's 64 columns lie with the 4 lanes of its group (lanes 4g..4g+3).
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          m_new[r] = fmaxf(row_m[mt][r], mx[r]);  // finite: key k0 < Tk is in the tile
        }
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          uint32_t words[4] = {0, 0, 0, 0};
          if (dropout) keep_words8(p, bh, rows[mt][0], rows[mt][1], k0 + n * 8, lane, words);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            const float ex = __expf(s[mt][n][e] - m_new[r]);  // 0 past Tk
            sum[r] += ex;
            float pd = ex;
            // (Nothing is kept where nothing is there to keep: a zero probability, or a row
            // past Tq; the backward's probability is 0 there too.)
            if (dropout) {
              const bool keep = ex != 0.0f && rows[mt][r] < tq && philox::word_uniform(words[e]) >= p.rate;
              pd = keep ? ex * keep_scale : 0.0f;
              const uint32_t word = __ballot_sync(0xffffffffu, keep);
              if (lane == n * 4 + e) keep_word = word;
            }
            s[mt][n][e] = pd;
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
          sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
          const float corr = __expf(row_m[mt][r] - m_new[r]);  // 0 on the first tile (m = -inf)
          row_m[mt][r] = m_new[r];
          row_l[mt][r] = row_l[mt][r] * corr + sum[r];
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            acc[mt][n][2 * r] *= corr;
            acc[mt][n][2 * r + 1] *= corr;
          }
        }
        // The ballots of m-tile mt have the 16-row kernel's layout for these 16 rows: they
        // go to its warp slot's words of tile pair (q_tile, key tile).
        if (dropout) {
          const int slot = MT == 1 ? warp : (MT * warp + mt) % kWarps;
          keep_words(p, bh, q_tile, k0 / kTile)[slot * kWarp + lane] = keep_word;
        }
        if constexpr (MT > 1) pack_a<T>(pf[mt], s[mt]);
      }
      // O (MT x 16, D) += P (MT x 16, 64) V (64, D)
      if constexpr (MT == 1) {
        mma_xb<T, D>(acc[0], s[0], v_t, lane);
      } else {
        mma_xb_mt<T, D, MT>(acc, pf, v_t, lane);
      }
    }
    __syncthreads();  // buffer u is free for the load two tiles on
  }
  T* o = static_cast<T*>(p.out);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = rows[mt][r];
      if (i >= tq) continue;
      const float inv = 1.0f / row_l[mt][r];
      T* orow = o + (b * tq + i) * row_stride + h * p.d;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int c = n * 8 + 2 * t4;
        if (c < p.d)
          *reinterpret_cast<uint32_t*>(orow + c) = pack2<T>(acc[mt][n][2 * r] * inv, acc[mt][n][2 * r + 1] * inv);
      }
      if (t4 == 0) {
        p.stats[(bh * tq + i) * 2] = row_m[mt][r];
        p.stats[(bh * tq + i) * 2 + 1] = inv;
      }
    }
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
  p.keep = nullptr;
  p.ds = nullptr;
  p.q_tiles = (a.tq + kTile - 1) / kTile;
  p.k_tiles = (a.tk + kTile - 1) / kTile;
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
                             const AttentionCoreArgs& a, Tensor& o, Tensor& stats, Tensor& keep, int device,
                             int64_t warp_rows) {
  TNT_CHECK(warp_rows == 16 || warp_rows == 32, "fused attention: {} query rows per warp asked; 16 or 32 run",
            warp_rows);
  const int64_t B = a.batch, H = a.heads, Tq = a.tq, D = a.heads * a.depth;
  const DType dt = q.dtype();
  o = Tensor::empty({B, Tq, D}, dt, q.device());
  stats = Tensor::empty({B, H, Tq, 2}, DType::f32, q.device());
  FusedParams p = make_params(q, k, v, key_ids, a);
  p.out = o.raw();
  p.stats = static_cast<float*>(stats.raw());
  keep = Tensor();
  if (a.rate > 0.0f) {
    // Words of every tile pair; those of key tiles a causal query tile skips stay unwritten
    // and unread (the backward skips the same tiles).
    keep = Tensor::empty({B * H * p.q_tiles * p.k_tiles * kWarps * kWarp}, DType::i32, q.device());
    p.keep = static_cast<uint32_t*>(keep.raw());
  }
  // The keep words stay in 64-row query tiles (p.q_tiles) whichever kernel runs: the
  // backward reads them so.
  const bool two = fused_attention_forward_rows(warp_rows, a.depth) == 32;
  const int64_t block_rows = two ? 2 * kTile : kTile;
  const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>((Tq + block_rows - 1) / block_rows));
  TNT_FUSED_DISPATCH(dt, a.depth, {
    // Depth 128: the 16-row kernel only (fused_attention_forward_rows; `two` is false).
    constexpr int kMT = kD <= 64 ? 2 : 1;
    if (two) {
      launch(fused_forward_kernel<scalar_t, kD, kMT>, grid, forward_smem<kD, kMT>(), device, p);
    } else {
      launch(fused_forward_kernel<scalar_t, kD, 1>, grid, forward_smem<kD>(), device, p);
    }
  });
}

void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                              const Tensor& o, const Tensor& stats, const Tensor& keep, const Tensor& d_o,
                              const AttentionCoreArgs& a, Tensor& dq, Tensor& dk, Tensor& dv, int device) {
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
  Tensor qs = Tensor::empty({B, Tq, D}, dt, dev);  // q * scale, for the dK/dV kernel
  p.qs = qs.raw();
  if (a.rate > 0.0f) {
    TNT_CHECK(keep.defined() && keep.numel() == B * H * p.q_tiles * p.k_tiles * kWarps * kWarp,
              "fused attention backward: the forward's dropout bits are missing ({})", keep.str());
    p.keep = static_cast<uint32_t*>(const_cast<void*>(keep.raw()));
  }
  const int64_t rows = B * H * Tq;
  const unsigned row_grid = static_cast<unsigned>((rows + kBlock / kWarp - 1) / (kBlock / kWarp));
  const dim3 key_grid(static_cast<unsigned>(B * H), static_cast<unsigned>((Tk + kTile - 1) / kTile));
  const dim3 query_grid(static_cast<unsigned>(B * H), static_cast<unsigned>((Tq + kTile - 1) / kTile));
  // TNT_FUSED_ATTENTION_STORED_DS: the dK/dV kernel keeps dS (B*H x Tq x Tk, whole tiles,
  // in T: 268 MB at Transformer-big's 128 x 256 tokens) for the dQ kernel, freed at the end
  // of this call (the kernels are queued on the compute stream before it).
  Tensor ds;
  if (tnt::config().fused_attention_stored_ds) {
    ds = Tensor::empty({B * H * p.q_tiles * kTile * p.k_tiles * kTile}, dt, dev);
    p.ds = ds.raw();
  }
  TNT_FUSED_DISPATCH(dt, a.depth, {
    fused_delta_kernel<scalar_t><<<row_grid, kBlock, 0, compute_stream(device)>>>(p, rows);
    TNT_CUDA_CHECK_LAUNCH();
    FusedParams pk = p;
    pk.out = dk.raw();
    pk.out2 = dv.raw();
    launch(fused_dkdv_kernel<scalar_t, kD>, key_grid, dkdv_smem<kD>(), device, pk);
    FusedParams pq = p;
    pq.out = dq.raw();
    if (pq.ds != nullptr) {
      launch(fused_dq_stored_kernel<scalar_t, kD>, query_grid, dq_stored_smem<kD>(), device, pq);
    } else {
      launch(fused_dq_kernel<scalar_t, kD>, query_grid, dq_smem<kD>(), device, pq);
    }
  });
}

}  // namespace tnt::cuda
