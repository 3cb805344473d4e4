// MultiHeadAttention (see attention.hpp): the projections are Dense children; the core
// (heads, scaled dot products, masks, softmax, dropout) has a CPU engine here and a CUDA
// engine in attention_cuda.cu (semantics in attention_cuda.hpp).
//
// The CPU core copies q, k, v into per-head contiguous (B, H, T, d) buffers (q scaled), so
// that every product is one oneDNN batched matmul over B*H matrices with at most a stride
// swap; softmax and dropout are loops over rows (OpenMP).
//
// Incremental decoding (project, step, attend) runs the same projections and the same core
// engines on fewer positions; only the cache's reorder-and-append is its own (a row copy
// per engine: cache_append below and in attention_cuda.cu).
#include "tarantella/layers/attention.hpp"
#include "nn/layer_types.hpp"

#include "backend/dispatch.hpp"
#include "core/philox.hpp"
#include "layers/attention_cuda.hpp"
#include "layers/dense_cuda.hpp"
#include "layers/dropout_cpu.hpp"
#include "layers/matmul_cpu.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/random.hpp"

#include <cmath>
#include <cstring>

namespace tnt {

namespace {

bool is_id_type(DType d) { return d == DType::i32 || d == DType::i64; }

constexpr float kMaskBias = -1e9f;  // TensorFlow's attention bias for masked keys

// Per-call state: the children's states and the core's.
struct AttentionSaved {
  SavedState q, k, v, o;
  std::shared_ptr<void> core;
  bool self = true;   // memory is x
  bool ids = false;   // key ids were given (they get an undefined gradient)
  bool cuda = false;
};

struct CpuCore {
  AttentionCoreArgs args;
  Tensor qh, kh, vh;  // (B, H, Tq, d) scaled, (B, H, Tk, d), (B, H, Tk, d)
  Tensor p, pd;       // (B, H, Tq, Tk); pd is p without dropout
  Tensor keep;        // (B, H, Tq, Tk) u8 when dropout ran
};

// (B, T, H*d) -> (B, H, T, d), times s.
void split_heads(const float* src, float* dst, int64_t b, int64_t t, int64_t h, int64_t d, float s) {
#pragma omp parallel for collapse(2) schedule(static) if (b * t * h * d > 32768)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t ti = 0; ti < t; ++ti) {
        const float* in = src + (bi * t + ti) * h * d + hi * d;
        float* out = dst + ((bi * h + hi) * t + ti) * d;
        for (int64_t j = 0; j < d; ++j) out[j] = in[j] * s;
      }
}

// (B, H, T, d) -> (B, T, H*d), times s.
void merge_heads(const float* src, float* dst, int64_t b, int64_t t, int64_t h, int64_t d, float s) {
#pragma omp parallel for collapse(2) schedule(static) if (b * t * h * d > 32768)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t hi = 0; hi < h; ++hi) {
        const float* in = src + ((bi * h + hi) * t + ti) * d;
        float* out = dst + (bi * t + ti) * h * d + hi * d;
        for (int64_t j = 0; j < d; ++j) out[j] = in[j] * s;
      }
}

