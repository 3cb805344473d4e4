// The fused CUDA attention engine (attention_fused_cuda.cu) against the unfused one
// (attention_cuda.cu) on the same device and inputs: forward o and backward dq, dk, dv, in
// bf16 and f16, over depths, masks, odd lengths, decoding and dropout. Both half engines
// are also measured against the unfused engine in f32 on the same (rounded) inputs, and
// the fused one must not be much worse than the unfused one. Label gpu: needs a GPU.
//
// Tolerances. Inputs are uniform in [-1, 1]. Both half engines compute the logits and
// every product in f32 (cuBLAS or WMMA accumulators) from the same rounded q * scale, k, v,
// dO; they differ in where they round to the half format: the unfused engine rounds the
// normalised probabilities p, dS and each product's output, the fused one rounds
// unnormalised probabilities exp(l - m_running), dS and only the final outputs. Each such
// rounding is a relative error of at most one unit u (2^-8 bf16, 2^-11 f16) of a term, and
// every output element is a convex-like combination (o: weights summing to 1; dv: column
// sums of p; dq, dk: sums of |dS| <= 2 max|dP|) of such terms, so each engine is off by a
// few u times the output's scale. We allow kUnits = 8 units of max|reference| between the
// engines (4 roundings on each side), per element. A wrong mask, tile tail, scale or
// dropout draw moves outputs by a sizeable fraction of their scale: the dropout case
// below checks that rate 0.1 against rate 0 differs by more than this tolerance, so the
// comparison can fail. And the fused engine must be within 2x the unfused engine's own
// error against f32, plus 2 u of scale (both see the same input roundings).
#include "gpu_test_util.hpp"

#include "layers/attention_cuda.hpp"
#include "layers/attention_fused.hpp"
#include "layers/attention_fused_cuda.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace tnt;
using cuda::AttentionEngine;
using tnt::test::gpu;
using tnt::test::kUnitBf16;
using tnt::test::kUnitF16;
using tnt::test::max_abs;
using tnt::test::require_close;
using tnt::test::require_equal;

namespace {

constexpr double kUnits = 8.0;  // allowed difference between the engines, in units of max|ref|
// Absolute floor: where a sum cancels exactly in exact arithmetic (Tq = Tk = 1: dS = p (dP -
// dO.O) = 0), the engines keep f32 rounding residue of 64-term dot products (~1e-5 of the
// terms' sum ~16, times scale): far below 1e-4, which is itself far below real outputs.
constexpr double kFloor = 1e-4;

enum class Ids { none, i32, i64 };

struct Case {
  DType dtype;
  int64_t batch, heads, tq, tk, depth;
  bool causal = false;
  Ids ids = Ids::none;
  float rate = 0.0f;
  bool odd_gradient = false;  // dO a view 2 bytes into its storage (the engine copies it)
  // Dropout's first counter. 777 (not 0: as on a rank other than the first) puts each lane's
  // 4 keys at offset 1 or 3 of a Philox block; 0 and 2 with Tk a multiple of 4 give the
  // offsets 0 (one block per 4 keys, rank 0's usual case) and 2 (4 keys straddle 2 blocks).
  uint64_t base = 777;
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.dtype)) + " B" + std::to_string(c.batch) + " H" + std::to_string(c.heads) + " Tq" +
         std::to_string(c.tq) + " Tk" + std::to_string(c.tk) + " d" + std::to_string(c.depth) +
         (c.causal ? " causal" : "") + (c.ids == Ids::i32 ? " ids32" : c.ids == Ids::i64 ? " ids64" : "") +
         " rate " + std::to_string(c.rate) + " base " + std::to_string(c.base);
}

double unit_of(DType dt) { return dt == DType::bf16 ? kUnitBf16 : kUnitF16; }

