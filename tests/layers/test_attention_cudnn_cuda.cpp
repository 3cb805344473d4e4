// The cuDNN flash-attention engine (attention_cudnn_cuda.cpp) against the unfused CUDA
// engine (attention_cuda.cu) on the same device and inputs: forward o and backward dq, dk,
// dv in bf16 and f16, self and cross attention, causal, padding ids, depths 64 and 128,
// lengths that are not multiples of 64, each padding-bias layout the engine may take; and
// dropout: repeatable bits, the kept fraction, and a backward consistent with the mask the
// forward applied, alone and together with the decoder's causal and padding masks. Every
// case is its own section, so that one case cuDNN refuses does not hide the others on a lent
// GPU's single run. Label gpu: needs a GPU.
//
// Every case forces AttentionEngine::cudnn: where cuDNN cannot build a graph the engine
// throws with cuDNN's own message and the case FAILS (Catch prints the message). It never
// falls back silently here. (The bias-layout case reports a layout cuDNN refuses with a
// WARN instead: there the engine would take the next layout.)
//
// Tolerances, as in test_attention_fused_cuda.cpp and for the same reasons: inputs uniform
// in [-1, 1]; both engines compute logits and products in f32 from the same rounded q, k,
// v, dO and round probabilities, dS and outputs to the half format, each a relative error
// of at most one unit u (2^-8 bf16, 2^-11 f16) of a term, and each output element is a
// convex-like combination of such terms. So we allow kUnits = 8 units of max|f32 reference|
// between the engines per element, and cuDNN must be within 2x the unfused engine's own error
// against the f32 unfused engine, plus 2 u of scale. A wrong mask, scale or transpose moves
// outputs by a sizeable fraction of their scale.
// No key row is all padding here: there the engines differ on purpose (the header of
// attention_cudnn_cuda.hpp: cuDNN's bias is kCudnnPaddingBias (-8192), so such a row is the softmax of its own
// logits, not the near-uniform one of the -1e9 engines).
#include "gpu_test_util.hpp"

#include "layers/attention_cuda.hpp"
#include "layers/attention_cudnn_cuda.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using namespace tnt;
using cuda::AttentionEngine;
using tnt::test::gpu;
using tnt::test::kUnitBf16;
using tnt::test::kUnitF16;
using tnt::test::max_abs;

namespace {

constexpr double kUnits = 8.0;
// Absolute floor for exact cancellations (f32 residue of 64-term dot products), as in the
// fused engine's test.
constexpr double kFloor = 1e-4;

struct Case {
  DType dtype;
  int64_t batch, heads, tq, tk, depth;
  bool causal = false;
  bool ids = false;
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.dtype)) + " B" + std::to_string(c.batch) + " H" + std::to_string(c.heads) + " Tq" +
         std::to_string(c.tq) + " Tk" + std::to_string(c.tk) + " d" + std::to_string(c.depth) +
         (c.causal ? " causal" : "") + (c.ids ? " ids" : "");
}

double unit_of(DType dt) { return dt == DType::bf16 ? kUnitBf16 : kUnitF16; }

// Key ids (B, Tk), i64: row b ends in 1 + b % 3 padding keys and has one in the middle; key
// 0 is never padding (see the top).
bool padding_key(int64_t b, int64_t j, int64_t tk) { return j > 0 && (j >= tk - 1 - b % 3 || j == tk / 2); }

Tensor make_ids(int64_t batch, int64_t tk) {
  std::vector<int64_t> v(static_cast<size_t>(batch * tk));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < tk; ++j) v[static_cast<size_t>(b * tk + j)] = padding_key(b, j, tk) ? 0 : 1 + j % 5;
  }
  return Tensor::from_data(v.data(), {batch, tk}).to(gpu());
}

// Whether query i of row b sees key j: not padding (when the case has ids), not in the
// future (when causal; Tq == Tk there).
bool visible(const Case& c, int64_t b, int64_t i, int64_t j) {
  return !(c.causal && j > i) && !(c.ids && padding_key(b, j, c.tk));
}

struct Inputs {
  Tensor q, k, v, ids, d_o;
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
  if (c.ids) in.ids = make_ids(c.batch, c.tk);
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
  a.base = 777;
  return a;
}

struct Result {
  bool cudnn = false;
  Tensor o, dq, dk, dv;  // f32 on the host
};

Tensor host_f32(const Tensor& t) { return ops::cast(t, DType::f32).to(Device::cpu()); }