Tensor cpu_core_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                        const AttentionCoreArgs& a, std::shared_ptr<void>& state) {
  auto s = std::make_shared<CpuCore>();
  s->args = a;
  const int64_t B = a.batch, H = a.heads, Tq = a.tq, Tk = a.tk, d = a.depth, D = H * d;
  s->qh = Tensor::empty({B, H, Tq, d});
  s->kh = Tensor::empty({B, H, Tk, d});
  s->vh = Tensor::empty({B, H, Tk, d});
  split_heads(q.data<float>(), s->qh.data<float>(), B, Tq, H, d, a.scale);
  split_heads(k.data<float>(), s->kh.data<float>(), B, Tk, H, d, 1.0f);
  split_heads(v.data<float>(), s->vh.data<float>(), B, Tk, H, d, 1.0f);
  s->p = Tensor::empty({B, H, Tq, Tk});
  float* p = s->p.data<float>();
  // logits (B*H, Tq, Tk) = qh kh^T
  cpu::batched_matmul(s->qh.data<float>(), false, s->kh.data<float>(), true, p, B * H, Tq, Tk, d, false);
  // Padding per (b, j), from the ids.
  std::vector<uint8_t> pad(static_cast<size_t>(B * Tk), 0);
  if (key_ids.defined()) {
    for (int64_t i = 0; i < B * Tk; ++i) {
      const int64_t id = key_ids.dtype() == DType::i32 ? key_ids.data<int32_t>()[i] : key_ids.data<int64_t>()[i];
      pad[i] = id == 0;
    }
  }
  const bool dropout = a.rate > 0.0f;
  if (dropout) {
    s->pd = Tensor::empty({B, H, Tq, Tk});
    s->keep = Tensor::empty({B, H, Tq, Tk}, DType::u8);
  } else {
    s->pd = s->p;
  }
  float* pd = s->pd.data<float>();
  uint8_t* keep = dropout ? s->keep.data<uint8_t>() : nullptr;
  const float keep_scale = dropout ? 1.0f / (1.0f - a.rate) : 1.0f;
  const int64_t rows = B * H * Tq;
#pragma omp parallel for schedule(static) if (rows * Tk > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bi = r / (H * Tq), i = r % Tq;
    float* pr = p + r * Tk;
    const uint8_t* padr = pad.data() + bi * Tk;
    float mx = -INFINITY;
    for (int64_t j = 0; j < Tk; ++j) {
      float l = pr[j];
      if (padr[j] || (a.causal && j > i + (Tk - Tq))) l += kMaskBias;
      pr[j] = l;
      mx = std::max(mx, l);
    }
    float total = 0;
    for (int64_t j = 0; j < Tk; ++j) {
      pr[j] = std::exp(pr[j] - mx);
      total += pr[j];
    }
    const float inv = 1.0f / total;
    for (int64_t j = 0; j < Tk; ++j) pr[j] *= inv;
    if (dropout) {
      // A Philox block per four probabilities (Dropout's rule), not one per probability.
      detail::for_each_dropout_keep(a.key, a.base + static_cast<uint64_t>(r * Tk), Tk, a.rate,
                                    [&](int64_t j, bool kept) {
                                      keep[r * Tk + j] = kept;
                                      pd[r * Tk + j] = kept ? pr[j] * keep_scale : 0.0f;
                                    });
    }
  }
  // oh (B*H, Tq, d) = pd vh, then heads merged into (B, Tq, D)
  Tensor oh = Tensor::empty({B, H, Tq, d});
  cpu::batched_matmul(pd, false, s->vh.data<float>(), false, oh.data<float>(), B * H, Tq, d, Tk, false);
  Tensor o = Tensor::empty({B, Tq, D});
  merge_heads(oh.data<float>(), o.data<float>(), B, Tq, H, d, 1.0f);
  state = s;
  return o;
}

void cpu_core_backward(const Tensor& d_o, const std::shared_ptr<void>& state, Tensor& dq, Tensor& dk, Tensor& dv) {
  const auto& s = *static_cast<const CpuCore*>(state.get());
  const AttentionCoreArgs& a = s.args;
  const int64_t B = a.batch, H = a.heads, Tq = a.tq, Tk = a.tk, d = a.depth, D = H * d;
  TNT_CHECK(d_o.numel() == B * Tq * D && d_o.dtype() == DType::f32, "MultiHeadAttention: gradient {} for ({}, {}, {})",
            d_o.str(), B, Tq, D);
  Tensor doh = Tensor::empty({B, H, Tq, d});
  split_heads(d_o.data<float>(), doh.data<float>(), B, Tq, H, d, 1.0f);
  // dvh (B*H, Tk, d) = pd^T doh
  Tensor dvh = Tensor::empty({B, H, Tk, d});
  cpu::batched_matmul(s.pd.data<float>(), true, doh.data<float>(), false, dvh.data<float>(), B * H, Tk, d, Tq, false);
  // dpd (B*H, Tq, Tk) = doh vh^T
  Tensor dl = Tensor::empty({B, H, Tq, Tk});
  float* g = dl.data<float>();
  cpu::batched_matmul(doh.data<float>(), false, s.vh.data<float>(), true, g, B * H, Tq, Tk, d, false);
  // Through dropout and softmax, in place: dlogits = p (dp - sum_j dp_j p_j)
  const float* p = s.p.data<float>();
  const uint8_t* keep = s.keep.defined() ? s.keep.data<uint8_t>() : nullptr;
  const float keep_scale = keep ? 1.0f / (1.0f - a.rate) : 1.0f;
  const int64_t rows = B * H * Tq;
#pragma omp parallel for schedule(static) if (rows * Tk > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    float* gr = g + r * Tk;
    const float* pr = p + r * Tk;
    if (keep) {
      for (int64_t j = 0; j < Tk; ++j) gr[j] = keep[r * Tk + j] ? gr[j] * keep_scale : 0.0f;
    }
    float dot = 0;
    for (int64_t j = 0; j < Tk; ++j) dot += gr[j] * pr[j];
    for (int64_t j = 0; j < Tk; ++j) gr[j] = pr[j] * (gr[j] - dot);
  }
  // dqh (B*H, Tq, d) = dl kh (times scale, below); dkh (B*H, Tk, d) = dl^T qh
  Tensor dqh = Tensor::empty({B, H, Tq, d});
  cpu::batched_matmul(g, false, s.kh.data<float>(), false, dqh.data<float>(), B * H, Tq, d, Tk, false);
  Tensor dkh = Tensor::empty({B, H, Tk, d});
  cpu::batched_matmul(g, true, s.qh.data<float>(), false, dkh.data<float>(), B * H, Tk, d, Tq, false);
  dq = Tensor::empty({B, Tq, D});
  dk = Tensor::empty({B, Tk, D});
  dv = Tensor::empty({B, Tk, D});
  merge_heads(dqh.data<float>(), dq.data<float>(), B, Tq, H, d, a.scale);
  merge_heads(dkh.data<float>(), dk.data<float>(), B, Tk, H, d, 1.0f);
  merge_heads(dvh.data<float>(), dv.data<float>(), B, Tk, H, d, 1.0f);
}