// Key ids (B, Tk): batch row 1 is all padding (its softmax is the near-uniform one over
// -1e9-biased logits); row 2 starts with 2/3 of Tk padding keys (with Tk = 300, whole key
// tiles of padding come before the first real key: the running max must forget them);
// the others end in b % 3 padding keys and have one in the middle.
Tensor make_ids(const Case& c) {
  std::vector<int64_t> v(static_cast<size_t>(c.batch * c.tk));
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t j = 0; j < c.tk; ++j) {
      const bool pad = b == 1 || (b == 2 && j < c.tk * 2 / 3) || j >= c.tk - b % 3 || (c.tk > 2 && j == c.tk / 2);
      v[static_cast<size_t>(b * c.tk + j)] = pad ? 0 : 1 + j % 5;
    }
  }
  if (c.ids == Ids::i32) {
    std::vector<int32_t> v32(v.begin(), v.end());
    return Tensor::from_data(v32.data(), {c.batch, c.tk}).to(gpu());
  }
  return Tensor::from_data(v.data(), {c.batch, c.tk}).to(gpu());
}

struct Inputs {
  Tensor q, k, v, ids, d_o;  // on the GPU, in the case's dtype (ids i32/i64 or undefined)
};

Inputs make_inputs(const Case& c, const std::string& key) {
  const int64_t D = c.heads * c.depth;
  auto half = [&](const Shape& s, const std::string& name) {
    return ops::cast(test::random_tensor(s, key + name).to(gpu()), c.dtype);
  };
  Inputs in;
  in.q = half({c.batch, c.tq, D}, "_q");
  in.k = half({c.batch, c.tk, D}, "_k");
  in.v = half({c.batch, c.tk, D}, "_v");
  in.d_o = half({c.batch, c.tq, D}, "_do");
  if (c.ids != Ids::none) in.ids = make_ids(c);
  return in;
}

AttentionCoreArgs args_of(const Case& c, float rate) {
  AttentionCoreArgs a;
  a.batch = c.batch;
  a.tq = c.tq;
  a.tk = c.tk;
  a.heads = c.heads;
  a.depth = c.depth;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.depth));
  a.causal = c.causal;
  a.rate = rate;
  a.key = 0x5eed1234abcdULL;
  a.base = c.base;
  return a;
}

struct Result {
  bool fused = false;
  Tensor o, dq, dk, dv;  // f32 on the host
};

Tensor host_f32(const Tensor& t) { return ops::cast(t, DType::f32).to(Device::cpu()); }

// The same values as t in a view that starts 2 bytes into a larger storage: not 16-byte
// aligned, as a gradient handed over by another layer may be.
Tensor misaligned_copy(const Tensor& t) {
  const size_t elem = dtype_size(t.dtype());
  Tensor big = Tensor::zeros({t.numel() + 16}, t.dtype(), t.device());
  Tensor view = big.view(t.shape(), t.dtype(), elem);
  ops::copy_cast(t, view);
  return view;
}

// Forward and backward of the core, inputs cast to `dtype` (f32: the reference).
Result run(const Inputs& in, const AttentionCoreArgs& a, AttentionEngine engine, DType dtype,
           bool odd_gradient = false) {
  auto as = [&](const Tensor& t) { return t.dtype() == dtype ? t : ops::cast(t, dtype); };
  std::shared_ptr<void> state;
  const Tensor o = cuda::attention_core_forward(as(in.q), as(in.k), as(in.v), in.ids, a, state, engine);
  Result r;
  r.fused = cuda::attention_core_fused(state);
  Tensor dq, dk, dv;
  const Tensor g = as(in.d_o);
  cuda::attention_core_backward(odd_gradient ? misaligned_copy(g) : g, state, dq, dk, dv);
  REQUIRE(o.dtype() == dtype);
  REQUIRE(dq.dtype() == dtype);
  r.o = host_f32(o);
  r.dq = host_f32(dq);
  r.dk = host_f32(dk);
  r.dv = host_f32(dv);
  return r;
}


// One output of both engines against each other and against the f32 reference.
void compare(const Tensor& fused, const Tensor& unfused, const Tensor& ref, double unit, const std::string& what) {
  const double scale = max_abs(ref);
  test::check_all_close(fused, unfused, kUnits * unit * scale + kFloor, what + " fused vs unfused");
  const double err_fused = test::max_abs_diff(fused, ref), err_unfused = test::max_abs_diff(unfused, ref);
  INFO(what << ": max |fused - f32| " << err_fused << ", max |unfused - f32| " << err_unfused << ", scale "
            << scale);
  CHECK(err_fused <= 2.0 * err_unfused + 2.0 * unit * scale + kFloor);
}

