// The third CUDA engine of the attention core (semantics in attention_cuda.hpp): cuDNN's
// fused flash attention, reached through the graph (backend) API as an operation graph of
// MATMUL, POINTWISE, REDUCTION, RESHAPE and RNG nodes that cuDNN's runtime-fusion engines
// recognise as one flash-attention kernel (forward) and one backward.
//
// Why this graph and not CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR: those unified
// operations take a bias, a dropout seed and offset only from cuDNN 9.21 on (cudnn-frontend's
// support surface routes Hopper bf16 training with dropout and a bias to this composite graph
// below that); 9.19 is installed here. The composite graph is what cudnn-frontend itself
// builds for sm_90 (node/scaled_dot_product_flash_attention.h, CompositeSDPANode).
//
// Every descriptor attribute follows what cudnn-frontend sets for the same graph (checked
// attribute by attribute against node/scaled_dot_product_flash_attention.h, softmax.h,
// diagonal_band_mask.h, pointwise.h, rng.h and cudnn_frontend_Tensor.h): node order, virtual
// tensors' dtypes, dims and strides (the dO * O product's odd strides included), f32 math in
// every matmul, pointwise and reduction, alpha1 = alpha2 = 1 on every pointwise operation,
// IS_VIRTUAL / IS_BY_VALUE set only when true, 16-byte alignment, by-value f32 scalars,
// int64 seed and offset in device memory, Stats (B, H, Tq, 1) f32 packed, the backward's
// softmax sum and f32 dQ accumulator as our tensors (the frontend puts them in its own
// workspace; cuDNN sees user tensors either way). Heuristics mode A, then FALLBACK.
// Left different, each a form cuDNN is known to take: by-value scalars and the seed/offset
// are [1, 1, 1, 1] (today's frontend writes scalars as [1]; its earlier flash-attention
// samples and Transformer Engine used [1, 1, 1, 1]); the offset sits 16 bytes after the seed
// in one buffer (the 16-byte alignment every tensor declares); the dQ accumulator is zeroed
// by us although cuDNN from 9.6 no longer needs it (the frontend stops zeroing it there).
//
// Where it differs from the other engines, on purpose:
// - padding is an additive bias of -8192 (exact in bf16, f16 and f32), not -1e9: cuDNN saves
//   the softmax statistic as one log-sum-exp m + log(sum), and at m ~ -1e9 (a row whose keys
//   are all padding) the f32 ulp is 64, so log(sum) would be lost and the backward would
//   rebuild wrong probabilities. exp(-8192) is 0 in f32 like exp(-1e9), so rows with any real
//   key get the same probabilities unless their logits spread over more than ~8,000.
//   Its layout is the first of cudnn_attention_bias_layouts() that cuDNN builds both graphs
//   with (logged at info): the frontend never shows cuDNN a bias broadcast over query rows,
//   nor an f32 bias, so neither is known to be served on Hopper by 9.19; PyTorch shows it
//   (B, 1, Tq, Tk) dims with a query stride of 0 over per-key memory (an expanded mask), and
//   the frontend's own layout, (B, 1, Tq, Tk) in memory in the I/O dtype, is known to run.
// - causal (Tq == Tk only: top-left) replaces future logits by -inf (GEN_INDEX, CMP_GE,
//   BINARY_SELECT, the frontend's causal below cuDNN 9.21) instead of adding -1e9; the same
//   unless a row's visible keys are all padding (never with Tq == Tk: the diagonal is seen).
// - dropout draws cuDNN's own Philox stream (seed a.key, offset a.base): the kept set has
//   the same law (keep with probability 1 - rate, scaled by 1/(1 - rate)) but not the same
//   bits as the CPU, unfused or fused engines.
#pragma once

#include "layers/attention_cuda.hpp"

#include <limits>
#include <set>
#include <string>
#include <vector>