// a + b (+ c), skipping undefined tensors; undefined when all are.
Tensor sum_defined(std::initializer_list<Tensor> ts) {
  Tensor out;
  for (const Tensor& t : ts) {
    if (!t.defined()) continue;
    if (!out.defined()) {
      out = t;
    } else {
      ops::axpy(1.0, t, out);
    }
  }
  return out;
}

// The core on q's device.
Tensor core_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                    const AttentionCoreArgs& a, std::shared_ptr<void>& state, const char* what) {
  (void)what;  // named only in a build without CUDA
  if (q.device().is_cuda()) {
#ifdef TNT_WITH_CUDA
    return cuda::attention_core_forward(q, k, v, key_ids, a, state);
#else
    detail::no_cuda_engine(what);
#endif
  }
  return cpu_core_forward(q, k, v, key_ids, a, state);
}

// (B, T + 1, D): row b is old's row parents[b] (T positions), then fresh's row b (1 position).
Tensor cpu_cache_append(const Tensor& old, const std::vector<int64_t>& parents, const Tensor& fresh) {
  const int64_t B = fresh.dim(0), T = old.dim(1), D = fresh.dim(2);
  Tensor out = Tensor::empty({B, T + 1, D});
  const float* os = old.data<float>();
  const float* fs = fresh.data<float>();
  float* ys = out.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(ys + b * (T + 1) * D, os + parents[static_cast<size_t>(b)] * T * D,
                static_cast<size_t>(T * D) * sizeof(float));
    std::memcpy(ys + (b * (T + 1) + T) * D, fs + b * D, static_cast<size_t>(D) * sizeof(float));
  }
  return out;
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t hidden_size, MultiHeadAttentionOptions options, std::string name)
    : Layer(std::move(name)), hidden_(hidden_size), options_(options) {
  default_name("multi_head_attention");
  TNT_CHECK(hidden_size > 0 && options.num_heads > 0 && hidden_size % options.num_heads == 0,
            "MultiHeadAttention '{}': hidden size {} must be a positive multiple of the number of heads {}", name_,
            hidden_size, options.num_heads);
  TNT_CHECK(options.dropout >= 0 && options.dropout < 1, "MultiHeadAttention '{}': dropout {} is not in [0, 1)", name_,
            options.dropout);
  DenseOptions no_bias{.use_bias = false};
  q_ = std::make_shared<Dense>(hidden_size, no_bias, "q_proj");
  k_ = std::make_shared<Dense>(hidden_size, no_bias, "k_proj");
  v_ = std::make_shared<Dense>(hidden_size, no_bias, "v_proj");
  o_ = std::make_shared<Dense>(hidden_size, no_bias, "out_proj");
  add_child(q_);
  add_child(k_);
  add_child(v_);
  add_child(o_);
}