Result run(const Inputs& in, const AttentionCoreArgs& a, AttentionEngine engine, DType dtype) {
  auto as = [&](const Tensor& t) { return t.dtype() == dtype ? t : ops::cast(t, dtype); };
  std::shared_ptr<void> state;
  const Tensor o = cuda::attention_core_forward(as(in.q), as(in.k), as(in.v), in.ids, a, state, engine);
  Result r;
  r.cudnn = cuda::attention_core_cudnn(state);
  Tensor dq, dk, dv;
  cuda::attention_core_backward(as(in.d_o), state, dq, dk, dv);
  REQUIRE(o.dtype() == dtype);
  REQUIRE(dq.dtype() == dtype);
  r.o = host_f32(o);
  r.dq = host_f32(dq);
  r.dk = host_f32(dk);
  r.dv = host_f32(dv);
  return r;
}


void compare(const Tensor& got, const Tensor& unfused, const Tensor& ref, double unit, const std::string& what) {
  const double scale = max_abs(ref);
  test::check_all_close(got, unfused, kUnits * unit * scale + kFloor, what + " cudnn vs unfused");
  const double err = test::max_abs_diff(got, ref), err_unfused = test::max_abs_diff(unfused, ref);
  INFO(what << ": max |cudnn - f32| " << err << ", max |unfused - f32| " << err_unfused << ", scale " << scale);
  CHECK(err <= 2.0 * err_unfused + 2.0 * unit * scale + kFloor);
}

// o (B, Tq, H*d) read as if cuDNN had written it (B, H, Tq, d): the heads and time axes
// transposed, what a wrong output stride gives.
Tensor heads_time_swapped(const Tensor& o, const Case& c) {
  const std::vector<float> v = o.to_vector();
  std::vector<float> out(v.size());
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t t = 0; t < c.tq; ++t)
        for (int64_t j = 0; j < c.depth; ++j)
          out[static_cast<size_t>(((b * c.tq + t) * c.heads + h) * c.depth + j)] =
              v[static_cast<size_t>(((b * c.heads + h) * c.tq + t) * c.depth + j)];
  return Tensor::from_vector(out, o.shape());
}

// Where cuDNN's results differ from the unfused engine's: which simple mistake they look
// like. The unfused engine runs in f32 with one thing changed (the scale, the padding bias,
// the causal mask, swapped operands), and o is also read with its heads and time axes
// swapped; for each result the distance to every variant is printed, closest first, so that
// the one GPU run of a lease points at the graph node to fix without another.
void diagnose(const Case& c, const Inputs& in, const AttentionCoreArgs& a, const Result& got) {
  struct Variant {
    std::string what;
    Result r;
  };
  std::vector<Variant> variants;
  auto add = [&](const std::string& what, const Inputs& vin, const AttentionCoreArgs& va) {
    try {
      variants.push_back({what, run(vin, va, AttentionEngine::unfused, DType::f32)});
    } catch (const std::exception& e) {
      WARN("diagnosis, " << what << ": " << e.what());
    }
  };
  add("as specified", in, a);
  AttentionCoreArgs va = a;
  va.scale = 1.0f;
  add("scale not applied", in, va);
  va.scale = a.scale * a.scale;
  add("scale applied twice", in, va);
  if (c.ids) {
    Inputs vin = in;
    vin.ids = Tensor();
    add("padding bias ignored", vin, a);
  }
  va = a;
  va.causal = !a.causal;
  if (c.causal) add("causal mask ignored", in, va);
  if (!c.causal && c.tq == c.tk) add("causal mask applied", in, va);
  if (c.tq == c.tk) {
    Inputs vin = in;
    std::swap(vin.q, vin.k);
    add("q and k swapped", vin, a);
  }
  Inputs kv = in;
  std::swap(kv.k, kv.v);
  add("k and v swapped", kv, a);
  std::string report = "cuDNN attention " + describe(c) + " differs; distance (max |cudnn - variant|) by result:";
  auto line = [&](const std::string& name, const Tensor& mine, auto pick, bool layouts) {
    std::vector<std::pair<double, std::string>> d;
    for (const Variant& v : variants) d.push_back({test::max_abs_diff(mine, pick(v.r)), v.what});
    if (layouts && !variants.empty()) {
      d.push_back({test::max_abs_diff(heads_time_swapped(mine, c), pick(variants[0].r)),
                   "as specified, o's heads and time axes swapped"});
    }
    std::sort(d.begin(), d.end());
    report += "\n  " + name + " (scale " + std::to_string(max_abs(pick(variants.at(0).r))) + "):";
    for (const auto& [dist, what] : d) report += " [" + what + " " + std::to_string(dist) + "]";
  };
  line("o", got.o, [](const Result& r) { return r.o; }, true);
  line("dq", got.dq, [](const Result& r) { return r.dq; }, false);
  line("dk", got.dk, [](const Result& r) { return r.dk; }, false);
  line("dv", got.dv, [](const Result& r) { return r.dv; }, false);
  WARN(report);
}