namespace tnt::cuda {

// Everything a plan depends on. The cache keys on it; dropout's rate is a constant inside
// the RNG node, so it is part of the key.
struct CudnnAttentionKey;

// How the padding bias reaches cuDNN: per key [B, 1, 1, Tk] or per query row [B, 1, Tq, Tk];
// in the I/O dtype or f32. Not part of the plan key: the engine finds it at plan-build time.
struct CudnnBiasLayout {
  bool per_row = false;   // (B, 1, Tq, Tk) in memory: the key's bias repeated for every query row
  bool f32 = false;       // f32 rather than the I/O dtype
  bool expanded = false;  // (B, 1, Tq, Tk) dims over per-key memory, query stride 0 (PyTorch's)
  std::string str() const;
};
// The layouts the engine tries, in order (see the header comment).
std::vector<CudnnBiasLayout> cudnn_attention_bias_layouts();
// Why the cuDNN library the process loaded (cudnnGetVersion's number, e.g. 91900) cannot run
// these graphs as written, or "" when it can. Every plan is refused with this reason (so the
// knob falls back to the other engines with a warning) on a machine whose cuDNN is older.
std::string cudnn_attention_version_problem(size_t version);

// For tests: padded keys are planned (on the device and deviceless) with layout `index` of
// cudnn_attention_bias_layouts() alone (an error if cuDNN refuses it), -1 (the default)
// restores the engine's order. Plans are cached per forced layout; keep one setting from a
// forward through its backward. So one GPU run can check every layout, not only the first
// that builds.
void cudnn_attention_force_bias_layout(int index);
// For tests: the next `count` cudnn_attention_forward calls throw as a failed execute would
// (before anything is queued), so that the knob's fallback can be checked on a GPU whose
// cuDNN runs every graph.
void cudnn_attention_fail_next_forwards(int count);

struct CudnnAttentionKey {
  int64_t batch = 0, tq = 0, tk = 0, heads = 0, depth = 0;
  DType dtype = DType::bf16;
  bool causal = false;
  bool bias = false;  // padding ids given
  float rate = 0.0f;  // dropout when > 0
  float scale = 1.0f;  // a by-value scalar, not baked in: kept for the log line only
  std::string str() const;
  bool operator<(const CudnnAttentionKey& o) const;
};

// Whether the cuDNN engine may be tried for these shapes (pure; no GPU): bf16/f16, depth a
// multiple of 8 up to 128 (what cuDNN's Hopper flash attention serves and we test), causal
// only with Tq == Tk (cuDNN's top-left diagonal equals our j > i + (Tk - Tq) rule only
// there), more than one query row (decoding's single row would need a plan per cache
// length), more than one key (a length cuDNN's SDPA is not known to serve), and nothing
// empty. Anything else goes to the other engines without a warning.
bool cudnn_attention_applies(DType dtype, int64_t batch, int64_t heads, int64_t tq, int64_t tk, int64_t depth,
                             bool causal);

// How many shapes (keys) one device plans at most. Each new key compiles two graphs with
// NVRTC (about 1.2 s for both here, deviceless for an H200; cuDNN 9.19's backward engine
// takes no dynamic shapes, so a kernel cache cannot share them) and keeps their kernels
// loaded. Training uses a handful (encoder, decoder and cross attention, for training and
// evaluation, and their last partial batches); decoding brings a new source length or
// prefix length with nearly every batch, and past the cap those run on the other engines
// instead of compiling for seconds each.
constexpr size_t kCudnnAttentionMaxShapes = 16;

// The cap's bookkeeping (pure; one per device in the engine, guarded by its lock): admit(key)
// is true for a key admitted before, and for a new one while fewer than `cap` were; the
// first refusal is reported by first_refusal() once (for one log line).
class CudnnShapeCap {
 public:
  explicit CudnnShapeCap(size_t cap = kCudnnAttentionMaxShapes) : cap_(cap) {}
  bool admit(const CudnnAttentionKey& key) {
    if (keys_.count(key) != 0) return true;
    if (keys_.size() >= cap_) {
      refused_ = true;
      return false;
    }
    keys_.insert(key);
    return true;
  }
  // True exactly once: after the first key admit() refused.
  bool first_refusal() {
    if (!refused_ || reported_) return false;
    reported_ = true;
    return true;
  }
  size_t admitted() const { return keys_.size(); }

