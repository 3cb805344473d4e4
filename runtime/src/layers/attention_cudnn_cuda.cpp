// The cuDNN flash-attention engine: the plan cache of its two operation graphs (built in
// attention_cudnn_graph_cuda.cpp; attention_cudnn_cuda.hpp says why these graphs and where
// their results differ), deviceless planning, and the calls. The variant packs hand cuDNN our
// q (B, Tq, H*d) as Q [B, H, Tq, d] through strides: the heads are never copied.
#include "layers/attention_cudnn_cuda.hpp"

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cudnn_graph.hpp"
#include "layers/attention_cudnn_graph_cuda.hpp"
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

using namespace attention_graph;

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
  return fmt::format("{} {}", per_row ? "[B,1,Tq,Tk]" : expanded ? "[B,1,Tq,Tk] query stride 0" : "[B,1,1,Tk]",
                     f32 ? "f32" : "io dtype");
}

std::vector<CudnnBiasLayout> cudnn_attention_bias_layouts() {
  // Cheapest first: per-key memory, as a broadcast over query rows, then as the (B, 1, Tq,
  // Tk) dims with a query stride of 0 that PyTorch hands cuDNN for an expanded mask; then the
  // frontend's sample layout in the I/O dtype, the one known to run on Hopper; f32 (exact
  // -8192 either way) only if cuDNN refuses the I/O dtype.
  return {{false, false, false}, {false, false, true}, {true, false, false}, {false, true, false},
          {true, true, false}};
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
std::atomic<int> failures_to_inject{0};
}  // namespace

void cudnn_attention_fail_next_forwards(int count) { failures_to_inject.store(count); }

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
  if (failures_to_inject.load() > 0 && failures_to_inject.fetch_sub(1) > 0) {
    TNT_THROW("cuDNN graph: execute attention forward {}: failure injected by a test", key.str());
  }
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