void check_case(const Case& c) {
  INFO(describe(c));
  REQUIRE(fused_attention_applies(c.dtype, c.batch, c.heads, c.tq, c.tk, c.depth));
  const Inputs in = make_inputs(c, "fa" + std::to_string(c.tq) + "_" + std::to_string(c.tk));
  const AttentionCoreArgs a = args_of(c, c.rate);
  const Result fused = run(in, a, AttentionEngine::fused, c.dtype, c.odd_gradient);
  const Result unfused = run(in, a, AttentionEngine::unfused, c.dtype);
  const Result ref = run(in, a, AttentionEngine::unfused, DType::f32);
  CHECK_FALSE(unfused.fused);
  CHECK_FALSE(ref.fused);
  // Where the GPU's shared memory is too small for this depth's kernels (depth 128 on an
  // A100, 64 on sm_86/89), the unfused engine runs instead: then that is what is checked.
  // On the GPUs this build targets first (Hopper: 227 KB of shared memory per block) every
  // depth the kernels take fits, so a fallback there is a failure, not a pass.
  const bool fits = cuda::fused_attention_fits(c.depth, gpu().index);
  CHECK(fused.fused == fits);
  if (!fits) {
    int major = 0;
    REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu().index) == cudaSuccess);
    WARN(describe(c) << ": the fused kernels do not fit this GPU's shared memory; the unfused engine ran");
    CHECK(major < 9);
    // What ran instead is the unfused engine, bit for bit.
    test::check_all_close(fused.o, unfused.o, 0.0, "o (fallback)");
    test::check_all_close(fused.dq, unfused.dq, 0.0, "dq (fallback)");
    test::check_all_close(fused.dk, unfused.dk, 0.0, "dk (fallback)");
    test::check_all_close(fused.dv, unfused.dv, 0.0, "dv (fallback)");
    return;
  }
  const double u = unit_of(c.dtype);
  compare(fused.o, unfused.o, ref.o, u, "o");
  compare(fused.dq, unfused.dq, ref.dq, u, "dq");
  compare(fused.dk, unfused.dk, ref.dk, u, "dk");
  compare(fused.dv, unfused.dv, ref.dv, u, "dv");
  // No atomics: a second run gives the same bits.
  const Result again = run(in, a, AttentionEngine::fused, c.dtype);
  test::check_all_close(again.o, fused.o, 0.0, "o again");
  test::check_all_close(again.dq, fused.dq, 0.0, "dq again");
  test::check_all_close(again.dk, fused.dk, 0.0, "dk again");
  test::check_all_close(again.dv, fused.dv, 0.0, "dv again");
  if (c.rate > 0.0f) {
    // The comparison above could fail: without dropout the outputs move by more than
    // its tolerance, so agreeing within it means the same mask.
    const Result plain = run(in, args_of(c, 0.0f), AttentionEngine::fused, c.dtype);
    CHECK(test::max_abs_diff(plain.o, fused.o) > kUnits * u * max_abs(ref.o) + kFloor);
    CHECK(test::max_abs_diff(plain.dv, fused.dv) > kUnits * u * max_abs(ref.dv) + kFloor);
  }
}

}  // namespace

TEST_CASE("Fused attention matches the unfused engine: depths and masks", "[gpu][attention]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    // Self-attention with padding (batch row 1 all padding), cross lengths not multiples
    // of the 64-row tile, every kernel depth and two padded depths (16 -> 32, 48 -> 64).
    check_case({dt, 3, 2, 37, 50, 64, false, Ids::i64});
    check_case({dt, 2, 3, 50, 37, 32, false, Ids::i32});
    check_case({dt, 2, 2, 37, 50, 128, false, Ids::i64});
    check_case({dt, 2, 2, 45, 45, 16, false, Ids::i32});
    check_case({dt, 2, 2, 70, 70, 48, false, Ids::none});
  }
}

