// The attention core on CUDA (semantics in attention_cuda.hpp): head split/merge kernels,
// cuBLAS strided batched products over the B*H heads, and one fused kernel (a warp per row
// of logits, held in registers up to 1,024 keys) for bias + softmax + dropout, and one for
// its backward. The dropout mask is not stored: the backward draws it again from the same
// Philox counters. Incremental decoding runs the same core; its cache update is one copy
// kernel (cache_append_kernel).
// With TNT_FUSED_ATTENTION on, bf16/f16 cores of depth 16..128 run the fused engine
// (attention_fused_cuda.cu) instead: no (B, H, Tq, Tk) tensors at all. With
// TNT_CUDNN_ATTENTION on, cores cuDNN's flash attention serves run it instead
// (attention_cudnn_cuda.cpp); shapes whose cuDNN graph does not build warn once and fall back.
// At auto (the default) a shape runs cuDNN where its first use's trial found it agreeing and
// faster (attention_trial_cuda.hpp).
#include "layers/attention_cuda.hpp"

#include "core/philox.hpp"
#include "layers/attention_cudnn_cuda.hpp"
#include "layers/attention_fused.hpp"
#include "layers/attention_fused_cuda.hpp"
#include "layers/attention_trial_cuda.hpp"
#include "layers/gemm_cuda.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <cstdint>

namespace tnt::cuda {

namespace {

constexpr float kMaskBias = -1e9f;
constexpr int kRowsPerBlock = kBlock / kWarp;

struct CudaCore {
  AttentionCoreArgs args;
  DType dtype = DType::f32;
  bool fused = false;
  // Unfused engine:
  Tensor qh, kh, vh;  // (B, H, Tq, d) scaled, (B, H, Tk, d) x2, in dtype
  Tensor p, pd;       // (B, H, Tq, Tk) in dtype; pd is p without dropout
  // Fused engine: the inputs themselves (held, not copied), the output and per row (B, H,
  // Tq, 2) its max logit and 1 / sum (attention_fused_cuda.hpp).
  Tensor q, k, v, key_ids, o, stats, keep;
  // cuDNN engine: q, k, v, o as above (held), and what its forward saved.
  bool cudnn = false;
  CudnnAttentionSaved saved;
};

std::atomic<int64_t> fused_calls{0};
std::atomic<int64_t> cudnn_calls{0};

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0; }

// Shapes (CudnnAttentionKey::str, by device) whose cuDNN forward failed to run under the
// knob: they take the other engines from then on (see the forward).
std::mutex cudnn_failed_mu;
std::set<std::pair<int, std::string>> cudnn_failed;

bool cudnn_failed_before(int device, const std::string& key) {
  std::lock_guard<std::mutex> lock(cudnn_failed_mu);
  return cudnn_failed.count({device, key}) > 0;
}

// The engine choice (see AttentionEngine): the fused kernels load 16 bytes at a time, so
// the tensors must start 16-byte aligned (allocations are; an odd view falls back).
bool use_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCoreArgs& a, AttentionEngine engine,
               int device) {
  if (engine == AttentionEngine::unfused) return false;
  if (engine == AttentionEngine::config && !tnt::config().fused_attention) return false;
  return fused_attention_applies(q.dtype(), a.batch, a.heads, a.tq, a.tk, a.depth) &&
         q.numel() == a.batch * a.tq * a.heads * a.depth && k.numel() == a.batch * a.tk * a.heads * a.depth &&
         v.numel() == k.numel() && aligned16(q) && aligned16(k) && aligned16(v) &&
         fused_attention_fits(a.depth, device);
}