 private:
  size_t cap_;
  std::set<CudnnAttentionKey> keys_;
  bool refused_ = false, reported_ = false;
};

// Builds every tensor and operation descriptor of the forward (backward) graph for key,
// finalized, without a cuDNN handle (so a CPU-only machine catches attribute mistakes), and
// describes them: the operations' names in graph order, each tensor ("name: " then
// graph::describe_tensor, read back from cuDNN) in creation order, and each pointwise
// operation's scale factors. Throws with cuDNN's message on failure.
struct CudnnAttentionGraphText {
  std::vector<std::string> ops, tensors, pointwise;
};
CudnnAttentionGraphText cudnn_attention_forward_graph(const CudnnAttentionKey& key,
                                                      const CudnnBiasLayout& layout = {});
CudnnAttentionGraphText cudnn_attention_backward_graph(const CudnnAttentionKey& key,
                                                       const CudnnBiasLayout& layout = {});

// What the cuDNN forward saves for its backward, besides q, k, v, o (held by the caller).
struct CudnnAttentionSaved {
  Tensor stats;        // (B, H, Tq, 1) f32: log-sum-exp of each row's scaled, biased logits
  Tensor bias;         // (B, 1, 1 or Tq, Tk) I/O dtype or f32 (0 or -8192), or undefined without key_ids
  Tensor seed_offset;  // (4) i64 on the device: a.key at 0, a.base at 2 (16-byte aligned), or undefined
};

// What cuDNN chose for the two graphs of a key: per graph its engine (global index), the
// heuristics mode and rank of the config, and the workspace; and the bias layout taken.
struct CudnnAttentionPlanInfo {
  CudnnBiasLayout bias_layout;
  int64_t forward_engine = -1, backward_engine = -1;
  int64_t forward_workspace = 0, backward_workspace = 0;
  // Deviceless without a CUDA driver: the kernels were generated but not loaded (Plan::compiled_only).
  bool forward_compiled_only = false, backward_compiled_only = false;
  std::string str() const;
};
// Builds both graphs of key and their execution plans for the GPU the device-properties
// JSON describes (graph::make_device_properties), without a GPU: cuDNN's heuristics and plan
// finalization for that GPU (its runtime-compiled engines compile their kernels here). The
// bias layouts are tried as on the GPU. Throws with every layout's reason if none builds.
// tests/layers/test_attention_cudnn.cpp runs it for an H200 on the CPU machines.
CudnnAttentionPlanInfo cudnn_attention_plan_deviceless(const CudnnAttentionKey& key, const std::string& device_json);

// Makes sure both plans of this key exist on device (building and caching them on first
// use). Throws with cuDNN's message (the same one again on later calls) if either graph
// cannot be built, before anything has run: the caller can still take another engine.
// Returns false, building nothing, for a new key past the device's kCudnnAttentionMaxShapes
// (logged once per device) when `capped`: the caller takes another engine without a
// warning. Uncapped (a test or benchmark forcing this engine), every key is planned and
// none counts against the cap.
bool cudnn_attention_prepare(const CudnnAttentionKey& key, int device, bool capped = true);

// q (B, Tq, D), k, v (B, Tk, D), key_ids (B, Tk) or undefined -> o (B, Tq, D), through the
// prepared forward plan on compute_stream(device). q, k, v are read in place through strided
// (B, H, T, d) views: no copies.
Tensor cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                               const AttentionCoreArgs& a, CudnnAttentionSaved& saved, int device);

// d_o (B, Tq, D) -> dq (B, Tq, D), dk, dv (B, Tk, D).
void cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& d_o,
                              const CudnnAttentionSaved& saved, const AttentionCoreArgs& a, Tensor& dq, Tensor& dk,
                              Tensor& dv, int device);

// The padding bias (B, 1, rows, Tk) in dtype from key_ids (B, Tk) i32/i64: kCudnnPaddingBias
// where the id is 0, else 0, the same for each of the rows; and the dropout seed/offset
// tensor. Kernels in attention_cudnn_bias_cuda.cu.
Tensor cudnn_attention_bias(const Tensor& key_ids, int64_t batch, int64_t rows, int64_t tk, DType dtype,
                            int device);
Tensor cudnn_attention_seed_offset(uint64_t key, uint64_t base, int device);

// The bias value at padding keys (2^13: exact in every dtype the bias may take), and the
// causal mask's replacement logit (a by-value scalar of the graphs), for tests.
constexpr float kCudnnPaddingBias = -8192.0f;
constexpr float kCudnnCausalMaskValue = -std::numeric_limits<float>::infinity();

}  // namespace tnt::cuda