std::vector<Shape> MultiHeadAttention::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(!in.empty() && in.size() <= 3, "MultiHeadAttention '{}': expects 1 to 3 inputs, got {}", name_, in.size());
  TNT_INPUT_CHECK(in[0].size() == 3 && in[0][2] == hidden_, "MultiHeadAttention '{}': x must be (B, T, {}), got {}", name_,
            hidden_, shape_str(in[0]));
  for (size_t i = 1; i < in.size(); ++i) {
    const bool memory = in[i].size() == 3;
    TNT_CHECK((memory && in[i][2] == hidden_ && in[i][0] == in[0][0]) || (in[i].size() == 2 && in[i][0] == in[0][0]),
              "MultiHeadAttention '{}': input {} must be memory (B, Tk, {}) or key ids (B, Tk), got {}", name_, i,
              hidden_, shape_str(in[i]));
  }
  return {in[0]};
}

void MultiHeadAttention::build(const std::vector<Shape>&) {
  for (const auto& child : {q_, k_, v_, o_}) child->ensure_built({{1, hidden_}});
}

uint64_t MultiHeadAttention::dropout_key(const RunContext& rc) const {
  return CounterRng(rc.seed, fmt::format("{}/attention_dropout/{}", name_, rc.step)).key();
}

std::vector<Tensor> MultiHeadAttention::forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                                                SavedState& saved) {
  TNT_CHECK(!inputs.empty() && inputs.size() <= 3, "MultiHeadAttention '{}': expects 1 to 3 inputs, got {}", name_,
            inputs.size());
  Tensor key_ids;
  std::vector<Tensor> floats;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TNT_CHECK(inputs[i].defined(), "MultiHeadAttention '{}': input {} is undefined", name_, i);
    if (is_id_type(inputs[i].dtype())) {
      TNT_CHECK(i == inputs.size() - 1 && i > 0, "MultiHeadAttention '{}': key ids must be the last input", name_);
      key_ids = inputs[i];
    } else {
      floats.push_back(inputs[i]);
    }
  }
  TNT_CHECK(floats.size() <= 2, "MultiHeadAttention '{}': at most x and memory may be floating", name_);
  check_inputs(floats, 0);
  std::vector<Shape> shapes;
  for (const Tensor& t : inputs) shapes.push_back(t.shape());
  output_shapes(shapes);
  ensure_built(shapes);
  const Tensor& x = floats[0];
  const Tensor& mem = floats.size() == 2 ? floats[1] : floats[0];
  if (key_ids.defined()) {
    TNT_CHECK(key_ids.ndim() == 2 && key_ids.dim(0) == mem.dim(0) && key_ids.dim(1) == mem.dim(1),
              "MultiHeadAttention '{}': key ids {} do not match the keys {}", name_, key_ids.str(), mem.str());
    TNT_CHECK(key_ids.device() == x.device(), "MultiHeadAttention '{}': key ids on {}, x on {}", name_,
              key_ids.device().str(), x.device().str());
  }
  auto s = std::make_shared<AttentionSaved>();
  s->self = floats.size() == 1;
  s->ids = key_ids.defined();
  s->cuda = x.device().is_cuda();
  s->q.need_input_grads = s->k.need_input_grads = s->v.need_input_grads = saved.need_input_grads;
  Tensor q = q_->forward({x}, rc, s->q)[0];    // (B, Tq, D)
  Tensor k = k_->forward({mem}, rc, s->k)[0];  // (B, Tk, D)
  Tensor v = v_->forward({mem}, rc, s->v)[0];  // (B, Tk, D)

  AttentionCoreArgs a;
  a.batch = x.dim(0);
  a.tq = x.dim(1);
  a.tk = mem.dim(1);
  a.heads = options_.num_heads;
  a.depth = depth();
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.depth)));
  a.causal = options_.causal;
  if (rc.training && options_.dropout > 0) {
    a.rate = static_cast<float>(options_.dropout);
    a.key = dropout_key(rc);
    a.base = static_cast<uint64_t>(rc.sample_offset) * static_cast<uint64_t>(a.heads * a.tq * a.tk);
  }
  Tensor o = core_forward(q, k, v, key_ids, a, s->core, "MultiHeadAttention::forward");
  Tensor y = o_->forward({o}, rc, s->o)[0];  // (B, Tq, D)
  saved.tensors.clear();
  saved.extra = s;
  return {y};
}

