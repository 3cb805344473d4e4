// The cuDNN flash-attention engine: the two operation graphs, their plan cache, and the
// calls. The graphs follow the node order cudnn-frontend lowers its SDPA node to for sm_90
// (see attention_cudnn_cuda.hpp for why this graph, and for where its results differ).
//
// Layout: our q (B, Tq, H*d) is cuDNN's Q [B, H, Tq, d] with strides [Tq*H*d, d, H*d, 1]
// (likewise k, v, o and the gradients): the heads are a stride, never a copy. The matmul
// nodes take K^T (and V^T in the backward) as a transposed view [B, H, d, Tk] of the same
// memory.
#include "layers/attention_cudnn_cuda.hpp"

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cudnn_graph.hpp"
#include "tarantella/check.hpp"
#include "tarantella/log.hpp"

#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace tnt::cuda {

namespace g = graph;

namespace {

// Non-virtual tensors, by unique id (the variant pack names them so).
enum Uid : int64_t {
  kQ = 1,
  kKT = 2,
  kV = 3,         // forward: V [B, H, Tk, d]; backward: V^T [B, H, d, Tk]
  kO = 4,
  kStats = 5,
  kScale = 6,     // by value
  kBias = 7,
  kSeed = 8,
  kOffset = 9,
  kMaskValue = 10,  // by value: causal's replacement logit
  kDropScale = 11,  // by value: 1 / (1 - rate)
  kDropKeep = 12,   // by value: 1 - rate (backward: the dO.O row sums times it)
  kDO = 13,
  kDQ = 14,
  kDK = 15,
  kDV = 16,
  kSoftmaxSum = 17,  // backward: (B, H, Tq, 1) f32 scratch of ours
  kDQAccum = 18,     // backward: (B, H, Tq, d) f32 scratch of ours, zeroed
  kFirstVirtual = 1000,
};

// One graph's descriptors (graph::GraphParts), virtual uids from kFirstVirtual.
struct GraphParts : g::GraphParts {
  GraphParts() : g::GraphParts(kFirstVirtual) {}
};

g::TensorSpec spec(int64_t uid, const std::string& name, cudnnDataType_t dt, std::vector<int64_t> dims,
                   std::vector<int64_t> strides) {
  g::TensorSpec s;
  s.uid = uid;
  s.name = name;
  s.dtype = dt;
  s.dims = std::move(dims);
  s.strides = std::move(strides);
  return s;
}

g::TensorSpec scalar(int64_t uid, const std::string& name, cudnnDataType_t dt, bool by_value) {
  g::TensorSpec s = spec(uid, name, dt, {1, 1, 1, 1}, {1, 1, 1, 1});
  s.by_value = by_value;
  return s;
}

// The strided (B, H, T, d) view of a (B, T, H*d) tensor, and its transpose (B, H, d, T).
std::vector<int64_t> bthd_strides(int64_t t, int64_t h, int64_t d) { return {t * h * d, d, h * d, 1}; }
std::vector<int64_t> bthd_t_strides(int64_t t, int64_t h, int64_t d) { return {t * h * d, d, 1, h * d}; }

struct Shapes {
  int64_t b, h, tq, tk, d;
  cudnnDataType_t io;
};

Shapes shapes_of(const CudnnAttentionKey& k) {
  return {k.batch, k.heads, k.tq, k.tk, k.depth, g::data_type(k.dtype, "attention")};
}

// S (scaled, biased, masked logits) from a matmul output, shared by both graphs up to the
// point where they differ: forward and backward both do scale, then bias. Returns S.
const g::Descriptor* scale_and_bias(GraphParts& p, const CudnnAttentionKey& key, const Shapes& s,
                                    const g::Descriptor& logits, const g::Descriptor& scale,
                                    const g::Descriptor* bias, const CudnnBiasLayout& layout) {
  const std::vector<int64_t> sd{s.b, s.h, s.tq, s.tk};
  const g::Descriptor& scaled = p.virt("scaled logits", sd);
  p.op(g::make_pointwise("mul scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, logits, &scale, nullptr, scaled),
       "POINTWISE MUL (logits * scale)");
  if (!key.bias) return &scaled;
  const g::Descriptor& biased = p.virt("biased logits", sd);
  p.op(g::make_pointwise("add bias", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, scaled, bias, nullptr, biased),
       "POINTWISE ADD (+ padding bias " + layout.str() + ")");
  return &biased;
}

// The padding bias: per key, broadcast over heads and query rows ([B, 1, 1, Tk], what our
// ids give), or materialised per query row ([B, 1, Tq, Tk], broadcast over heads only:
// cudnn-frontend's SDPA samples' bias layout, Tq times the memory); in the I/O dtype as the
// frontend's samples and tests give it, or in f32 (see cudnn_attention_bias_layouts).
g::TensorSpec bias_spec(const Shapes& s, const CudnnBiasLayout& layout) {
  const cudnnDataType_t dt = layout.f32 ? CUDNN_DATA_FLOAT : s.io;
  if (layout.per_row) return spec(kBias, "padding bias", dt, {s.b, 1, s.tq, s.tk}, {s.tq * s.tk, s.tq * s.tk, s.tk, 1});
  return spec(kBias, "padding bias", dt, {s.b, 1, 1, s.tk}, {s.tk, s.tk, s.tk, 1});
}

// Causal: keep logit (i, j) where i >= j, else the mask value (top-left diagonal, Tq == Tk),
// as cudnn-frontend lowers its causal (diagonal band, right bound 0) mask below cuDNN 9.21:
// row and column indices (GEN_INDEX, math f32, i32 outputs), row >= column (CMP_GE, boolean),
// BINARY_SELECT, with -inf as the replacement (the frontend's value from cuDNN 9.10 on).
const g::Descriptor* causal_mask(GraphParts& p, const Shapes& s, const g::Descriptor& x, const g::Descriptor& value) {
  const std::vector<int64_t> sd{s.b, s.h, s.tq, s.tk};
  const g::Descriptor& row = p.virt("row index", sd, CUDNN_DATA_INT32);
  p.op(g::make_pointwise("row index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, row, 2),
       "POINTWISE GEN_INDEX axis 2 (row)");
  const g::Descriptor& col = p.virt("column index", sd, CUDNN_DATA_INT32);
  p.op(g::make_pointwise("column index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, col, 3),
       "POINTWISE GEN_INDEX axis 3 (column)");
  const g::Descriptor& keep = p.virt("causal keep", sd, CUDNN_DATA_BOOLEAN);
  p.op(g::make_pointwise("row >= column", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, &col, nullptr, keep),
       "POINTWISE CMP_GE (row >= column)");
  const g::Descriptor& masked = p.virt("causal logits", sd);
  p.op(g::make_pointwise("causal select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, &value, &keep, masked),
       "POINTWISE BINARY_SELECT (keep ? logit : -inf)");
  return &masked;
}

void build_forward(GraphParts& p, const CudnnAttentionKey& key, const CudnnBiasLayout& layout) {
  const Shapes s = shapes_of(key);
  const std::vector<int64_t> sd{s.b, s.h, s.tq, s.tk}, rows{s.b, s.h, s.tq, 1};
  const auto& q = p.tensor(spec(kQ, "Q", s.io, {s.b, s.h, s.tq, s.d}, bthd_strides(s.tq, s.h, s.d)));
  const auto& kt = p.tensor(spec(kKT, "K^T", s.io, {s.b, s.h, s.d, s.tk}, bthd_t_strides(s.tk, s.h, s.d)));
  const auto& v = p.tensor(spec(kV, "V", s.io, {s.b, s.h, s.tk, s.d}, bthd_strides(s.tk, s.h, s.d)));
  const auto& o = p.tensor(spec(kO, "O", s.io, {s.b, s.h, s.tq, s.d}, bthd_strides(s.tq, s.h, s.d)));
  const auto& stats = p.tensor(spec(kStats, "Stats", CUDNN_DATA_FLOAT, rows, g::packed_strides(rows)));
  const auto& scale = p.tensor(scalar(kScale, "attention scale", CUDNN_DATA_FLOAT, true));
  const g::Descriptor* bias = nullptr;
  if (key.bias) bias = &p.tensor(bias_spec(s, layout));

  const auto& logits = p.virt("logits", sd);
  p.op(g::make_matmul("Q K^T", q, kt, logits), "MATMUL (Q K^T)");
  const g::Descriptor* x = scale_and_bias(p, key, s, logits, scale, bias, layout);
  if (key.causal) {
    const auto& value = p.tensor(scalar(kMaskValue, "causal mask value", CUDNN_DATA_FLOAT, true));
    x = causal_mask(p, s, *x, value);
  }
  // Softmax with its log-sum-exp statistic: max, x - max, exp, sum, log, max + log(sum), exp / sum.
  const auto& mx = p.virt("row max", rows);
  p.op(g::make_reduction("row max", CUDNN_REDUCE_TENSOR_MAX, *x, mx), "REDUCTION MAX (over keys)");
  const auto& centered = p.virt("logits - max", sd);
  p.op(g::make_pointwise("sub max", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, *x, &mx, nullptr, centered),
       "POINTWISE SUB (- row max)");
  const auto& e = p.virt("exp", sd);
  p.op(g::make_pointwise("exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, centered, nullptr, nullptr, e),
       "POINTWISE EXP");
  const auto& sum = p.virt("row sum", rows);
  p.op(g::make_reduction("row sum", CUDNN_REDUCE_TENSOR_ADD, e, sum), "REDUCTION ADD (over keys)");
  const auto& log_sum = p.virt("log row sum", rows);
  p.op(g::make_pointwise("log", CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, log_sum),
       "POINTWISE LOG");
  p.op(g::make_pointwise("stats", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, &log_sum, nullptr, stats),
       "POINTWISE ADD (Stats = max + log sum)");
  const bool dropout = key.rate > 0.0f;
  // The probabilities feed the second matmul in the I/O dtype (cuDNN wants its A operand so).
  const auto& probs = p.virt("probabilities", sd, dropout ? CUDNN_DATA_FLOAT : s.io);
  p.op(g::make_pointwise("div sum", CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, &sum, nullptr, probs),
       "POINTWISE DIV (/ row sum)");
  const g::Descriptor* pd = &probs;
  if (dropout) {
    const auto& seed = p.tensor(scalar(kSeed, "dropout seed", CUDNN_DATA_INT64, false));
    const auto& offset = p.tensor(scalar(kOffset, "dropout offset", CUDNN_DATA_INT64, false));
    const auto& keep = p.virt("dropout keep", sd);
    p.op(g::make_rng_bernoulli("dropout", 1.0 - key.rate, seed, offset, keep), "RNG (Bernoulli 1 - rate, Philox)");
    const auto& kept = p.virt("kept probabilities", sd);
    p.op(g::make_pointwise("mul keep", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, probs, &keep, nullptr, kept),
         "POINTWISE MUL (* keep)");
    const auto& drop_scale = p.tensor(scalar(kDropScale, "dropout scale", CUDNN_DATA_FLOAT, true));
    const auto& scaled = p.virt("dropped probabilities", sd, s.io);
    p.op(g::make_pointwise("mul dropout scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, kept, &drop_scale, nullptr,
                           scaled),
         "POINTWISE MUL (* 1/(1 - rate))");
    pd = &scaled;
  }
  p.op(g::make_matmul("P V", *pd, v, o), "MATMUL (P V -> O)");
}

void build_backward(GraphParts& p, const CudnnAttentionKey& key, const CudnnBiasLayout& layout) {
  const Shapes s = shapes_of(key);
  const std::vector<int64_t> sd{s.b, s.h, s.tq, s.tk}, rows{s.b, s.h, s.tq, 1};
  const auto& q = p.tensor(spec(kQ, "Q", s.io, {s.b, s.h, s.tq, s.d}, bthd_strides(s.tq, s.h, s.d)));
  const auto& kt = p.tensor(spec(kKT, "K^T", s.io, {s.b, s.h, s.d, s.tk}, bthd_t_strides(s.tk, s.h, s.d)));
  const auto& vt = p.tensor(spec(kV, "V^T", s.io, {s.b, s.h, s.d, s.tk}, bthd_t_strides(s.tk, s.h, s.d)));
  const auto& o = p.tensor(spec(kO, "O", s.io, {s.b, s.h, s.tq, s.d}, bthd_strides(s.tq, s.h, s.d)));
  const auto& d_o = p.tensor(spec(kDO, "dO", s.io, {s.b, s.h, s.tq, s.d}, bthd_strides(s.tq, s.h, s.d)));
  const auto& dq = p.tensor(spec(kDQ, "dQ", s.io, {s.b, s.h, s.tq, s.d}, bthd_strides(s.tq, s.h, s.d)));
  const auto& dk = p.tensor(spec(kDK, "dK", s.io, {s.b, s.h, s.tk, s.d}, bthd_strides(s.tk, s.h, s.d)));
  const auto& dv = p.tensor(spec(kDV, "dV", s.io, {s.b, s.h, s.tk, s.d}, bthd_strides(s.tk, s.h, s.d)));
  const auto& stats = p.tensor(spec(kStats, "Stats", CUDNN_DATA_FLOAT, rows, g::packed_strides(rows)));
  const auto& scale = p.tensor(scalar(kScale, "attention scale", CUDNN_DATA_FLOAT, true));
  const auto& softmax_sum = p.tensor(spec(kSoftmaxSum, "softmax sum", CUDNN_DATA_FLOAT, rows, g::packed_strides(rows)));
  const auto& dq_accum = p.tensor(spec(kDQAccum, "dQ accumulator", CUDNN_DATA_FLOAT, {s.b, s.h, s.tq, s.d},
                                       g::packed_strides({s.b, s.h, s.tq, s.d})));
  const g::Descriptor* bias = nullptr;
  if (key.bias) bias = &p.tensor(bias_spec(s, layout));
  const bool dropout = key.rate > 0.0f;
  // Without dropout the row sums are multiplied by 1 (cudnn-frontend keeps the node, so do we:
  // the engines match this pattern).
  const auto& keep_prob = p.tensor(scalar(kDropKeep, "1 - rate", CUDNN_DATA_FLOAT, true));

  const g::Descriptor* keep = nullptr;
  if (dropout) {
    const auto& seed = p.tensor(scalar(kSeed, "dropout seed", CUDNN_DATA_INT64, false));
    const auto& offset = p.tensor(scalar(kOffset, "dropout offset", CUDNN_DATA_INT64, false));
    keep = &p.virt("dropout keep", sd);
    p.op(g::make_rng_bernoulli("dropout", 1.0 - key.rate, seed, offset, *keep), "RNG (Bernoulli 1 - rate, Philox)");
  }
  // softmax_sum = rowsum(dO * O) * (1 - rate): the softmax backward's dot product. The
  // product's strides are cudnn-frontend's for this virtual tensor ({H Tq d, Tq d, H d, 1}:
  // not a layout of any memory, but the one every frontend-built SDPA backward has shown
  // cuDNN's matcher), not our (B, H, T, d) view's.
  const auto& dOO = p.virt("dO * O", {s.b, s.h, s.tq, s.d}, CUDNN_DATA_FLOAT,
                           {s.h * s.tq * s.d, s.tq * s.d, s.h * s.d, 1});
  p.op(g::make_pointwise("mul dO O", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d_o, &o, nullptr, dOO),
       "POINTWISE MUL (dO * O)");
  const auto& dot = p.virt("row dot", rows);
  p.op(g::make_reduction("row dot", CUDNN_REDUCE_TENSOR_ADD, dOO, dot), "REDUCTION ADD (over depth)");
  p.op(g::make_pointwise("mul keep prob", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dot, &keep_prob, nullptr,
                         softmax_sum),
       "POINTWISE MUL (* (1 - rate) -> softmax sum)");

  // P again from Q K^T and Stats.
  const auto& logits = p.virt("logits", sd);
  p.op(g::make_matmul("Q K^T", q, kt, logits), "MATMUL (Q K^T)");
  const g::Descriptor* x = scale_and_bias(p, key, s, logits, scale, bias, layout);
  const auto& centered = p.virt("logits - stats", sd);
  p.op(g::make_pointwise("sub stats", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, *x, &stats, nullptr, centered),
       "POINTWISE SUB (- Stats)");
  x = &centered;
  if (key.causal) {
    const auto& value = p.tensor(scalar(kMaskValue, "causal mask value", CUDNN_DATA_FLOAT, true));
    x = causal_mask(p, s, *x, value);
  }
  const auto& probs = p.virt("probabilities", sd);
  p.op(g::make_pointwise("exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, *x, nullptr, nullptr, probs), "POINTWISE EXP");
  const g::Descriptor* pd = &probs;
  const g::Descriptor* drop_scale = nullptr;
  if (dropout) {
    const auto& kept = p.virt("kept probabilities", sd);
    p.op(g::make_pointwise("mul keep", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, probs, keep, nullptr, kept),
         "POINTWISE MUL (* keep)");
    drop_scale = &p.tensor(scalar(kDropScale, "dropout scale", CUDNN_DATA_FLOAT, true));
    const auto& scaled = p.virt("dropped probabilities", sd);
    p.op(g::make_pointwise("mul dropout scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, kept, drop_scale, nullptr,
                           scaled),
         "POINTWISE MUL (* 1/(1 - rate))");
    pd = &scaled;
  }
  // dV = P^T dO, with P^T a transposed view in the I/O dtype.
  const auto& pt = p.virt("P^T", {s.b, s.h, s.tk, s.tq}, s.io, {s.h * s.tq * s.tk, s.tq * s.tk, 1, s.tk});
  p.op(g::make_reshape("P^T", *pd, pt), "RESHAPE (P -> P^T)");
  p.op(g::make_matmul("P^T dO", pt, d_o, dv), "MATMUL (P^T dO -> dV)");

  // dS = P * (dP [* keep] - softmax sum) [* 1/(1 - rate)] * scale, dP = dO V^T.
  const auto& dp = p.virt("dP", sd);
  p.op(g::make_matmul("dO V^T", d_o, vt, dp), "MATMUL (dO V^T)");
  const g::Descriptor* y = &dp;
  if (dropout) {
    const auto& kept = p.virt("kept dP", sd);
    p.op(g::make_pointwise("mul keep dP", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp, keep, nullptr, kept),
         "POINTWISE MUL (dP * keep)");
    y = &kept;
  }
  const auto& centered_dp = p.virt("dP - softmax sum", sd);
  p.op(g::make_pointwise("sub softmax sum", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, *y, &softmax_sum, nullptr,
                         centered_dp),
       "POINTWISE SUB (- softmax sum)");
  const auto& ds0 = p.virt("P (dP - sum)", sd);
  p.op(g::make_pointwise("mul P", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, centered_dp, &probs, nullptr, ds0),
       "POINTWISE MUL (* P)");
  y = &ds0;
  if (dropout) {
    const auto& ds1 = p.virt("dS dropout scaled", sd);
    p.op(g::make_pointwise("mul dS dropout scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, ds0, drop_scale, nullptr,
                           ds1),
         "POINTWISE MUL (* 1/(1 - rate))");
    y = &ds1;
  }
  const auto& ds = p.virt("dS", sd);
  p.op(g::make_pointwise("mul dS scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, *y, &scale, nullptr, ds),
       "POINTWISE MUL (* scale -> dS)");
  // dK = dS^T Q.
  const auto& dst = p.virt("dS^T", {s.b, s.h, s.tk, s.tq}, s.io, {s.h * s.tq * s.tk, s.tq * s.tk, 1, s.tk});
  p.op(g::make_reshape("dS^T", ds, dst), "RESHAPE (dS -> dS^T)");
  p.op(g::make_matmul("dS^T Q", dst, q, dk), "MATMUL (dS^T Q -> dK)");
  // dQ = dS K, accumulated in f32 (ours, zeroed), then converted. K is the reshape of K^T
  // back, left in the intermediate dtype (f32) as cudnn-frontend leaves it (only P^T and
  // dS^T are given the I/O dtype there).
  const auto& kr = p.virt("K", {s.b, s.h, s.tk, s.d}, CUDNN_DATA_FLOAT, bthd_strides(s.tk, s.h, s.d));
  p.op(g::make_reshape("K", kt, kr), "RESHAPE (K^T -> K)");
  p.op(g::make_matmul("dS K", ds, kr, dq_accum), "MATMUL (dS K -> dQ accumulator f32)");
  p.op(g::make_pointwise("dQ", CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, nullptr, nullptr, dq),
       "POINTWISE IDENTITY (-> dQ)");
}

struct CachedPlans {
  std::string error;  // non-empty: these shapes cannot be built; the message to repeat
  CudnnBiasLayout bias_layout;  // the padding bias's layout cuDNN took (see bias_spec)
  GraphParts fwd_parts, bwd_parts;
  g::Descriptor fwd_graph, bwd_graph;
  g::Plan fwd, bwd;
};

std::mutex cache_mutex;

// cudnn_attention_force_bias_layout's index, -1 for the engine's own order.
std::atomic<int> forced_bias_layout{-1};

// By device, key and forced bias layout (-1 where none is forced or the key has no bias).
using CacheKey = std::tuple<int, CudnnAttentionKey, int>;

std::map<CacheKey, std::unique_ptr<CachedPlans>>& cache() {
  static auto* c = new std::map<CacheKey, std::unique_ptr<CachedPlans>>();
  return *c;
}

const CachedPlans& plans_for(const CudnnAttentionKey& key, int device) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  const int forced = key.bias ? forced_bias_layout.load() : -1;
  auto& entry = cache()[CacheKey{device, key, forced}];
  if (entry == nullptr) {
    const std::string name = key.str();
    std::string errors;
    // With padding, each bias layout in turn until cuDNN builds both graphs with it (only the
    // forced one when a test forces one).
    std::vector<CudnnBiasLayout> layouts =
        key.bias ? cudnn_attention_bias_layouts() : std::vector<CudnnBiasLayout>{CudnnBiasLayout{}};
    if (forced >= 0) layouts = {layouts.at(static_cast<size_t>(forced))};
    // The library the process loaded, not the one we compiled against: the GPU machines lend
    // theirs (docs/gpu.md).
    const size_t version = cudnnGetVersion();
    const std::string too_old = cudnn_attention_version_problem(version);
    if (!too_old.empty()) {
      errors = too_old;
      layouts.clear();
    }
    for (const CudnnBiasLayout& layout : layouts) {
      auto c = std::make_unique<CachedPlans>();
      c->bias_layout = layout;
      const std::string what = key.bias ? name + " bias " + layout.str() : name;
      try {
        cudnnHandle_t h = cudnn_handle(device);
        build_forward(c->fwd_parts, key, layout);
        c->fwd_graph = g::make_operation_graph("attention forward " + what, h, c->fwd_parts.op_list());
        c->fwd = g::make_plan("attention forward " + what, h, c->fwd_graph);
        build_backward(c->bwd_parts, key, layout);
        c->bwd_graph = g::make_operation_graph("attention backward " + what, h, c->bwd_parts.op_list());
        c->bwd = g::make_plan("attention backward " + what, h, c->bwd_graph);
        // Info, not debug: the first GPU run must say which of our choices cuDNN took.
        log_info("cuDNN {} attention {}: forward engine {} (heuristics mode {}, config {}, {} B workspace), "
                 "backward engine {} (mode {}, config {}, {} B)",
                 version, what, c->fwd.engine, static_cast<int>(c->fwd.mode), c->fwd.config, c->fwd.workspace, c->bwd.engine,
                 static_cast<int>(c->bwd.mode), c->bwd.config, c->bwd.workspace);
        if (!errors.empty()) {
          log_info("cuDNN attention {}: earlier bias layouts were refused: {}", what, errors);
        }
        entry = std::move(c);
        break;
      } catch (const std::exception& e) {
        errors += fmt::format("{}[bias {}] {}", errors.empty() ? "" : "; ", layout.str(), e.what());
      }
    }
    if (entry == nullptr) {
      entry = std::make_unique<CachedPlans>();
      entry->error = errors;
    }
  }
  if (!entry->error.empty()) TNT_THROW("{}", entry->error);
  return *entry;
}

CudnnAttentionKey key_of(const AttentionCoreArgs& a, DType dt, bool bias) {
  CudnnAttentionKey k;
  k.batch = a.batch;
  k.tq = a.tq;
  k.tk = a.tk;
  k.heads = a.heads;
  k.depth = a.depth;
  k.dtype = dt;
  k.causal = a.causal;
  k.bias = bias;
  k.rate = a.rate;
  k.scale = a.scale;
  return k;
}

}  // namespace

std::string CudnnAttentionKey::str() const {
  return fmt::format("B={} Tq={} Tk={} H={} d={} {}{}{}{}", batch, tq, tk, heads, depth, dtype_name(dtype),
                     causal ? " causal" : "", bias ? " padding" : "",
                     rate > 0.0f ? fmt::format(" dropout={}", rate) : std::string());
}

bool CudnnAttentionKey::operator<(const CudnnAttentionKey& o) const {
  return std::tie(batch, tq, tk, heads, depth, dtype, causal, bias, rate) <
         std::tie(o.batch, o.tq, o.tk, o.heads, o.depth, o.dtype, o.causal, o.bias, o.rate);
}

bool cudnn_attention_applies(DType dtype, int64_t batch, int64_t heads, int64_t tq, int64_t tk, int64_t depth,
                             bool causal) {
  if (dtype != DType::bf16 && dtype != DType::f16) return false;
  if (depth <= 0 || depth > 128 || depth % 8 != 0) return false;
  if (batch <= 0 || heads <= 0 || tq <= 0 || tk <= 0) return false;
  // One query row is incremental decoding: a new Tk every step would be a new plan (and a
  // new graph compilation) every step; the fused engine serves it without any.
  if (tq == 1) return false;
  // One key: PyTorch's dispatcher keeps cuDNN's SDPA away from a key/value length of 1
  // (sdp_utils.cpp, check_cudnn_tensor_shapes; pytorch#138531), and nothing here
  // has shown 9.19 right there; a one-token source is cheap on the other engines.
  if (tk == 1) return false;
  if (causal && tq != tk) return false;
  return true;
}

std::string CudnnBiasLayout::str() const {
  return fmt::format("{} {}", per_row ? "[B,1,Tq,Tk]" : "[B,1,1,Tk]", f32 ? "f32" : "io dtype");
}

std::vector<CudnnBiasLayout> cudnn_attention_bias_layouts() {
  // Cheapest first; the frontend's sample layout in the I/O dtype is the one known to run on
  // Hopper; f32 (exact -8192 either way) only if cuDNN refuses the I/O dtype.
  return {{false, false}, {true, false}, {false, true}, {true, true}};
}

std::string cudnn_attention_version_problem(size_t version) {
  // cudnn-frontend, node/scaled_dot_product_flash_attention.h: up to 9.15 its composite
  // backward adds a padding mask over the full lengths whenever the key length is not a
  // multiple of 128 (a backend fault: NaN gradients, cudnn-frontend#160); our graphs do not.
  // (Older still: -FLT_MAX, not -inf, as the causal replacement before 9.10, and PyTorch
  // keeps dropout off cuDNN's SDPA on 9.11 to 9.13.)
  if (version < 91600) {
    return fmt::format("cuDNN {}.{}.{} at run time: the engine's graphs need 9.16 or later (below it the "
                       "backward needs cudnn-frontend's padding-mask workaround for key lengths off 128)",
                       version / 10000, version % 10000 / 100, version % 100);
  }
  return "";
}

void cudnn_attention_force_bias_layout(int index) {
  const int n = static_cast<int>(cudnn_attention_bias_layouts().size());
  TNT_CHECK(index >= -1 && index < n, "cuDNN attention: bias layout {} forced, want -1 (none) to {}", index, n - 1);
  forced_bias_layout.store(index);
}

namespace {

CudnnAttentionGraphText describe(const GraphParts& p) {
  CudnnAttentionGraphText t;
  t.ops = p.op_names;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    t.tensors.push_back(p.tensor_names[i] + ": " + g::describe_tensor(p.tensors[i]));
  }
  auto name = p.op_names.begin();
  for (const auto& op : p.ops) {
    if (name->rfind("POINTWISE", 0) == 0) t.pointwise.push_back(*name + ": " + g::describe_pointwise(op));
    ++name;
  }
  return t;
}

}  // namespace

CudnnAttentionGraphText cudnn_attention_forward_graph(const CudnnAttentionKey& key, const CudnnBiasLayout& layout) {
  GraphParts p;
  build_forward(p, key, layout);
  return describe(p);
}

CudnnAttentionGraphText cudnn_attention_backward_graph(const CudnnAttentionKey& key, const CudnnBiasLayout& layout) {
  GraphParts p;
  build_backward(p, key, layout);
  return describe(p);
}

bool cudnn_attention_prepare(const CudnnAttentionKey& key, int device, bool capped) {
  if (capped) {
    static std::mutex mu;
    static auto* caps = new std::map<int, CudnnShapeCap>();  // by device; never destroyed, like the plan cache
    std::lock_guard<std::mutex> lock(mu);
    CudnnShapeCap& cap = (*caps)[device];
    if (!cap.admit(key)) {
      if (cap.first_refusal()) {
        log_info("cuDNN attention: cuda:{} has planned {} shapes, the most it plans; {} and later new shapes run on "
                 "the fused or unfused engine",
                 device, cap.admitted(), key.str());
      }
      return false;
    }
  }
  plans_for(key, device);
  return true;
}

std::string CudnnAttentionPlanInfo::str() const {
  auto loaded = [](bool compiled_only) { return compiled_only ? ", compiled, not loaded: no CUDA driver" : ""; };
  return fmt::format("bias {}, forward engine {} ({} B workspace{}), backward engine {} ({} B{})", bias_layout.str(),
                     forward_engine, forward_workspace, loaded(forward_compiled_only), backward_engine,
                     backward_workspace, loaded(backward_compiled_only));
}

CudnnAttentionPlanInfo cudnn_attention_plan_deviceless(const CudnnAttentionKey& key, const std::string& device_json) {
  const g::Descriptor props = g::make_device_properties(key.str(), device_json);
  std::vector<CudnnBiasLayout> layouts =
      key.bias ? cudnn_attention_bias_layouts() : std::vector<CudnnBiasLayout>{CudnnBiasLayout{}};
  const int forced = key.bias ? forced_bias_layout.load() : -1;
  if (forced >= 0) layouts = {layouts.at(static_cast<size_t>(forced))};
  std::string errors;
  for (const CudnnBiasLayout& layout : layouts) {
    const std::string what = key.bias ? key.str() + " bias " + layout.str() : key.str();
    try {
      GraphParts fwd, bwd;
      build_forward(fwd, key, layout);
      const g::Descriptor fwd_graph = g::make_operation_graph("attention forward " + what, nullptr, fwd.op_list());
      const g::Plan fp = g::make_plan_deviceless("attention forward " + what, props, fwd_graph);
      build_backward(bwd, key, layout);
      const g::Descriptor bwd_graph = g::make_operation_graph("attention backward " + what, nullptr, bwd.op_list());
      const g::Plan bp = g::make_plan_deviceless("attention backward " + what, props, bwd_graph);
      CudnnAttentionPlanInfo info;
      info.bias_layout = layout;
      info.forward_engine = fp.engine;
      info.backward_engine = bp.engine;
      info.forward_workspace = fp.workspace;
      info.backward_workspace = bp.workspace;
      info.forward_compiled_only = fp.compiled_only;
      info.backward_compiled_only = bp.compiled_only;
      return info;
    } catch (const std::exception& e) {
      errors += fmt::format("{}[bias {}] {}", errors.empty() ? "" : "; ", layout.str(), e.what());
    }
  }
  TNT_THROW("{}", errors);
}

namespace {

// The host values of the by-value inputs both graphs may take (they must outlive execute).
struct OptionalValues {
  float mask_value;  // causal's replacement logit
  float drop_scale;  // 1 / (1 - rate)
};

// The inputs both graphs take after their own, where the key has them: the padding bias,
// causal's replacement logit, dropout's seed, offset and scale.
void add_optional_inputs(const CudnnAttentionKey& key, const CudnnAttentionSaved& saved, OptionalValues& values,
                         std::vector<int64_t>& uids, std::vector<void*>& ptrs) {
  if (key.bias) {
    uids.push_back(kBias);
    ptrs.push_back(saved.bias.raw());
  }
  if (key.causal) {
    uids.push_back(kMaskValue);
    ptrs.push_back(&values.mask_value);
  }
  if (key.rate > 0.0f) {
    auto* so = static_cast<int64_t*>(saved.seed_offset.raw());
    uids.insert(uids.end(), {kSeed, kOffset, kDropScale});
    ptrs.insert(ptrs.end(), {so, so + 2, &values.drop_scale});
  }
}

}  // namespace

Tensor cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                               const AttentionCoreArgs& a, CudnnAttentionSaved& saved, int device) {
  const CudnnAttentionKey key = key_of(a, q.dtype(), key_ids.defined());
  const CachedPlans& c = plans_for(key, device);
  const Device dev = q.device();
  Tensor o = Tensor::empty({a.batch, a.tq, a.heads * a.depth}, q.dtype(), dev);
  saved.stats = Tensor::empty({a.batch, a.heads, a.tq, 1}, DType::f32, dev);
  if (key.bias) {
    saved.bias = cudnn_attention_bias(key_ids, a.batch, c.bias_layout.per_row ? a.tq : 1, a.tk,
                                      c.bias_layout.f32 ? DType::f32 : q.dtype(), device);
  }
  if (key.rate > 0.0f) saved.seed_offset = cudnn_attention_seed_offset(a.key, a.base, device);
  float scale = a.scale;
  OptionalValues values{kCudnnCausalMaskValue, 1.0f / (1.0f - a.rate)};
  std::vector<int64_t> uids{kQ, kKT, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{q.raw(), k.raw(), v.raw(), o.raw(), saved.stats.raw(), &scale};
  add_optional_inputs(key, saved, values, uids, ptrs);
  Tensor workspace;
  if (c.fwd.workspace > 0) workspace = Tensor::empty({c.fwd.workspace}, DType::u8, dev);
  g::execute("attention forward " + key.str(), cudnn_handle(device), c.fwd, uids, ptrs,
             workspace.defined() ? workspace.raw() : nullptr);
  return o;
}

void cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& d_o,
                              const CudnnAttentionSaved& saved, const AttentionCoreArgs& a, Tensor& dq, Tensor& dk,
                              Tensor& dv, int device) {
  const CudnnAttentionKey key = key_of(a, q.dtype(), saved.bias.defined());
  const CachedPlans& c = plans_for(key, device);
  const Device dev = q.device();
  const int64_t D = a.heads * a.depth;
  dq = Tensor::empty({a.batch, a.tq, D}, q.dtype(), dev);
  dk = Tensor::empty({a.batch, a.tk, D}, q.dtype(), dev);
  dv = Tensor::empty({a.batch, a.tk, D}, q.dtype(), dev);
  Tensor softmax_sum = Tensor::empty({a.batch, a.heads, a.tq, 1}, DType::f32, dev);
  // cuDNN adds each key block's share into it. cudnn-frontend zeroes it only for cuDNN
  // before 9.6 and leaves it to the engine after (9.19 here); we zero it anyway: 8 MB at
  // B=64, H=16, T=256, d=64 costs microseconds, cheaper than a wrong dQ if the engine does not.
  Tensor dq_accum = Tensor::zeros({a.batch, a.heads, a.tq, a.depth}, DType::f32, dev);
  float scale = a.scale, keep_prob = 1.0f - a.rate;
  OptionalValues values{kCudnnCausalMaskValue, 1.0f / (1.0f - a.rate)};
  std::vector<int64_t> uids{kQ, kKT, kV, kO, kDO, kDQ, kDK, kDV, kStats, kScale, kSoftmaxSum, kDQAccum, kDropKeep};
  std::vector<void*> ptrs{q.raw(),  k.raw(),  v.raw(),           o.raw(),           d_o.raw(),       dq.raw(), dk.raw(),
                          dv.raw(), saved.stats.raw(), &scale, softmax_sum.raw(), dq_accum.raw(), &keep_prob};
  add_optional_inputs(key, saved, values, uids, ptrs);
  Tensor workspace;
  if (c.bwd.workspace > 0) workspace = Tensor::empty({c.bwd.workspace}, DType::u8, dev);
  g::execute("attention backward " + key.str(), cudnn_handle(device), c.bwd, uids, ptrs,
             workspace.defined() ? workspace.raw() : nullptr);
}

}  // namespace tnt::cuda