void check_case(const Case& c) {
  INFO(describe(c));
  REQUIRE(cuda::cudnn_attention_applies(c.dtype, c.batch, c.heads, c.tq, c.tk, c.depth, c.causal));
  const Inputs in = make_inputs(c, "cd" + std::to_string(c.tq) + "_" + std::to_string(c.tk));
  const AttentionCoreArgs a = args_of(c, 0.0f);
  const int64_t calls = cuda::attention_cudnn_calls();
  const Result got = run(in, a, AttentionEngine::cudnn, c.dtype);  // throws cuDNN's reason
  CHECK(got.cudnn);
  CHECK(cuda::attention_cudnn_calls() == calls + 2);
  const Result unfused = run(in, a, AttentionEngine::unfused, c.dtype);
  const Result ref = run(in, a, AttentionEngine::unfused, DType::f32);
  CHECK_FALSE(unfused.cudnn);
  const double u = unit_of(c.dtype);
  bool differs = false;
  for (auto [mine, theirs, r] : {std::tuple{&got.o, &unfused.o, &ref.o}, std::tuple{&got.dq, &unfused.dq, &ref.dq},
                                 std::tuple{&got.dk, &unfused.dk, &ref.dk}, std::tuple{&got.dv, &unfused.dv, &ref.dv}}) {
    differs = differs || test::max_abs_diff(*mine, *theirs) > kUnits * u * max_abs(*r) + kFloor;
  }
  if (differs) diagnose(c, in, a, got);
  compare(got.o, unfused.o, ref.o, u, "o");
  compare(got.dq, unfused.dq, ref.dq, u, "dq");
  compare(got.dk, unfused.dk, ref.dk, u, "dk");
  compare(got.dv, unfused.dv, ref.dv, u, "dv");
}

}  // namespace

TEST_CASE("cuDNN attention matches the unfused engine", "[gpu][attention]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Case cases[] = {
        {dt, 2, 2, 64, 64, 64},                 // self-attention, whole tiles
        {dt, 3, 2, 100, 100, 64, false, true},  // padding ids, odd length
        {dt, 2, 2, 130, 130, 64, true},         // causal over several tiles
        {dt, 3, 2, 70, 70, 128, true, true},    // causal with padding, depth 128
        {dt, 2, 3, 50, 77, 64, false, true},    // cross attention Tq < Tk
        {dt, 2, 2, 90, 37, 128},                // cross attention Tq > Tk, depth 128
        {dt, 3, 4, 60, 60, 8, false, true},     // depth 8 (the tiny model), padding
        {dt, 2, 4, 40, 40, 8, true},            // depth 8, causal
        // The Transformer-big decoder's layout (16 heads of 64, 256 tokens, causal, padding)
        // at 8 sentences: heuristics see the sizes, so the small cases may not meet the
        // engine or tiling the model's steps run.
        {dt, 8, 16, 256, 256, 64, true, true},
    };
    // One section per case: a case cuDNN refuses (it throws) fails alone, and the one run a
    // lease allows still reports every other case.
    for (const Case& c : cases) {
      DYNAMIC_SECTION(describe(c)) { check_case(c); }
    }
  }
}

