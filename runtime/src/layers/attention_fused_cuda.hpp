// The fused CUDA engine of the attention core (semantics in attention_cuda.hpp), for bf16
// and f16 with depth a multiple of 16 up to 128 (attention_fused.hpp). It reads q, k, v in
// their (B, T, H*d) layouts and never forms the (B, H, Tq, Tk) logits; attention_cuda.cu
// decides when it runs. Include from .cu files only.
#pragma once

#include "layers/attention_cuda.hpp"

namespace tnt::cuda {

// Whether `device` can run the kernels of this depth: compute capability 8.0 or newer
// (bf16 tensor cores, cp.async) and enough opt-in shared memory per block (the depth-128
// backward kernels need about 105 KB).
bool fused_attention_fits(int64_t depth, int device);

// q (B, Tq, D), k, v (B, Tk, D) in bf16/f16, key_ids (B, Tk) i32/i64 or undefined ->
// o (B, Tq, D) and stats (B, H, Tq, 2) f32: per query row the running maximum of its
// logits and 1 / (sum of exp(logit - maximum)), which the backward needs to rebuild the
// probabilities. (Not the log-sum-exp m + log(sum): where every key of a row is padding,
// m is about -1e9 and adding log(sum) to it would round away.) With dropout (a.rate > 0),
// keep: the forward's keep decisions, a bit each (i32 words in the kernels' own order,
// 512 bytes per 64 x 64 tile pair of a head), so that the backward draws no random numbers;
// undefined without dropout. warp_rows: query rows per warp of the forward kernel, 16 or 32
// (TNT_FUSED_ATTENTION_ROWS; 32 runs as 16 above depth 64: fused_attention_forward_rows);
// both give the same bits of o, stats and keep.
void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                             const AttentionCoreArgs& a, Tensor& o, Tensor& stats, Tensor& keep, int device,
                             int64_t warp_rows);

// d_o (B, Tq, D) -> dq (B, Tq, D), dk, dv (B, Tk, D); q, k, v, key_ids, o, stats, keep as above.
void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_ids,
                              const Tensor& o, const Tensor& stats, const Tensor& keep, const Tensor& d_o,
                              const AttentionCoreArgs& a, Tensor& dq, Tensor& dk, Tensor& dv, int device);

}  // namespace tnt::cuda
