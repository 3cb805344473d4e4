// When the fused CUDA attention engine applies (layers/attention_fused.hpp): host logic only,
// so it runs in every build. The kernels themselves are tested on a GPU
// (test_attention_fused_cuda.cpp).
#include <catch2/catch.hpp>

#include "layers/attention_fused.hpp"

using namespace tnt;

TEST_CASE("fused attention: kernel depth of each depth", "[layers][attention]") {
  CHECK(fused_attention_kernel_depth(16) == 32);
  CHECK(fused_attention_kernel_depth(32) == 32);
  CHECK(fused_attention_kernel_depth(48) == 64);
  CHECK(fused_attention_kernel_depth(64) == 64);
  CHECK(fused_attention_kernel_depth(80) == 128);
  CHECK(fused_attention_kernel_depth(128) == 128);
  for (int64_t d : {0, 1, 8, 15, 24, 40, 100, 129, 144, 256, -16}) {
    INFO("depth " << d);
    CHECK(fused_attention_kernel_depth(d) == 0);
  }
}

TEST_CASE("fused attention: applies to bf16/f16, depth 16..128 in 16s, non-empty shapes", "[layers][attention]") {
  // Transformer base and big: depth 64.
  CHECK(fused_attention_applies(DType::bf16, 64, 16, 256, 256, 64));
  CHECK(fused_attention_applies(DType::f16, 64, 8, 256, 256, 64));
  // Decoding (Tq = 1), odd lengths, one key.
  CHECK(fused_attention_applies(DType::bf16, 3, 2, 1, 300, 32));
  CHECK(fused_attention_applies(DType::bf16, 1, 1, 37, 50, 128));
  CHECK(fused_attention_applies(DType::f16, 1, 1, 1, 1, 16));
  // The unfused engine keeps f32 (and f64), and the `tiny` model's depth 8.
  CHECK_FALSE(fused_attention_applies(DType::f32, 64, 16, 256, 256, 64));
  CHECK_FALSE(fused_attention_applies(DType::f64, 2, 2, 8, 8, 64));
  CHECK_FALSE(fused_attention_applies(DType::bf16, 2, 4, 8, 8, 8));
  CHECK_FALSE(fused_attention_applies(DType::bf16, 2, 4, 8, 8, 24));
  CHECK_FALSE(fused_attention_applies(DType::bf16, 2, 4, 8, 8, 256));
  // Empty shapes.
  CHECK_FALSE(fused_attention_applies(DType::bf16, 0, 4, 8, 8, 64));
  CHECK_FALSE(fused_attention_applies(DType::bf16, 2, 0, 8, 8, 64));
  CHECK_FALSE(fused_attention_applies(DType::bf16, 2, 4, 0, 8, 64));
  CHECK_FALSE(fused_attention_applies(DType::bf16, 2, 4, 8, 0, 64));
  // Grid limits: B*H blocks in x (2^31 - 1), ceil(T / 64) tiles in y (65535).
  CHECK(fused_attention_applies(DType::bf16, 1, 1, 65535 * kFusedAttentionTile, 1, 64));
  CHECK_FALSE(fused_attention_applies(DType::bf16, 1, 1, 65535 * kFusedAttentionTile + 1, 1, 64));
  CHECK_FALSE(fused_attention_applies(DType::bf16, 1, 1, 1, 65535 * kFusedAttentionTile + 1, 64));
  CHECK_FALSE(fused_attention_applies(DType::bf16, int64_t{1} << 20, int64_t{1} << 12, 1, 1, 64));
}