// Whether the cuDNN engine runs this core (see AttentionEngine). Its graphs are built (and
// cached) here, before anything runs, so that a shape cuDNN refuses can still take the other
// engines: under TNT_CUDNN_ATTENTION=1 with one warning per shape naming cuDNN's reason (at
// auto, an info line: cuDNN was only a candidate); when a test forces AttentionEngine::cudnn,
// never (it throws that reason). At auto (not in deterministic mode: cuDNN's backward sums dQ
// with atomics) the shape's trial decides (attention_trial_cuda.hpp).
bool use_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids, const AttentionCoreArgs& a,
               AttentionEngine engine, int device, std::string& key_str) {
  const bool forced = engine == AttentionEngine::cudnn;
  const AutoSwitch mode = tnt::config().cudnn_attention;
  if (!forced) {
    if (engine != AttentionEngine::config || mode.off()) return false;
    if (mode.automatic() && tnt::config().deterministic) return false;
  }
  const bool applies = cudnn_attention_applies(q.dtype(), a.batch, a.heads, a.tq, a.tk, a.depth, a.causal) &&
                       q.numel() == a.batch * a.tq * a.heads * a.depth &&
                       k.numel() == a.batch * a.tk * a.heads * a.depth && v.numel() == k.numel() && aligned16(q) &&
                       aligned16(k) && aligned16(v);
  if (!applies) {
    TNT_CHECK(!forced, "MultiHeadAttention: the cuDNN engine does not apply to q {}, k {} (depth {}, causal {})",
              q.str(), k.str(), a.depth, a.causal);
    return false;
  }
  CudnnAttentionKey key;
  key.batch = a.batch;
  key.tq = a.tq;
  key.tk = a.tk;
  key.heads = a.heads;
  key.depth = a.depth;
  key.dtype = q.dtype();
  key.causal = a.causal;
  key.bias = key_ids.defined();
  key.rate = a.rate;
  key.scale = a.scale;
  key_str = key.str();
  if (!forced && cudnn_failed_before(device, key_str)) return false;
  bool prepared = false;
  try {
    prepared = cudnn_attention_prepare(key, device, !forced);
  } catch (const std::exception& e) {
    if (forced) throw;
    {
      // Not asked again at every forward of this shape (auto makes this common: a cuDNN
      // older than 9.16 refuses every shape).
      std::lock_guard<std::mutex> lock(cudnn_failed_mu);
      cudnn_failed.insert({device, key_str});
    }
    static std::mutex mu;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(key.str()).second) {
      const char* other = tnt::config().fused_attention ? "fused (where it applies) or unfused" : "unfused";
      if (mode.automatic()) {
        log_info("MultiHeadAttention: TNT_CUDNN_ATTENTION=auto: cuDNN cannot run {} ({}); using the {} engine",
                 key.str(), e.what(), other);
      } else {
        log_warning("MultiHeadAttention: TNT_CUDNN_ATTENTION: cuDNN cannot run {} ({}); using the {} engine",
                    key.str(), e.what(), other);
      }
    }
    return false;
  }
  if (!prepared || forced || !mode.automatic()) return prepared;
  return attention_auto_uses_cudnn(q, k, key_ids, a, key, use_fused(q, k, v, a, AttentionEngine::config, device),
                                   device);
}

// (B, T, H*d) -> (B, H, T, d), times s.
template <typename T>
__global__ void split_heads_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t b, int64_t t, int64_t h,
                                   int64_t d, float s) {
  TNT_KERNEL_LOOP(i, b * t * h * d) {
    const int64_t j = i % d, ti = (i / d) % t, hi = (i / (d * t)) % h, bi = i / (d * t * h);
    dst[i] = from_float<T>(to_float(src[(bi * t + ti) * h * d + hi * d + j]) * s);
  }
}

// (B, H, T, d) -> (B, T, H*d), times s.
template <typename T>
__global__ void merge_heads_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t b, int64_t t, int64_t h,
                                   int64_t d, float s) {
  TNT_KERNEL_LOOP(i, b * t * h * d) {
    const int64_t j = i % d, hi = (i / d) % h, ti = (i / (d * h)) % t, bi = i / (d * h * t);
    dst[i] = from_float<T>(to_float(src[((bi * h + hi) * t + ti) * d + j]) * s);
  }
}

// Logit j of row r (batch row b, query i) with its bias: -1e9 added where key j is padding
// or, when causal, in the query's future.
template <typename I>
__device__ __forceinline__ float biased_logit(const float* lr, const I* ids, int64_t b, int64_t i, int64_t j,
                                              const AttentionCoreArgs& a) {
  const bool masked = (ids != nullptr && ids[b * a.tk + j] == 0) || (a.causal && j > i + (a.tk - a.tq));
  return masked ? lr[j] + kMaskBias : lr[j];
}

