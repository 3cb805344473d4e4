// When the fused CUDA attention engine applies (layers/attention_fused.hpp): host logic only,
// so it runs in every build. The kernels themselves are tested on a GPU
// (test_attention_fused_cuda.cpp).
#include <catch2/catch.hpp>

#include "layers/attention_fused.hpp"

#include <algorithm>

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

TEST_CASE("fused attention: causal tile skipping only where exact, never a visible key", "[layers][attention]") {
  // Skipping needs causal, no padding ids and Tq <= Tk.
  CHECK(fused_attention_causal_skip(true, false, 37, 50));
  CHECK(fused_attention_causal_skip(true, false, 50, 50));
  CHECK_FALSE(fused_attention_causal_skip(true, false, 50, 37));
  CHECK_FALSE(fused_attention_causal_skip(true, true, 37, 50));
  CHECK_FALSE(fused_attention_causal_skip(false, false, 37, 50));
  // Without skipping, every tile is visited.
  CHECK(fused_attention_key_end(false, 64, 300, 300) == 300);
  CHECK(fused_attention_query_begin(false, 256, 300, 300) == 0);
  // Self-attention, T = 300: query tile [64, 128) stops after key 127; key tile [128, 192)
  // starts at query tile 128; decoding with a cache (Tq = 1, Tk = 300) visits every key.
  CHECK(fused_attention_key_end(true, 64, 300, 300) == 128);
  CHECK(fused_attention_query_begin(true, 128, 300, 300) == 128);
  CHECK(fused_attention_key_end(true, 0, 1, 300) == 300);
  CHECK(fused_attention_query_begin(true, 256, 1, 300) == 0);
  // Exhaustively for lengths up to 140 (three tiles): a skipped (i, j) is always hidden
  // (j > i + Tk - Tq), every row keeps a visible key, and every tile's loop runs at least once.
  const int64_t tile = kFusedAttentionTile;
  int64_t skipped = 0;
  for (int64_t tk = 1; tk <= 140; ++tk) {
    for (int64_t tq = 1; tq <= tk; ++tq) {
      REQUIRE(fused_attention_causal_skip(true, false, tq, tk));
      for (int64_t q0 = 0; q0 < tq; q0 += tile) {
        const int64_t end = fused_attention_key_end(true, q0, tq, tk);
        REQUIRE(end >= 1);
        REQUIRE(end <= tk);
        for (int64_t i = q0; i < std::min(q0 + tile, tq); ++i) {
          REQUIRE(0 <= i + (tk - tq));  // key 0 is visible
          // (A plain test per pair and a message only on failure: millions of pairs, which
          // INFO/REQUIRE per pair made take minutes under the sanitizers.)
          for (int64_t j = end; j < tk; ++j) {
            if (j <= i + (tk - tq)) FAIL("Tq " << tq << " Tk " << tk << ": query " << i << " would skip visible key " << j);
            ++skipped;
          }
        }
      }
      for (int64_t k0 = 0; k0 < tk; k0 += tile) {
        const int64_t begin = fused_attention_query_begin(true, k0, tq, tk);
        REQUIRE(begin % tile == 0);
        REQUIRE(begin < tq);
        for (int64_t i = 0; i < begin; ++i) {
          for (int64_t j = k0; j < std::min(k0 + tile, tk); ++j) {
            if (j <= i + (tk - tq)) FAIL("Tq " << tq << " Tk " << tk << ": key tile " << k0 << " would skip query " << i);
          }
        }
      }
    }
  }
  CHECK(skipped > 0);  // the check above saw skipped pairs at all
}

TEST_CASE("fused attention: the 32-row forward's depths and block key bounds", "[layers][attention]") {
  // TNT_FUSED_ATTENTION_ROWS=32 runs 32 rows per warp up to kernel depth 64; 16 above (and
  // whatever 16 asks).
  for (int64_t d : {16, 32, 48, 64}) {
    INFO("depth " << d);
    CHECK(fused_attention_forward_rows(32, d) == 32);
    CHECK(fused_attention_forward_rows(16, d) == 16);
  }
  for (int64_t d : {80, 96, 128}) {
    INFO("depth " << d);
    CHECK(fused_attention_forward_rows(32, d) == 16);
  }
  // A 128-row block loads the key tiles its last query row needs: the larger bound of its
  // two 64-row tiles, or the first's where the second holds no row. With 64 rows it is the
  // tile's own bound. Exhaustively over lengths up to 300, skipping or not.
  const int64_t tile = kFusedAttentionTile;
  for (bool skip : {false, true}) {
    for (int64_t tk = 1; tk <= 300; tk += 7) {
      for (int64_t tq = 1; tq <= (skip ? tk : 300); ++tq) {
        for (int64_t q0 = 0; q0 < tq; q0 += tile) {
          if (fused_attention_block_key_end(skip, q0, tile, tq, tk) != fused_attention_key_end(skip, q0, tq, tk)) {
            FAIL("64 rows, Tq " << tq << " Tk " << tk << " q0 " << q0);
          }
        }
        for (int64_t q0 = 0; q0 < tq; q0 += 2 * tile) {
          const int64_t want = q0 + tile < tq ? std::max(fused_attention_key_end(skip, q0, tq, tk),
                                                         fused_attention_key_end(skip, q0 + tile, tq, tk))
                                              : fused_attention_key_end(skip, q0, tq, tk);
          if (fused_attention_block_key_end(skip, q0, 2 * tile, tq, tk) != want) {
            FAIL("128 rows, Tq " << tq << " Tk " << tk << " q0 " << q0 << (skip ? " skip" : ""));
          }
        }
      }
    }
  }
  // Self-attention, T = 300, causal: the block [128, 256) needs keys up to 255, the block
  // [256, 384) (rows 256..299) all 300.
  CHECK(fused_attention_block_key_end(true, 128, 128, 300, 300) == 256);
  CHECK(fused_attention_block_key_end(true, 256, 128, 300, 300) == 300);
  CHECK(fused_attention_block_key_end(true, 0, 128, 100, 100) == 100);
}