std::vector<Tensor> MultiHeadAttention::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                                 SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(),
            "MultiHeadAttention '{}': backward needs one gradient", name_);
  TNT_CHECK(saved.extra, "MultiHeadAttention '{}': backward without a forward", name_);
  auto& s = *static_cast<AttentionSaved*>(saved.extra.get());
  Tensor d_o = o_->backward(grad_outputs, rc, s.o)[0];
  Tensor dq, dk, dv;
  if (s.cuda) {
#ifdef TNT_WITH_CUDA
    cuda::attention_core_backward(d_o, s.core, dq, dk, dv);
#else
    detail::no_cuda_engine("MultiHeadAttention::backward");
#endif
  } else {
    cpu_core_backward(d_o, s.core, dq, dk, dv);
  }
  Tensor dx = q_->backward({dq}, rc, s.q)[0];
  std::vector<Tensor> grads;
  if (s.cuda) {
#ifdef TNT_WITH_CUDA
    // The projections of one input add their input gradients inside the products (beta =
    // 1): no tensor per projection and no separate sums (at 32k tokens x 1,024 in bf16, 384
    // MB less traffic per self-attention).
    if (s.self) {
      dx = cuda::dense_backward_add(*k_, dk, rc, s.k, dx);
      grads.push_back(cuda::dense_backward_add(*v_, dv, rc, s.v, dx));
    } else {
      grads.push_back(dx);
      grads.push_back(cuda::dense_backward_add(*v_, dv, rc, s.v, k_->backward({dk}, rc, s.k)[0]));
    }
#else
    detail::no_cuda_engine("MultiHeadAttention::backward");
#endif
  } else {
    Tensor dmk = k_->backward({dk}, rc, s.k)[0];
    Tensor dmv = v_->backward({dv}, rc, s.v)[0];
    if (s.self) {
      grads.push_back(sum_defined({dx, dmk, dmv}));
    } else {
      grads.push_back(dx);
      grads.push_back(sum_defined({dmk, dmv}));
    }
  }
  if (s.ids) grads.emplace_back();
  return grads;
}

// ---------------------------------------------------------------------------------------
// Incremental decoding

void MultiHeadAttention::check_incremental(const Tensor& x, const RunContext& rc, const char* what) {
  TNT_CHECK(!rc.training, "MultiHeadAttention '{}': {} is for inference (a training step has no cache)", name_, what);
  TNT_CHECK(x.defined() && x.ndim() == 3 && x.dim(2) == hidden_ && !is_id_type(x.dtype()),
            "MultiHeadAttention '{}': {} needs a floating (B, T, {}), got {}", name_, what, hidden_,
            x.defined() ? x.str() : std::string("an undefined tensor"));
  ensure_built({x.shape()});
  TNT_CHECK(x.device() == device(), "MultiHeadAttention '{}': {} input on {}, the layer on {}", name_, what,
            x.device().str(), device().str());
}

AttentionCache MultiHeadAttention::project(const Tensor& memory, const RunContext& rc) {
  check_incremental(memory, rc, "project");
  SavedState sk, sv;
  sk.need_input_grads = sv.need_input_grads = false;
  AttentionCache cache;
  cache.k = k_->forward({memory}, rc, sk)[0];  // (B, Tk, D)
  cache.v = v_->forward({memory}, rc, sv)[0];  // (B, Tk, D)
  return cache;
}

Tensor MultiHeadAttention::attend(const Tensor& x, const AttentionCache& cache, const Tensor& key_ids,
                                  const RunContext& rc) {
  check_incremental(x, rc, "attend");
  TNT_CHECK(cache.k.defined() && cache.v.defined() && cache.k.ndim() == 3 && cache.k.shape() == cache.v.shape() &&
                cache.k.dim(0) == x.dim(0) && cache.k.dim(2) == hidden_ && cache.k.device() == x.device() &&
                cache.k.dtype() == x.dtype() && cache.v.dtype() == x.dtype(),
            "MultiHeadAttention '{}': a cache of keys {} and values {} does not fit x {}", name_,
            cache.k.defined() ? cache.k.str() : "none", cache.v.defined() ? cache.v.str() : "none", x.str());
  if (key_ids.defined()) {
    TNT_CHECK(is_id_type(key_ids.dtype()) && key_ids.ndim() == 2 && key_ids.dim(0) == cache.k.dim(0) &&
                  key_ids.dim(1) == cache.k.dim(1) && key_ids.device() == x.device(),
              "MultiHeadAttention '{}': key ids {} do not match the cached keys {}", name_, key_ids.str(),
              cache.k.str());
  }
  SavedState sq, so;
  sq.need_input_grads = so.need_input_grads = false;
  const Tensor q = q_->forward({x}, rc, sq)[0];  // (B, Tq, D)
  AttentionCoreArgs a;
  a.batch = x.dim(0);
  a.tq = x.dim(1);
  a.tk = cache.k.dim(1);
  a.heads = options_.num_heads;
  a.depth = depth();
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.depth)));
  a.causal = false;  // the cache holds only positions a query may see
  std::shared_ptr<void> state;
  const Tensor o = core_forward(q, cache.k, cache.v, key_ids, a, state, "MultiHeadAttention::attend");
  return o_->forward({o}, rc, so)[0];  // (B, Tq, D)
}