// One warp per row r of the logits (B*H*Tq rows of Tk): bias, softmax in float, dropout.
template <typename T, typename I>
__global__ void softmax_forward_kernel(const float* __restrict__ logits,  // (R, Tk)
                                       const I* __restrict__ ids,         // (B, Tk) or null
                                       T* __restrict__ p,                 // (R, Tk)
                                       T* __restrict__ pd,                // (R, Tk) or null (no dropout)
                                       AttentionCoreArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t rows = a.batch * a.heads * a.tq;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int64_t tk = a.tk, b = r / (a.heads * a.tq), i = r % a.tq;
  const float* lr = logits + r * tk;
  auto biased = [&](int64_t j) { return biased_logit(lr, ids, b, i, j, a); };
  float mx = -INFINITY;
  for (int64_t j = lane; j < tk; j += kWarp) mx = fmaxf(mx, biased(j));
  mx = warp_max(mx);
  float total = 0.0f;
  for (int64_t j = lane; j < tk; j += kWarp) total += __expf(biased(j) - mx);
  const float inv = 1.0f / warp_sum(total);
  const float keep_scale = 1.0f / (1.0f - a.rate);
  for (int64_t j = lane; j < tk; j += kWarp) {
    const float v = __expf(biased(j) - mx) * inv;
    p[r * tk + j] = from_float<T>(v);
    if (pd != nullptr) {
      const bool kept = philox::uniform4(a.key, a.base + static_cast<uint64_t>(r * tk + j)) >= a.rate;
      pd[r * tk + j] = from_float<T>(kept ? v * keep_scale : 0.0f);
    }
  }
}

// The same for rows of Tk <= K * 32 keys, each lane keeping its K values in registers:
// the row is read once instead of three times, and the results are the kernel's above bit
// for bit (the same lanes sum the same terms in the same order; exp is taken once per
// element and kept instead of being taken again).
template <typename T, typename I, int K>
__global__ void softmax_forward_rows_kernel(const float* __restrict__ logits,  // (R, Tk)
                                            const I* __restrict__ ids,         // (B, Tk) or null
                                            T* __restrict__ p,                 // (R, Tk)
                                            T* __restrict__ pd,                // (R, Tk) or null (no dropout)
                                            AttentionCoreArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t rows = a.batch * a.heads * a.tq;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int64_t tk = a.tk, b = r / (a.heads * a.tq), i = r % a.tq;
  const float* lr = logits + r * tk;
  float e[K];
  float mx = -INFINITY;
#pragma unroll
  for (int t = 0; t < K; ++t) {
    const int64_t j = lane + t * kWarp;
    e[t] = -INFINITY;
    if (j < tk) {
      e[t] = biased_logit(lr, ids, b, i, j, a);
      mx = fmaxf(mx, e[t]);
    }
  }
  mx = warp_max(mx);
  float total = 0.0f;
#pragma unroll
  for (int t = 0; t < K; ++t) {
    if (lane + t * kWarp < tk) {
      e[t] = __expf(e[t] - mx);
      total += e[t];
    }
  }
  const float inv = 1.0f / warp_sum(total);
  const float keep_scale = 1.0f / (1.0f - a.rate);
#pragma unroll
  for (int t = 0; t < K; ++t) {
    const int64_t j = lane + t * kWarp;
    if (j >= tk) continue;
    const float v = e[t] * inv;
    p[r * tk + j] = from_float<T>(v);
    if (pd != nullptr) {
      const bool kept = philox::uniform4(a.key, a.base + static_cast<uint64_t>(r * tk + j)) >= a.rate;
      pd[r * tk + j] = from_float<T>(kept ? v * keep_scale : 0.0f);
    }
  }
}

// dl = p (dp - sum_j dp_j p_j), dp = dpd through the dropout mask (drawn again).
template <typename T>
__global__ void softmax_backward_kernel(const float* __restrict__ dpd,  // (R, Tk)
                                        const T* __restrict__ p,        // (R, Tk)
                                        T* __restrict__ dl,             // (R, Tk)
                                        AttentionCoreArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t rows = a.batch * a.heads * a.tq;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int64_t tk = a.tk;
  const bool dropout = a.rate > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - a.rate) : 1.0f;
  auto dp = [&](int64_t j) {
    const float g = dpd[r * tk + j];
    if (!dropout) return g;
    return philox::uniform4(a.key, a.base + static_cast<uint64_t>(r * tk + j)) >= a.rate ? g * keep_scale : 0.0f;
  };
  float dot = 0.0f;
  for (int64_t j = lane; j < tk; j += kWarp) dot += dp(j) * to_float(p[r * tk + j]);
  dot = warp_sum(dot);
  for (int64_t j = lane; j < tk; j += kWarp) {
    const float pj = to_float(p[r * tk + j]);
    dl[r * tk + j] = from_float<T>(pj * (dp(j) - dot));
  }
}