TEST_CASE("Fused attention matches the unfused engine: causal, decoding, long and tiny", "[gpu][attention]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    // Causal, Tq < Tk without ids: key tiles past the diagonal are skipped.
    check_case({dt, 2, 2, 37, 50, 64, true});
    check_case({dt, 2, 2, 300, 300, 64, true});
    // Causal, Tq > Tk: the first rows see no key (near-uniform rows); no skipping.
    check_case({dt, 2, 2, 50, 37, 64, true});
    // Causal with padding: no skipping (a row may see only padding).
    check_case({dt, 3, 2, 37, 50, 32, true, Ids::i32});
    // Decoding: one query over a cache of 300 (5 key tiles, the last partial), and 1 x 1.
    check_case({dt, 3, 2, 1, 300, 64, false, Ids::i64});
    check_case({dt, 3, 2, 1, 37, 64, true});
    check_case({dt, 1, 2, 1, 1, 64});
    // Many query and key tiles, cross-attention.
    check_case({dt, 3, 2, 130, 300, 128, false, Ids::i64});
    // Causal over several tiles with Tk - Tq = 70: query tile 0 stops at key 134 (tile
    // 128), key tile 192 starts at query tile 64 (a sign error in the bounds shows here).
    check_case({dt, 2, 2, 130, 200, 64, true});
    // Causal with padding over several tiles (no skipping), and lengths that are whole
    // tiles (no tail).
    check_case({dt, 3, 2, 130, 130, 64, true, Ids::i64});
    check_case({dt, 2, 2, 128, 128, 64, false, Ids::i32});
    // A depth padded to the 128 kernel, and a gradient that is not 16-byte aligned.
    check_case({dt, 2, 2, 70, 90, 96, false, Ids::i32});
    check_case({dt, 2, 2, 70, 90, 64, false, Ids::i64, 0.0f, true});
  }
}

TEST_CASE("Fused attention matches the unfused engine under dropout 0.1 (the same mask)", "[gpu][attention]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    check_case({dt, 3, 2, 37, 50, 64, false, Ids::i64, 0.1f});
    check_case({dt, 2, 2, 100, 100, 64, true, Ids::none, 0.1f});
    check_case({dt, 2, 2, 1, 70, 32, false, Ids::i32, 0.1f});
    // Tiles with no mask at all (plain_scores) in all three kernels under dropout, compared
    // with the unfused engine: the dK/dV kernel's plain loop needs a whole 64-row query tile
    // wholly below the diagonal, which no case above has under dropout, and no case above has
    // a plain tile at depth 32 (the 32-row test compares kernels with each other only). With
    // them every Philox offset of keep_words8: 0 (base 0, Tk 200), 2 (base 2), 0 and 2 by
    // row (base 0, Tk 130), 1 and 3 (base 777, Tk 302).
    check_case({dt, 2, 2, 130, 200, 32, false, Ids::none, 0.1f, false, 0});
    check_case({dt, 2, 2, 200, 200, 64, true, Ids::none, 0.1f, false, 2});
    // Causal with Tq > Tk (diagonal offset -70, no skipping, rows 0-69 see no key) over
    // several tiles, plain ones among them.
    check_case({dt, 2, 2, 200, 130, 64, true, Ids::none, 0.1f, false, 0});
    // Padding tiles and plain ones in one row (batch row 2: its first 201 keys padding).
    check_case({dt, 3, 2, 130, 302, 64, false, Ids::i32, 0.1f});
  }
}

namespace {

// The fused core's forward with `warp_rows` query rows per warp, then its backward: every
// output as the kernels wrote it.
struct Direct {
  Tensor o, stats, keep, dq, dk, dv;  // on the GPU (keep undefined without dropout)
};

Direct run_direct(const Inputs& in, const AttentionCoreArgs& a, int64_t warp_rows) {
  Direct r;
  cuda::fused_attention_forward(in.q, in.k, in.v, in.ids, a, r.o, r.stats, r.keep, gpu().index, warp_rows);
  cuda::fused_attention_backward(in.q, in.k, in.v, in.ids, r.o, r.stats, r.keep, in.d_o, a, r.dq, r.dk, r.dv,
                                 gpu().index);
  return r;
}

// The bytes of a and b (same dtype and shape) are the same: -0 against +0 and any NaN
// payload count as differences here, unlike in check_close.
void check_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.shape() == b.shape());
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  const size_t elem = dtype_size(a.dtype());
  const auto* px = static_cast<const unsigned char*>(x.raw());
  const auto* py = static_cast<const unsigned char*>(y.raw());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(px + i * elem, py + i * elem, elem) != 0) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  INFO(what << ": " << bad << " of " << a.numel() << " elements differ in their bits; first at flat index "
            << first);
  CHECK(bad == 0);
}