Tensor MultiHeadAttention::step(const Tensor& x, AttentionCache& cache, const std::vector<int64_t>& parents,
                                const RunContext& rc) {
  check_incremental(x, rc, "step");
  TNT_CHECK(x.dim(1) == 1, "MultiHeadAttention '{}': step takes one new position per row, got {}", name_, x.str());
  const int64_t rows = x.dim(0), length = cache.length();
  SavedState sk, sv;
  sk.need_input_grads = sv.need_input_grads = false;
  Tensor k = k_->forward({x}, rc, sk)[0];  // (B, 1, D)
  Tensor v = v_->forward({x}, rc, sv)[0];  // (B, 1, D)
  if (length == 0) {  // the first position: nothing to reorder
    cache.k = k;
    cache.v = v;
  } else {
    TNT_CHECK(cache.v.defined() && cache.k.ndim() == 3 && cache.k.shape() == cache.v.shape() &&
                  cache.k.dim(2) == hidden_ && cache.k.device() == x.device() && cache.k.dtype() == k.dtype() &&
                  cache.v.dtype() == k.dtype(),
              "MultiHeadAttention '{}': a cache of keys {} and values {} does not fit x {}", name_, cache.k.str(),
              cache.v.defined() ? cache.v.str() : "none", x.str());
    const int64_t old_rows = cache.k.dim(0);
    std::vector<int64_t> from = parents;
    if (from.empty()) {
      TNT_CHECK(old_rows == rows, "MultiHeadAttention '{}': {} new rows without parents for a cache of {} rows", name_,
                rows, old_rows);
      for (int64_t b = 0; b < rows; ++b) from.push_back(b);
    }
    TNT_CHECK(static_cast<int64_t>(from.size()) == rows, "MultiHeadAttention '{}': {} parents for {} rows", name_,
              from.size(), rows);
    for (int64_t p : from) {
      TNT_CHECK(p >= 0 && p < old_rows, "MultiHeadAttention '{}': parent row {} outside the cache's {} rows", name_, p,
                old_rows);
    }
    if (x.device().is_cuda()) {
#ifdef TNT_WITH_CUDA
      const Tensor index = Tensor::from_data(from.data(), {rows}).to(x.device());
      cache.k = cuda::attention_cache_append(cache.k, index, k);
      cache.v = cuda::attention_cache_append(cache.v, index, v);
#else
      detail::no_cuda_engine("MultiHeadAttention::step");
#endif
    } else {
      TNT_CHECK(k.dtype() == DType::f32, "MultiHeadAttention '{}': the CPU cache holds f32, got {}", name_, k.str());
      cache.k = cpu_cache_append(cache.k, from, k);
      cache.v = cpu_cache_append(cache.v, from, v);
    }
  }
  return attend(x, cache, Tensor(), rc);
}

// Model files (nn/layer_types.hpp).
namespace {
LayerConfig attention_config(const Layer& layer) {
  const auto& l = detail::layer_as<MultiHeadAttention>(layer);
  LayerConfig c;
  c.set_int("hidden_size", l.hidden_size());
  c.set_int("num_heads", l.num_heads());
  c.set_double("dropout", l.dropout());
  c.set_bool("causal", l.causal());
  return c;
}

LayerPtr attention_from(const std::string& name, const LayerConfig& c) {
  MultiHeadAttentionOptions o;
  o.num_heads = c.get_int("num_heads");
  o.dropout = c.get_double("dropout");
  o.causal = c.get_bool("causal");
  return std::make_shared<MultiHeadAttention>(c.get_int("hidden_size"), o, name);
}

const detail::LayerTypeRegistration kMultiHeadAttention("MultiHeadAttention", attention_config, attention_from);
}  // namespace

}  // namespace tnt
