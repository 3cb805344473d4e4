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
// Where it differs from the other engines, on purpose:
// - padding is an additive bias (B, 1, 1, Tk) of -1e4 (or (B, 1, Tq, Tk) where cuDNN refuses
//   the broadcast over query rows: the frontend's support surface does not say), not -1e9: cuDNN saves the softmax
//   statistic as one log-sum-exp m + log(sum), and at m ~ -1e9 (a row whose keys are all
//   padding) the f32 ulp is 64, so log(sum) would be lost and the backward would rebuild
//   wrong probabilities. exp(-1e4) is 0 in f32 like exp(-1e9), so rows with any real key get
//   the same probabilities unless their logits spread over more than ~9,900.
// - causal (Tq == Tk only: top-left) replaces future logits by -1e9 (GEN_INDEX, CMP_GE,
//   BINARY_SELECT) instead of adding -1e9; the same unless a row's visible keys are all padding.
// - dropout draws cuDNN's own Philox stream (seed a.key, offset a.base): the kept set has
//   the same law (keep with probability 1 - rate, scaled by 1/(1 - rate)) but not the same
//   bits as the CPU, unfused or fused engines.
#pragma once

#include "layers/attention_cuda.hpp"

#include <string>
#include <vector>

namespace tnt::cuda {

// Everything a plan depends on. The cache keys on it; dropout's rate is a constant inside
// the RNG node, so it is part of the key.
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
// length), and nothing empty. Anything else goes to the other engines without a warning.
bool cudnn_attention_applies(DType dtype, int64_t batch, int64_t heads, int64_t tq, int64_t tk, int64_t depth,
                             bool causal);

// Builds every tensor and operation descriptor of the forward (backward) graph for key,
// finalized, without a cuDNN handle (so a CPU-only machine catches attribute mistakes), and
// returns the operations' names in graph order. Throws with cuDNN's message on failure.
// bias_rows: the padding bias as [B, 1, Tq, Tk] instead of [B, 1, 1, Tk] (the layout the
// engine falls back to where cuDNN refuses the broadcast over query rows).
std::vector<std::string> cudnn_attention_forward_ops(const CudnnAttentionKey& key, bool bias_rows = false);
std::vector<std::string> cudnn_attention_backward_ops(const CudnnAttentionKey& key, bool bias_rows = false);

// What the cuDNN forward saves for its backward, besides q, k, v, o (held by the caller).
struct CudnnAttentionSaved {
  Tensor stats;        // (B, H, Tq, 1) f32: log-sum-exp of each row's scaled, biased logits
  Tensor bias;         // (B, 1, 1 or Tq, Tk) f32 (0 or -1e4), or undefined without key_ids
  Tensor seed_offset;  // (4) i64 on the device: a.key at 0, a.base at 2 (16-byte aligned), or undefined
};

// Makes sure both plans of this key exist on device (building and caching them on first
// use). Throws with cuDNN's message (the same one again on later calls) if either graph
// cannot be built, before anything has run: the caller can still take another engine.
void cudnn_attention_prepare(const CudnnAttentionKey& key, int device);

// q (B, Tq, D), k, v (B, Tk, D), key_ids (B, Tk) or undefined -> o (B, Tq, D), through the
// prepared forward plan on compute_stream(device). q, k, v are read in place through strided
// (B, H, T, d) views: no copies.
Tensor cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                               const AttentionCoreArgs& a, CudnnAttentionSaved& saved, int device);

// d_o (B, Tq, D) -> dq (B, Tq, D), dk, dv (B, Tk, D).
void cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& d_o,
                              const CudnnAttentionSaved& saved, const AttentionCoreArgs& a, Tensor& dq, Tensor& dk,
                              Tensor& dv, int device);

// The padding bias (B, 1, rows, Tk) f32 from key_ids (B, Tk) i32/i64: -1e4 where the id is
// 0, else 0, the same for each of the rows; and the dropout seed/offset tensor. Kernels in
// attention_cudnn_bias_cuda.cu.
Tensor cudnn_attention_bias(const Tensor& key_ids, int64_t batch, int64_t rows, int64_t tk, int device);
Tensor cudnn_attention_seed_offset(uint64_t key, uint64_t base, int device);

// The bias value at padding keys, for tests.
constexpr float kCudnnPaddingBias = -1e4f;

}  // namespace tnt::cuda