// Each padding-bias layout the engine may take (cudnn_attention_bias_layouts), not only the
// first that builds: one run then shows which layouts compute right, so that the order can be
// changed without another lease. A layout cuDNN refuses on this GPU is reported (WARN) and
// not a failure: the engine would go on to the next one.
TEST_CASE("cuDNN attention: every padding-bias layout matches the unfused engine", "[gpu][attention]") {
  const auto layouts = cuda::cudnn_attention_bias_layouts();
  for (size_t i = 0; i < layouts.size(); ++i) {
    DYNAMIC_SECTION("bias " << layouts[i].str()) {
      struct Reset {
        ~Reset() { cuda::cudnn_attention_force_bias_layout(-1); }
      } reset;
      cuda::cudnn_attention_force_bias_layout(static_cast<int>(i));
      // Causal with padding: both the bias and the select in the graph.
      const Case c{DType::bf16, 3, 2, 100, 100, 64, true, true};
      cuda::CudnnAttentionKey key;
      key.batch = c.batch;
      key.tq = c.tq;
      key.tk = c.tk;
      key.heads = c.heads;
      key.depth = c.depth;
      key.dtype = c.dtype;
      key.causal = c.causal;
      key.bias = c.ids;
      key.scale = args_of(c, 0.0f).scale;
      const int device = gpu().index;  // no GPU: a failure, outside the refusal's catch
      bool built = false;
      try {
        built = cuda::cudnn_attention_prepare(key, device, false);
      } catch (const std::exception& e) {
        WARN("bias " << layouts[i].str() << " refused here: " << e.what());
      }
      if (built) check_case(c);
    }
  }
}

namespace {

// One-hot values: v[b, j, h*d + c] = (j == c), so o[b, i, h*d + c] is the dropped
// probability pd[b, h, i, c] itself (needs Tk <= d).
Tensor one_hot_values(const Case& c) {
  std::vector<float> v(static_cast<size_t>(c.batch * c.tk * c.heads * c.depth), 0.0f);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < c.tk; ++j)
      for (int64_t h = 0; h < c.heads; ++h) v[static_cast<size_t>(((b * c.tk + j) * c.heads + h) * c.depth + j)] = 1;
  return ops::cast(Tensor::from_vector(v, {c.batch, c.tk, c.heads * c.depth}).to(gpu()), c.dtype);
}

// The forward and backward of the core in double on the host, with a given keep mask
// (B, H, Tq, Tk) of 0/1 and the case's padding and causal masks (a masked key has
// probability 0: exp(-8192) and exp(-inf) are 0 in f32 as here): what cuDNN's backward must
// give for the mask its forward applied.
struct HostGrads {
  std::vector<double> o, dq, dk, dv;
};

HostGrads host_reference(const Case& c, const AttentionCoreArgs& a, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v, const std::vector<double>& d_o,
                         const std::vector<double>& keep) {
  const int64_t B = c.batch, H = c.heads, Tq = c.tq, Tk = c.tk, d = c.depth, D = H * d;
  HostGrads g;
  g.o.assign(static_cast<size_t>(B * Tq * D), 0.0);
  g.dq.assign(g.o.size(), 0.0);
  g.dk.assign(static_cast<size_t>(B * Tk * D), 0.0);
  g.dv.assign(g.dk.size(), 0.0);
  const double ks = 1.0 / (1.0 - a.rate);
  std::vector<double> p(static_cast<size_t>(Tk)), dp(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Tq; ++i) {
        auto qi = [&](int64_t e) { return q[static_cast<size_t>((b * Tq + i) * D + h * d + e)]; };
        auto kj = [&](int64_t j, int64_t e) { return k[static_cast<size_t>((b * Tk + j) * D + h * d + e)]; };
        auto vj = [&](int64_t j, int64_t e) { return v[static_cast<size_t>((b * Tk + j) * D + h * d + e)]; };
        auto gi = [&](int64_t e) { return d_o[static_cast<size_t>((b * Tq + i) * D + h * d + e)]; };
        auto m = [&](int64_t j) { return keep[static_cast<size_t>(((b * H + h) * Tq + i) * Tk + j)]; };
        double mx = -1e300;
        for (int64_t j = 0; j < Tk; ++j) {
          if (!visible(c, b, i, j)) continue;
          double l = 0;
          for (int64_t e = 0; e < d; ++e) l += qi(e) * kj(j, e);
          p[static_cast<size_t>(j)] = l * a.scale;
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          p[static_cast<size_t>(j)] = visible(c, b, i, j) ? std::exp(p[static_cast<size_t>(j)] - mx) : 0.0;
          sum += p[static_cast<size_t>(j)];
        }
        for (int64_t j = 0; j < Tk; ++j) p[static_cast<size_t>(j)] /= sum;
        double dot = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          const double pd = p[static_cast<size_t>(j)] * m(j) * ks;
          double dpd = 0;
          for (int64_t e = 0; e < d; ++e) {
            g.o[static_cast<size_t>((b * Tq + i) * D + h * d + e)] += pd * vj(j, e);
            g.dv[static_cast<size_t>((b * Tk + j) * D + h * d + e)] += pd * gi(e);
            dpd += gi(e) * vj(j, e);
          }
          dp[static_cast<size_t>(j)] = dpd * m(j) * ks;
          dot += dp[static_cast<size_t>(j)] * p[static_cast<size_t>(j)];
        }
        for (int64_t j = 0; j < Tk; ++j) {
          const double ds = p[static_cast<size_t>(j)] * (dp[static_cast<size_t>(j)] - dot) * a.scale;
          for (int64_t e = 0; e < d; ++e) {
            g.dq[static_cast<size_t>((b * Tq + i) * D + h * d + e)] += ds * kj(j, e);
            g.dk[static_cast<size_t>((b * Tk + j) * D + h * d + e)] += ds * qi(e);
          }
        }
      }
    }
  }
  return g;
}