// The backward for rows of Tk <= K * 32 keys from registers: dpd, p and the mask are read
// (drawn) once instead of twice, with softmax_backward_kernel's bits.
template <typename T, int K>
__global__ void softmax_backward_rows_kernel(const float* __restrict__ dpd,  // (R, Tk)
                                             const T* __restrict__ p,        // (R, Tk)
                                             T* __restrict__ dl,             // (R, Tk)
                                             AttentionCoreArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t rows = a.batch * a.heads * a.tq;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int64_t tk = a.tk;
  const bool dropout = a.rate > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - a.rate) : 1.0f;
  float dp[K], pj[K];
  float dot = 0.0f;
#pragma unroll
  for (int t = 0; t < K; ++t) {
    const int64_t j = lane + t * kWarp;
    dp[t] = 0.0f;
    pj[t] = 0.0f;
    if (j < tk) {
      const float g = dpd[r * tk + j];
      dp[t] = !dropout ? g
                       : (philox::uniform4(a.key, a.base + static_cast<uint64_t>(r * tk + j)) >= a.rate ? g * keep_scale
                                                                                                      : 0.0f);
      pj[t] = to_float(p[r * tk + j]);
      dot += dp[t] * pj[t];
    }
  }
  dot = warp_sum(dot);
#pragma unroll
  for (int t = 0; t < K; ++t) {
    const int64_t j = lane + t * kWarp;
    if (j < tk) dl[r * tk + j] = from_float<T>(pj[t] * (dp[t] - dot));
  }
}

// Registers per lane for rows of tk keys: 8, 16 or 32 values (tk <= 1024), else 0 (the
// kernels that read the row again).
int row_values(int64_t tk) { return tk <= 8 * kWarp ? 8 : tk <= 16 * kWarp ? 16 : tk <= 32 * kWarp ? 32 : 0; }

template <typename T>
void heads(bool split, const Tensor& src, const Tensor& dst, int64_t b, int64_t t, int64_t h, int64_t d, float s,
           int device) {
  const int64_t n = b * t * h * d;
  if (n == 0) return;
  if (split) {
    split_heads_kernel<T><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
        static_cast<const T*>(src.raw()), static_cast<T*>(dst.raw()), b, t, h, d, s);
  } else {
    merge_heads_kernel<T><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
        static_cast<const T*>(src.raw()), static_cast<T*>(dst.raw()), b, t, h, d, s);
  }
  TNT_CUDA_CHECK_LAUNCH();
}