// The keep words the backward reads (FusedParams::keep): per (b*H + h, 64-row query tile qt,
// key tile kt) 128 words, for the key tiles qt visits (fused_attention_key_end); the words
// of skipped tile pairs are never written.
void check_same_keep(const Tensor& a, const Tensor& b, const Case& c) {
  const int64_t tile = kFusedAttentionTile, q_tiles = (c.tq + tile - 1) / tile, k_tiles = (c.tk + tile - 1) / tile;
  REQUIRE(a.numel() == c.batch * c.heads * q_tiles * k_tiles * 128);
  REQUIRE(b.numel() == a.numel());
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  const auto* wx = static_cast<const uint32_t*>(x.raw());
  const auto* wy = static_cast<const uint32_t*>(y.raw());
  const bool skip = fused_attention_causal_skip(c.causal, c.ids != Ids::none, c.tq, c.tk);
  int64_t bad = 0, read = 0, kept = 0;
  std::string first;
  for (int64_t bh = 0; bh < c.batch * c.heads; ++bh) {
    for (int64_t qt = 0; qt < q_tiles; ++qt) {
      const int64_t end = fused_attention_key_end(skip, qt * tile, c.tq, c.tk);
      for (int64_t kt = 0; kt * tile < end; ++kt) {
        for (int64_t w = 0; w < 128; ++w) {
          const int64_t at = ((bh * q_tiles + qt) * k_tiles + kt) * 128 + w;
          ++read;
          kept += __builtin_popcount(wx[at]);
          if (wx[at] != wy[at]) {
            if (bad++ == 0) {
              first = "bh " + std::to_string(bh) + " query tile " + std::to_string(qt) + " key tile " +
                      std::to_string(kt) + " word " + std::to_string(w);
            }
          }
        }
      }
    }
  }
  INFO("keep words: " << bad << " of " << read << " read by the backward differ; first at " << first);
  CHECK(bad == 0);
  CHECK(kept > 0);  // dropout 0.1 keeps about 90% of the probabilities: the words are there
}

void check_rows_bits(const Case& c) {
  INFO(describe(c));
  REQUIRE(fused_attention_applies(c.dtype, c.batch, c.heads, c.tq, c.tk, c.depth));
  const Inputs in = make_inputs(c, "fr" + std::to_string(c.tq) + "_" + std::to_string(c.tk));
  const AttentionCoreArgs a = args_of(c, c.rate);
  const Direct r16 = run_direct(in, a, 16);
  const Direct r32 = run_direct(in, a, 32);
  check_same_bits(r32.o, r16.o, "o");
  check_same_bits(r32.stats, r16.stats, "stats (row max, 1 / row sum)");
  if (c.rate > 0.0f) {
    REQUIRE(r16.keep.defined());
    REQUIRE(r32.keep.defined());
    check_same_keep(r32.keep, r16.keep, c);
  } else {
    CHECK_FALSE(r32.keep.defined());
  }
  // The backward of each forward (its o, statistics and keep bits): the same bits too.
  check_same_bits(r32.dq, r16.dq, "dq");
  check_same_bits(r32.dk, r16.dk, "dk");
  check_same_bits(r32.dv, r16.dv, "dv");
}

}  // namespace