void check_against(const Tensor& got, const std::vector<double>& want, double unit, const std::string& what) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  const Tensor ref = Tensor::from_vector(std::vector<float>(want.begin(), want.end()), got.shape());
  test::check_all_close(got, ref, kUnits * unit * scale + kFloor, what);
}

}  // namespace

TEST_CASE("cuDNN attention dropout: repeatable, kept fraction, backward of its own mask", "[gpu][attention]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    // Tk = d = 64: one-hot values make o the dropped probabilities; 2*2*64*64 = 16384 draws
    // without masks. Then with the decoder's masks (causal and padding, as the Transformer
    // trains): the dropout graph with the bias and the causal select in it.
    const Case cases[] = {{dt, 2, 2, 64, 64, 64}, {dt, 2, 2, 64, 64, 64, true, true}};
    // A section per case: one that fails (cuDNN throws) leaves the others to report.
    for (const Case& c : cases) DYNAMIC_SECTION(describe(c)) {
      INFO(describe(c));
      const float rate = 0.1f;
      const AttentionCoreArgs a = args_of(c, rate);
      const double u = unit_of(dt);
      Inputs in = make_inputs(c, "cdrop");

      // 1. Same seed and offset: the same bits, forward and backward.
      const Result first = run(in, a, AttentionEngine::cudnn, dt);
      const Result again = run(in, a, AttentionEngine::cudnn, dt);
      REQUIRE(first.cudnn);
      test::check_all_close(again.o, first.o, 0.0, "o again");
      test::check_all_close(again.dq, first.dq, 0.0, "dq again");
      test::check_all_close(again.dk, first.dk, 0.0, "dk again");
      test::check_all_close(again.dv, first.dv, 0.0, "dv again");
      // Another offset (the next step's) draws another mask.
      AttentionCoreArgs next = a;
      next.base += static_cast<uint64_t>(c.batch * c.heads * c.tq * c.tk);
      CHECK(test::max_abs_diff(run(in, next, AttentionEngine::cudnn, dt).o, first.o) > 0.0);

      // 2. The mask: o with one-hot values is p * keep / (1 - rate); without dropout it is p.
      Inputs hot = in;
      hot.v = one_hot_values(c);
      const Result dropped = run(hot, a, AttentionEngine::cudnn, dt);
      const Result plain = run(hot, args_of(c, 0.0f), AttentionEngine::cudnn, dt);
      const std::vector<double> od = dropped.o.to_double_vector(), op = plain.o.to_double_vector();
      std::vector<double> keep(static_cast<size_t>(c.batch * c.heads * c.tq * c.tk));
      int64_t kept = 0, wrong_scale = 0, no_probability = 0, seen = 0, masked_nonzero = 0;
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t i = 0; i < c.tq; ++i)
          for (int64_t h = 0; h < c.heads; ++h)
            for (int64_t j = 0; j < c.tk; ++j) {
              const size_t at = static_cast<size_t>(((b * c.tq + i) * c.heads + h) * c.depth + j);
              if (!visible(c, b, i, j)) {
                // A masked key: probability 0 with and without dropout; its draw is unread.
                masked_nonzero += od[at] != 0.0 || op[at] != 0.0;
                keep[static_cast<size_t>(((b * c.heads + h) * c.tq + i) * c.tk + j)] = 1.0;
                continue;
              }
              ++seen;
              no_probability += op[at] == 0.0;  // then the mask could not be read here
              const bool k = od[at] != 0.0;
              keep[static_cast<size_t>(((b * c.heads + h) * c.tq + i) * c.tk + j)] = k ? 1.0 : 0.0;
              kept += k;
              // A kept probability is p / (1 - rate): p > 0 at a visible key and both outputs
              // are rounded once to the half format, so within 3 units relative.
              if (k && std::fabs(od[at] - op[at] / (1.0 - rate)) > 3.0 * u * std::fabs(od[at]) + 1e-6) ++wrong_scale;
            }
      const double n = static_cast<double>(seen);
      const double frac = static_cast<double>(kept) / n;
      // Bernoulli(0.9) over the visible draws (16,384 without masks, 8,178 with them):
      // standard deviation 0.0023 (0.0033); the bound is 5 of them.
      INFO("kept fraction " << frac << " of " << n);
      CHECK(std::fabs(frac - (1.0 - rate)) < 5.0 * std::sqrt(rate * (1.0 - rate) / n));
      CHECK(wrong_scale == 0);
      CHECK(no_probability == 0);
      CHECK(masked_nonzero == 0);

      // 3. The backward is the gradient of the forward with that mask: the same seed and offset
      // with random values draw the same mask (it depends on the seed, offset and shape only).
      auto host = [&](const Tensor& t) { return host_f32(t).to_double_vector(); };
      const HostGrads want = host_reference(c, a, host(in.q), host(in.k), host(in.v), host(in.d_o), keep);
      check_against(first.o, want.o, u, "o with the extracted mask");
      check_against(first.dq, want.dq, u, "dq with the extracted mask");
      check_against(first.dk, want.dk, u, "dk with the extracted mask");
      check_against(first.dv, want.dv, u, "dv with the extracted mask");
    }
  }
}