// out (B, T + 1, D): out[b, t, :] = old[parents[b], t, :] for t < T, fresh[b, 0, :] at t = T.
// One thread per output element; parents were checked on the host to lie in [0, B0).
template <typename E>
__global__ void cache_append_kernel(const E* __restrict__ old,            // (B0, T, D)
                                    const int64_t* __restrict__ parents,  // (B)
                                    const E* __restrict__ fresh,          // (B, 1, D)
                                    E* __restrict__ out,                  // (B, T + 1, D)
                                    int64_t b, int64_t t, int64_t d) {
  TNT_KERNEL_LOOP(i, b * (t + 1) * d) {
    const int64_t j = i % d, ti = (i / d) % (t + 1), bi = i / (d * (t + 1));
    out[i] = ti < t ? old[(parents[bi] * t + ti) * d + j] : fresh[bi * d + j];
  }
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

Tensor attention_core_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                              const AttentionCoreArgs& a, std::shared_ptr<void>& state, AttentionEngine engine) {
  // The ids too: host ids would be read by the kernels as device memory.
  int device = key_ids.defined() ? common_device({&q, &k, &v, &key_ids}, "MultiHeadAttention")
                                 : common_device({&q, &k, &v}, "MultiHeadAttention");
  const DType dt = q.dtype();
  TNT_CHECK(k.dtype() == dt && v.dtype() == dt, "MultiHeadAttention: q {}, k {}, v {} of different dtypes", q.str(),
            k.str(), v.str());
  auto s = std::make_shared<CudaCore>();
  s->args = a;
  s->dtype = dt;
  std::string cudnn_key;
  if (use_cudnn(q, k, v, key_ids, a, engine, device, cudnn_key)) {
    try {
      s->o = cudnn_attention_forward(q, k, v, key_ids, a, s->saved, device);
      s->cudnn = true;
      s->q = q;
      s->k = k;
      s->v = v;
      ++cudnn_calls;
      state = s;
      return s->o;
    } catch (const Error& e) {
      // A plan that built but does not run (a status from cuDNN's execute; a fault of the
      // device itself makes every later call fail anyway): under the knob this shape takes
      // the other engines from now on, with one warning; a forced engine (tests) fails.
      if (engine == AttentionEngine::cudnn) throw;
      {
        std::lock_guard<std::mutex> lock(cudnn_failed_mu);
        cudnn_failed.insert({device, cudnn_key});
      }
      log_warning("MultiHeadAttention: TNT_CUDNN_ATTENTION: cuDNN's forward failed to run {} ({}); this shape uses "
                  "the {} engine from now on (TNT_CUDNN_ATTENTION=0 keeps cuDNN out everywhere)",
                  cudnn_key, e.what(), tnt::config().fused_attention ? "fused (where it applies) or unfused" : "unfused");
      s->saved = CudnnAttentionSaved{};
    }
  }
  if (use_fused(q, k, v, a, engine, device)) {
    s->fused = true;
    s->q = q;
    s->k = k;
    s->v = v;
    s->key_ids = key_ids;
    fused_attention_forward(q, k, v, key_ids, a, s->o, s->stats, s->keep, device, tnt::config().fused_attention_rows);
    ++fused_calls;
    state = s;
    return s->o;
  }
  const int64_t B = a.batch, H = a.heads, Tq = a.tq, Tk = a.tk, d = a.depth, D = H * d;
  const Device dev = q.device();
  s->qh = Tensor::empty({B, H, Tq, d}, dt, dev);
  s->kh = Tensor::empty({B, H, Tk, d}, dt, dev);
  s->vh = Tensor::empty({B, H, Tk, d}, dt, dev);
  Tensor logits = Tensor::empty({B, H, Tq, Tk}, DType::f32, dev);
  s->p = Tensor::empty({B, H, Tq, Tk}, dt, dev);
  s->pd = a.rate > 0.0f ? Tensor::empty({B, H, Tq, Tk}, dt, dev) : s->p;
  Tensor oh = Tensor::empty({B, H, Tq, d}, dt, dev);
  Tensor o = Tensor::empty({B, Tq, D}, dt, dev);
  const int64_t rows = B * H * Tq;
  TNT_CUDA_DISPATCH_FLOAT(dt, "MultiHeadAttention", {
    heads<scalar_t>(true, q, s->qh, B, Tq, H, d, a.scale, device);
    heads<scalar_t>(true, k, s->kh, B, Tk, H, d, 1.0f, device);
    heads<scalar_t>(true, v, s->vh, B, Tk, H, d, 1.0f, device);
    // logits (B*H, Tq, Tk) = qh kh^T, f32
    gemm_rm(device, dt, DType::f32, false, true, Tq, Tk, d, 1.0f, s->qh.raw(), Tq * d, s->kh.raw(), Tk * d, 0.0f,
            logits.raw(), Tq * Tk, B * H);
    if (rows > 0 && Tk > 0) {
      auto* pd = a.rate > 0.0f ? static_cast<scalar_t*>(s->pd.raw()) : nullptr;
      const float* lp = static_cast<const float*>(logits.raw());
      auto* pp = static_cast<scalar_t*>(s->p.raw());
      auto launch = [&](auto* ids) {
        using I = std::remove_cv_t<std::remove_pointer_t<decltype(ids)>>;
        cudaStream_t st = compute_stream(device);
        switch (row_values(Tk)) {
          case 8:
            softmax_forward_rows_kernel<scalar_t, I, 8><<<row_blocks(rows), kBlock, 0, st>>>(lp, ids, pp, pd, a);
            break;
          case 16:
            softmax_forward_rows_kernel<scalar_t, I, 16><<<row_blocks(rows), kBlock, 0, st>>>(lp, ids, pp, pd, a);
            break;
          case 32:
            softmax_forward_rows_kernel<scalar_t, I, 32><<<row_blocks(rows), kBlock, 0, st>>>(lp, ids, pp, pd, a);
            break;
          default:
            softmax_forward_kernel<scalar_t, I><<<row_blocks(rows), kBlock, 0, st>>>(lp, ids, pp, pd, a);
        }
      };
      if (key_ids.defined()) {
        TNT_CUDA_DISPATCH_LABEL(key_ids.dtype(), "MultiHeadAttention",
                                { launch(static_cast<const label_t*>(key_ids.raw())); });
      } else {
        launch(static_cast<const int64_t*>(nullptr));
      }
      TNT_CUDA_CHECK_LAUNCH();
    }
    // oh (B*H, Tq, d) = pd vh
    gemm_rm(device, dt, dt, false, false, Tq, d, Tk, 1.0f, s->pd.raw(), Tq * Tk, s->vh.raw(), Tk * d, 0.0f, oh.raw(),
            Tq * d, B * H);
    heads<scalar_t>(false, oh, o, B, Tq, H, d, 1.0f, device);
  });
  state = s;
  return o;
}

