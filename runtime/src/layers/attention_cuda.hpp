// The attention core's engines: what lies between the projections (done by the Dense
// children, which dispatch themselves) of MultiHeadAttention (attention.hpp). The CPU core
// is in attention.cpp, the CUDA core in attention_cuda.cu.
// Semantics of the core, per batch b and head h, d = depth, D = heads * d:
//   q_h = q[b, :, h*d:(h+1)*d] * scale (scale = d^-0.5), likewise k_h, v_h unscaled
//   logits (Tq, Tk) = q_h k_h^T + bias, bias -1e9 (float add) where key_ids[b, j] == 0 or,
//     when causal, j > i + (Tk - Tq)
//   p = softmax(logits) (float); pd = p * keep / (1 - rate) in training with rate > 0, keep
//     iff philox::uniform4(key, base + ((b*H + h)*Tq + i)*Tk + j) >= rate (Dropout's rule:
//     one Philox block for four consecutive counters), else pd = p
//   o[b, :, h*d:(h+1)*d] = pd v_h
// Mixed precision (CUDA): q, k, v, o and their gradients in the input dtype; logits f32;
// p, pd and the logits' gradients stored in the input dtype for the products (f32 sums).
#pragma once

#include "tarantella/layers/attention.hpp"

#include <memory>

namespace tnt {

struct AttentionCoreArgs {
  int64_t batch = 0, tq = 0, tk = 0, heads = 0, depth = 0;
  float scale = 1.0f;
  bool causal = false;
  float rate = 0.0f;   // dropout applied when > 0
  uint64_t key = 0;    // Philox key of the dropout mask
  uint64_t base = 0;   // counter of element 0 of this rank's probabilities
};

namespace cuda {

// Which engine runs the core. `config`: cuDNN's flash attention (attention_cudnn_cuda.hpp)
// where TNT_CUDNN_ATTENTION is on and its graph builds, else the fused one
// (attention_fused_cuda.cu) where TNT_FUSED_ATTENTION is on and it applies
// (attention_fused.hpp), else the unfused one. `fused`: the fused one wherever it applies,
// whatever the knobs say; `unfused`: never fused; `cudnn`: cuDNN's, and an error (with
// cuDNN's reason) where it does not apply or its graph does not build. The knobs are read once
// per process, so tests compare the engines through this.
enum class AttentionEngine { config, fused, unfused, cudnn };

// q (B, Tq, D), k, v (B, Tk, D), key_ids (B, Tk) or undefined -> o (B, Tq, D). state keeps
// what the backward needs, and which engine ran. The fused engine keeps q, k, v, key_ids and
// the returned o themselves, not copies: none of them may be changed in place before the
// backward (MultiHeadAttention only reads them).
Tensor attention_core_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                              const AttentionCoreArgs& args, std::shared_ptr<void>& state,
                              AttentionEngine engine = AttentionEngine::config);
// Whether the fused engine ran the forward that made this state.
bool attention_core_fused(const std::shared_ptr<void>& state);
// Forward and backward calls of the fused engine in this process so far: lets a test see
// that TNT_FUSED_ATTENTION reached a layer. Nothing else reads it.
int64_t attention_fused_calls();
// Whether the cuDNN engine ran the forward that made this state, and its forward and
// backward calls so far (as attention_fused_calls, for TNT_CUDNN_ATTENTION).
bool attention_core_cudnn(const std::shared_ptr<void>& state);
int64_t attention_cudnn_calls();
// Incremental decoding's cache update: old (B0, T, D), parents (B) i64 with values in
// [0, B0) (checked by the caller), fresh (B, 1, D) of old's dtype -> (B, T + 1, D), row b
// being old's row parents[b] then fresh's row b. A copy; the old cache is left as it was.
Tensor attention_cache_append(const Tensor& old, const Tensor& parents, const Tensor& fresh);
// d_o (B, Tq, D) -> dq (B, Tq, D), dk, dv (B, Tk, D).
void attention_core_backward(const Tensor& d_o, const std::shared_ptr<void>& state, Tensor& dq, Tensor& dk,
                             Tensor& dv);

}  // namespace cuda

}  // namespace tnt
