// When the fused CUDA attention engine (attention_fused_cuda.cu) can run the attention core
// (semantics in attention_cuda.hpp): a plain host function of the shapes, so that the rule
// is unit-tested without a GPU (tests/layers/test_attention_fused.cpp). attention_cuda.cu
// asks it when TNT_FUSED_ATTENTION is on; everything else runs the unfused engine.
#pragma once

#include "core/host_device.hpp"
#include "tarantella/dtype.hpp"

#include <cstdint>

namespace tnt {

// Query rows and key rows per tile of the fused kernels (each of 4 warps owns 16 rows; the
// forward's 32-row variant has blocks of two such query tiles, TNT_FUSED_ATTENTION_ROWS).
inline constexpr int64_t kFusedAttentionTile = 64;
// Depths are padded with zeros to the next instantiated kernel depth: 32, 64 or 128.
inline constexpr int64_t kFusedAttentionMaxDepth = 128;

// The kernel depth that runs `depth` (a multiple of 16 in [16, 128]), 0 for any other.
inline int64_t fused_attention_kernel_depth(int64_t depth) {
  if (depth < 16 || depth > kFusedAttentionMaxDepth || depth % 16 != 0) return 0;
  return depth <= 32 ? 32 : depth <= 64 ? 64 : 128;
}

// (models/transformer/main.cpp's memory check repeats the dtype and depth rule: with the
// fused engine no attention weights are kept for backward.)
// bf16 or f16 (the tensor-core inputs), depth a multiple of 16 up to 128, at least one
// batch row, head, query and key; the grids (B*H blocks in x, ceil(T / 64) tiles in y) must
// fit CUDA's limits. The device's shared memory is checked separately, at the launch
// (fused_attention_fits in attention_fused_cuda.hpp).
inline bool fused_attention_applies(DType dtype, int64_t batch, int64_t heads, int64_t tq, int64_t tk,
                                    int64_t depth) {
  if (dtype != DType::bf16 && dtype != DType::f16) return false;
  if (fused_attention_kernel_depth(depth) == 0) return false;
  if (batch < 1 || heads < 1 || tq < 1 || tk < 1) return false;
  if (batch > INT32_MAX / heads) return false;
  const int64_t longest = tq > tk ? tq : tk;
  return (longest + kFusedAttentionTile - 1) / kFusedAttentionTile <= 65535;
}

// Causal tile skipping. Query row i sees keys j <= i + (Tk - Tq); a key tile past that
// bound for every row of a query tile holds only hidden keys, whose probabilities are
// exp(about -1e9) = 0 exactly, so the kernels may skip it, but only where every query row
// keeps at least one visible key: no padding ids (a row could see padding only) and
// Tq <= Tk (row 0 sees key 0). Otherwise a row whose keys are all hidden gets the
// near-uniform softmax over ALL its keys, skipped ones included, and nothing is skipped.
TNT_HD bool fused_attention_causal_skip(bool causal, bool has_ids, int64_t tq, int64_t tk) {
  return causal && !has_ids && tq <= tk;
}

// The end (exclusive) of the keys that the query tile [q0, q0 + 64) must visit: Tk, or
// with skipping, one past the last row's last visible key.
TNT_HD int64_t fused_attention_key_end(bool skip, int64_t q0, int64_t tq, int64_t tk) {
  if (!skip) return tk;
  const int64_t end = q0 + kFusedAttentionTile + (tk - tq);
  return end < tk ? end : tk;
}

// The end of the keys that a forward block of `rows` query rows (64 or 128) from q0 (< Tq)
// must load: the bound of its last 64-row tile that holds a query row, the largest of its
// tiles' bounds (key_end grows with q0). With 64 rows, key_end of the block itself.
TNT_HD int64_t fused_attention_block_key_end(bool skip, int64_t q0, int64_t rows, int64_t tq, int64_t tk) {
  const int64_t last = (q0 + rows < tq ? q0 + rows : tq) - 1;  // the block's last query row
  return fused_attention_key_end(skip, last - last % kFusedAttentionTile, tq, tk);
}

// Query rows per warp of the forward kernel that runs when TNT_FUSED_ATTENTION_ROWS asks
// for `asked` (16 or 32): 32 only up to kernel depth 64. The 32-row kernel at depth 64
// already takes 236 of a thread's 255 registers (ptxas, sm_90); depth 128 would add 2 x 32
// output accumulators per thread and spill, so the 16-row kernel runs there.
inline int64_t fused_attention_forward_rows(int64_t asked, int64_t depth) {
  const int64_t kd = fused_attention_kernel_depth(depth);
  return asked == 32 && kd != 0 && kd <= 64 ? 32 : 16;
}

// The first query tile (a multiple of 64) that the key tile [k0, k0 + 64) must visit: 0,
// or with skipping, the tile of the first row that sees key k0 (i + Tk - Tq >= k0).
TNT_HD int64_t fused_attention_query_begin(bool skip, int64_t k0, int64_t tq, int64_t tk) {
  if (!skip) return 0;
  const int64_t first = k0 - (tk - tq);
  return first > 0 ? first / kFusedAttentionTile * kFusedAttentionTile : 0;
}

}  // namespace tnt