void attention_core_backward(const Tensor& d_o, const std::shared_ptr<void>& state, Tensor& dq, Tensor& dk,
                             Tensor& dv) {
  const auto& s = *static_cast<const CudaCore*>(state.get());
  const AttentionCoreArgs& a = s.args;
  const DType dt = s.dtype;
  int device = common_device({&d_o, s.fused || s.cudnn ? &s.q : &s.qh}, "MultiHeadAttention backward");
  const int64_t B = a.batch, H = a.heads, Tq = a.tq, Tk = a.tk, d = a.depth, D = H * d;
  TNT_CHECK(d_o.numel() == B * Tq * D && d_o.dtype() == dt, "MultiHeadAttention: gradient {} for ({}, {}, {}) {}",
            d_o.str(), B, Tq, D, dtype_name(dt));
  if (s.cudnn) {
    // cuDNN was promised 16-byte aligned tensors (the graph's byte alignment).
    const Tensor g = aligned16(d_o) ? d_o : d_o.clone();
    cudnn_attention_backward(s.q, s.k, s.v, s.o, g, s.saved, a, dq, dk, dv, device);
    ++cudnn_calls;
    return;
  }
  if (s.fused) {
    // The gradient may be a view at any offset: the fused kernels need 16-byte alignment.
    const Tensor g = aligned16(d_o) ? d_o : d_o.clone();
    fused_attention_backward(s.q, s.k, s.v, s.key_ids, s.o, s.stats, s.keep, g, a, dq, dk, dv, device);
    ++fused_calls;
    return;
  }
  const Device dev = d_o.device();
  Tensor doh = Tensor::empty({B, H, Tq, d}, dt, dev);
  Tensor dvh = Tensor::empty({B, H, Tk, d}, dt, dev);
  Tensor dpd = Tensor::empty({B, H, Tq, Tk}, DType::f32, dev);
  Tensor dl = Tensor::empty({B, H, Tq, Tk}, dt, dev);
  Tensor dqh = Tensor::empty({B, H, Tq, d}, dt, dev);
  Tensor dkh = Tensor::empty({B, H, Tk, d}, dt, dev);
  dq = Tensor::empty({B, Tq, D}, dt, dev);
  dk = Tensor::empty({B, Tk, D}, dt, dev);
  dv = Tensor::empty({B, Tk, D}, dt, dev);
  const int64_t rows = B * H * Tq;
  TNT_CUDA_DISPATCH_FLOAT(dt, "MultiHeadAttention", {
    heads<scalar_t>(true, d_o, doh, B, Tq, H, d, 1.0f, device);
    // dvh (B*H, Tk, d) = pd^T doh
    gemm_rm(device, dt, dt, true, false, Tk, d, Tq, 1.0f, s.pd.raw(), Tq * Tk, doh.raw(), Tq * d, 0.0f, dvh.raw(),
            Tk * d, B * H);
    // dpd (B*H, Tq, Tk) = doh vh^T, f32
    gemm_rm(device, dt, DType::f32, false, true, Tq, Tk, d, 1.0f, doh.raw(), Tq * d, s.vh.raw(), Tk * d, 0.0f,
            dpd.raw(), Tq * Tk, B * H);
    if (rows > 0 && Tk > 0) {
      const auto* gp = static_cast<const float*>(dpd.raw());
      const auto* pp = static_cast<const scalar_t*>(s.p.raw());
      auto* lp = static_cast<scalar_t*>(dl.raw());
      cudaStream_t st = compute_stream(device);
      switch (row_values(Tk)) {
        case 8: softmax_backward_rows_kernel<scalar_t, 8><<<row_blocks(rows), kBlock, 0, st>>>(gp, pp, lp, a); break;
        case 16: softmax_backward_rows_kernel<scalar_t, 16><<<row_blocks(rows), kBlock, 0, st>>>(gp, pp, lp, a); break;
        case 32: softmax_backward_rows_kernel<scalar_t, 32><<<row_blocks(rows), kBlock, 0, st>>>(gp, pp, lp, a); break;
        default: softmax_backward_kernel<scalar_t><<<row_blocks(rows), kBlock, 0, st>>>(gp, pp, lp, a);
      }
      TNT_CUDA_CHECK_LAUNCH();
    }
    // dqh (B*H, Tq, d) = dl kh; dkh (B*H, Tk, d) = dl^T qh (qh carries the scale)
    gemm_rm(device, dt, dt, false, false, Tq, d, Tk, 1.0f, dl.raw(), Tq * Tk, s.kh.raw(), Tk * d, 0.0f, dqh.raw(),
            Tq * d, B * H);
    gemm_rm(device, dt, dt, true, false, Tk, d, Tq, 1.0f, dl.raw(), Tq * Tk, s.qh.raw(), Tq * d, 0.0f, dkh.raw(),
            Tk * d, B * H);
    heads<scalar_t>(false, dqh, dq, B, Tq, H, d, a.scale, device);
    heads<scalar_t>(false, dkh, dk, B, Tk, H, d, 1.0f, device);
    heads<scalar_t>(false, dvh, dv, B, Tk, H, d, 1.0f, device);
  });
}