TEST_CASE("A shape the cuDNN engine does not take is refused when forced", "[gpu][attention]") {
  // f32 is not a cuDNN flash-attention dtype: forcing the engine is an error naming it, and
  // the default engine choice never picks cuDNN for it.
  const Case c{DType::f32, 1, 1, 8, 8, 64};
  const Inputs in = make_inputs(c, "cdf32");
  std::shared_ptr<void> state;
  CHECK_THROWS_WITH(cuda::attention_core_forward(in.q, in.k, in.v, in.ids, args_of(c, 0.0f), state,
                                                 AttentionEngine::cudnn),
                    Catch::Contains("cuDNN engine does not apply"));
}

// Run alone under TNT_CUDNN_ATTENTION=1 (tests/layers/CMakeLists.txt): the knob reaches the
// engine choice (AttentionEngine::config takes cuDNN).
TEST_CASE("TNT_CUDNN_ATTENTION=1 selects the cuDNN engine", "[.cudnn_env]") {
  const char* env = std::getenv("TNT_CUDNN_ATTENTION");
  REQUIRE(env != nullptr);
  REQUIRE(tnt::config().cudnn_attention.on());
  const Case c{DType::bf16, 2, 2, 64, 64, 64, true, true};
  const Inputs in = make_inputs(c, "cdenv");
  const int64_t calls = cuda::attention_cudnn_calls();
  const Result r = run(in, args_of(c, 0.1f), AttentionEngine::config, c.dtype);
  CHECK(r.cudnn);
  CHECK(cuda::attention_cudnn_calls() == calls + 2);

  // A forward that fails to run under the knob (injected: this GPU's cuDNN runs the graph):
  // that call and every later one of its shape take the other engines, with the other
  // engines' results; a shape never failed keeps cuDNN.
  const Case failing{DType::bf16, 2, 2, 48, 48, 64, true, false};
  const Inputs fin = make_inputs(failing, "cdfail");
  cuda::cudnn_attention_fail_next_forwards(1);
  const int64_t before = cuda::attention_cudnn_calls();
  const Result f1 = run(fin, args_of(failing, 0.0f), AttentionEngine::config, failing.dtype);
  CHECK_FALSE(f1.cudnn);
  const Result f2 = run(fin, args_of(failing, 0.0f), AttentionEngine::config, failing.dtype);
  CHECK_FALSE(f2.cudnn);
  CHECK(cuda::attention_cudnn_calls() == before);
  const Result other = run(fin, args_of(failing, 0.0f), AttentionEngine::fused, failing.dtype);
  // The fallback is the configured engine itself (fused here): the same forward kernels on
  // the same inputs, the same bits.
  test::require_equal(f1.o, other.o, "fallback output");
  test::require_equal(f2.o, other.o, "later output");
  cuda::cudnn_attention_fail_next_forwards(0);
  const Result again = run(in, args_of(c, 0.1f), AttentionEngine::config, c.dtype);
  CHECK(again.cudnn);
}