// TNT_FUSED_ATTENTION_ROWS: the forward with 32 query rows per warp (blocks of 128 rows)
// gives exactly the bits of the 16-row one: o, the row statistics, the dropout keep words
// the backward reads, and so the backward's outputs. Query lengths around the 64- and
// 128-row block edges (a block whose second 64-row tile is partly or wholly past Tq),
// self- and cross-attention (Tk = Tq + 70: causal bounds inside key tiles), causal
// (skipping key tiles, per warp in the 32-row kernel) or not, with and without padding
// keys, dropout 0 and 0.1, kernel depths 32 and 64 (and 48, zero columns in the 64
// kernel); depth 128 runs the 16-row kernel for both (fused_attention_forward_rows).
TEST_CASE("Fused attention: 32 query rows per warp give the bits of 16", "[gpu][attention][rows_bits]") {
  if (!cuda::fused_attention_fits(64, gpu().index)) {
    int major = 0;
    REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu().index) == cudaSuccess);
    WARN("the fused kernels do not fit this GPU's shared memory: nothing to compare");
    CHECK(major < 9);
    return;
  }
  const std::vector<int64_t> lengths{1, 63, 64, 65, 127, 128, 129, 256, 300};
  for (int64_t tq : lengths) {
    for (int64_t tk : {tq, tq + 70}) {
      for (bool causal : {false, true}) {
        for (Ids ids : {Ids::none, Ids::i64}) {
          for (float rate : {0.0f, 0.1f}) {
            for (int64_t depth : {32, 64}) check_rows_bits({DType::bf16, 3, 2, tq, tk, depth, causal, ids, rate});
            check_rows_bits({DType::f16, 3, 2, tq, tk, 64, causal, ids, rate});
          }
        }
      }
    }
  }
  for (int64_t tq : {65, 129, 300}) {
    check_rows_bits({DType::bf16, 3, 2, tq, tq, 48, true, Ids::none, 0.1f});
    check_rows_bits({DType::bf16, 3, 2, tq, tq + 70, 48, false, Ids::i32, 0.0f});
    if (cuda::fused_attention_fits(128, gpu().index)) {
      check_rows_bits({DType::bf16, 3, 2, tq, tq, 128, true, Ids::none, 0.1f});
    }
  }
}

// Under the CTest entry layers_attention_fused_cuda_rows32 (TNT_FUSED_ATTENTION_ROWS=32)
// every case above runs the 32-row forward through attention_core_forward; this says the
// variable reached the configuration that attention_cuda.cu passes on.
TEST_CASE("TNT_FUSED_ATTENTION_ROWS reaches the configuration", "[gpu][attention]") {
  const char* env = std::getenv("TNT_FUSED_ATTENTION_ROWS");
  CHECK(tnt::config().fused_attention_rows == (env != nullptr ? std::stoll(env) : 16));
}

TEST_CASE("Fused attention does not run where it does not apply", "[gpu][attention]") {
  // f32, and the `tiny` model's depth 8 in bf16: the unfused engine runs even when the
  // fused one is asked for, with the same results as asking for the unfused one.
  for (const Case& c : {Case{DType::f32, 2, 2, 9, 11, 64}, Case{DType::bf16, 2, 4, 9, 11, 8},
                        Case{DType::f16, 2, 2, 9, 11, 24}}) {
    INFO(describe(c));
    const Inputs in = make_inputs(c, "fa_off");
    const AttentionCoreArgs a = args_of(c, 0.0f);
    const int64_t calls = cuda::attention_fused_calls();
    const Result asked = run(in, a, AttentionEngine::fused, c.dtype);
    const Result unfused = run(in, a, AttentionEngine::unfused, c.dtype);
    CHECK_FALSE(asked.fused);
    CHECK(cuda::attention_fused_calls() == calls);
    require_equal(asked.o, unfused.o, "o");
    require_equal(asked.dq, unfused.dq, "dq");
  }
  // And the knob is on by default: this process runs without TNT_FUSED_ATTENTION.
  if (std::getenv("TNT_FUSED_ATTENTION") == nullptr) {
    CHECK(tnt::config().fused_attention);
    const Case c{DType::bf16, 2, 2, 9, 11, 64};
    const Inputs in = make_inputs(c, "fa_default");
    CHECK(run(in, args_of(c, 0.0f), AttentionEngine::config, c.dtype).fused);
  }
}

