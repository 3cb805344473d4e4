// See attention_cudnn_graph_cuda.hpp. The graphs follow the node order cudnn-frontend lowers its
// SDPA node to for sm_90 (attention_cudnn_cuda.hpp says why this graph and where its results
// differ).
//
// Layout: our q (B, Tq, H*d) is cuDNN's Q [B, H, Tq, d] with strides [Tq*H*d, d, H*d, 1]
// (likewise k, v, o and the gradients): the heads are a stride, never a copy. The matmul
// nodes take K^T (and V^T in the backward) as a transposed view [B, H, d, Tk] of the same
// memory.
#include "layers/attention_cudnn_graph_cuda.hpp"

#include "tarantella/check.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace tnt::cuda {

namespace attention_graph {

namespace g = graph;

namespace {

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
  if (layout.expanded) return spec(kBias, "padding bias", dt, {s.b, 1, s.tq, s.tk}, {s.tk, s.tk, 0, 1});
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

}  // namespace

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

}  // namespace attention_graph

using namespace attention_graph;
namespace g = graph;

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

}  // namespace tnt::cuda