bool attention_core_fused(const std::shared_ptr<void>& state) {
  return state != nullptr && static_cast<const CudaCore*>(state.get())->fused;
}

int64_t attention_fused_calls() { return fused_calls.load(); }

bool attention_core_cudnn(const std::shared_ptr<void>& state) {
  return state != nullptr && static_cast<const CudaCore*>(state.get())->cudnn;
}

int64_t attention_cudnn_calls() { return cudnn_calls.load(); }

Tensor attention_cache_append(const Tensor& old, const Tensor& parents, const Tensor& fresh) {
  const int device = common_device({&old, &parents, &fresh}, "MultiHeadAttention cache");
  TNT_CHECK(old.ndim() == 3 && fresh.ndim() == 3 && fresh.dim(1) == 1 && fresh.dim(2) == old.dim(2) &&
                fresh.dtype() == old.dtype() && parents.dtype() == DType::i64 && parents.numel() == fresh.dim(0),
            "MultiHeadAttention cache: cannot append {} to {} with parents {}", fresh.str(), old.str(), parents.str());
  const int64_t B = fresh.dim(0), T = old.dim(1), D = old.dim(2);
  Tensor out = Tensor::empty({B, T + 1, D}, old.dtype(), old.device());
  const int64_t n = B * (T + 1) * D;
  if (n == 0) return out;
  TNT_CUDA_DISPATCH_FLOAT(old.dtype(), "MultiHeadAttention cache", {
    cache_append_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
        static_cast<const scalar_t*>(old.raw()), static_cast<const int64_t*>(parents.raw()),
        static_cast<const scalar_t*>(fresh.raw()), static_cast<scalar_t*>(out.raw()), B, T, D);
  });
  TNT_CUDA_CHECK_LAUNCH();
  return out;
}

}  // namespace tnt::cuda