// Run by the CTest entry layers_attention_fused_cuda_env with TNT_FUSED_ATTENTION=1: the
// whole MultiHeadAttention layer in bf16 (depth 64 / 4 = 16, padded to the 32 kernel)
// takes the fused core, and matches the f32 CPU layer (the CPU core of attention.cpp).
TEST_CASE("TNT_FUSED_ATTENTION=1: MultiHeadAttention runs the fused core, against the f32 CPU", "[.fused_env]") {
  const char* env = std::getenv("TNT_FUSED_ATTENTION");
  REQUIRE(env != nullptr);
  REQUIRE(std::string(env) == "1");
  REQUIRE(tnt::config().fused_attention);
  const MultiHeadAttentionOptions options{.num_heads = 4, .causal = true};
  auto a = std::make_shared<MultiHeadAttention>(int64_t{64}, options, std::string("attn_fused"));
  auto b = std::make_shared<MultiHeadAttention>(int64_t{64}, options, std::string("attn_fused"));
  b->to(gpu());
  a->ensure_built({{1, 1, 64}});
  b->ensure_built({{1, 1, 64}});
  a->initialize(11);
  b->initialize(11);
  for (Parameter* p : b->parameters()) p->compute = ops::cast(p->value, DType::bf16);
  const Tensor x = test::random_tensor({2, 37, 64}, "fused_env_x");
  const int64_t calls = cuda::attention_fused_calls();
  SavedState sa, sb;
  const Tensor y_cpu = a->forward({x}, test::layer_context(true, Device::cpu()), sa)[0];
  const Tensor y_gpu = b->forward({ops::cast(x.to(gpu()), DType::bf16)}, test::layer_context(true, gpu()), sb)[0];
  CHECK(cuda::attention_fused_calls() == calls + 1);
  CHECK(y_gpu.dtype() == DType::bf16);
  // As the layer's bf16 test in test_transformer_layers_cuda.cpp: x, the weights, q, k, v,
  // p and o each rounded once to 8 significant bits, through products of <= 64 terms of
  // O(0.3); outputs O(0.5): 3e-2 is ~8 roundings' worth, far below a wrong path's O(1).
  require_close(host_f32(y_gpu), y_cpu, 3e-2, 3e-2, "y bf16 fused");
  const Tensor dy = ops::cast(test::random_tensor(y_cpu.shape(), "fused_env_dy").to(gpu()), DType::bf16);
  const std::vector<Tensor> dx = b->backward({dy}, test::layer_context(true, gpu()), sb);
  CHECK(cuda::attention_fused_calls() == calls + 2);
  REQUIRE(dx.size() >= 1);
  REQUIRE(dx[0].defined());
  for (double v : host_f32(dx[0]).to_double_vector()) REQUIRE(std::isfinite(v));
}

// Run by the CTest entry layers_attention_fused_cuda_off with TNT_FUSED_ATTENTION=0: the
// switch that turns the default off reaches the layer, which then runs the unfused core.
TEST_CASE("TNT_FUSED_ATTENTION=0: MultiHeadAttention runs the unfused core", "[.unfused_env]") {
  const char* env = std::getenv("TNT_FUSED_ATTENTION");
  REQUIRE(env != nullptr);
  REQUIRE(std::string(env) == "0");
  REQUIRE_FALSE(tnt::config().fused_attention);
  auto b = std::make_shared<MultiHeadAttention>(int64_t{64}, MultiHeadAttentionOptions{.num_heads = 4},
                                                std::string("attn_unfused"));
  b->to(gpu());
  b->ensure_built({{1, 1, 64}});
  b->initialize(11);
  for (Parameter* p : b->parameters()) p->compute = ops::cast(p->value, DType::bf16);
  const Tensor x = ops::cast(test::random_tensor({2, 37, 64}, "unfused_env_x").to(gpu()), DType::bf16);
  const int64_t calls = cuda::attention_fused_calls();
  SavedState s;
  const Tensor y = b->forward({x}, test::layer_context(true, gpu()), s)[0];
  b->backward({ops::cast(test::random_tensor(y.shape(), "unfused_env_dy").to(gpu()), DType::bf16)},
              test::layer_context(true, gpu()), s);
  CHECK(cuda::attention_fused_calls() == calls);
}

// Run by the CTest entry layers_attention_fused_cuda_stored_ds, with every visible case,
// under TNT_FUSED_ATTENTION_STORED_DS=1: there the fused backward's dQ comes from the dS
// the dK/dV kernel stored, and every comparison above holds for it too; this case fails if
// the variable did not reach the process.
TEST_CASE("TNT_FUSED_ATTENTION_STORED_DS=1 reaches the fused backward", "[.stored_ds_env]") {
  const char* env = std::getenv("TNT_FUSED_ATTENTION_STORED_DS");
  REQUIRE(env != nullptr);
  REQUIRE(std::string(env) == "1");
  CHECK(tnt::config().fused_attention_stored_ds);
}
