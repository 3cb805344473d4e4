// TNT_CUDNN_ATTENTION=auto on a GPU (layers/attention_trial_cuda.hpp): each shape's first use
// runs a trial of cuDNN's flash attention against the fused engine, and the layer then runs
// what the trial chose. Run by the CTest entry layers_attention_cudnn_cuda_auto under
// TNT_CUDNN_ATTENTION=auto, at INFO (the verdict lines, with both engines' times, are in
// the log of a passing run too). Label gpu: needs a GPU, fails without one.
//
// What can fail here: a trial that finds cuDNN disagreeing with the fused engine on the
// Transformer's kinds of attention (its checks are attention_choice.hpp's; a disagreement
// is a finding about cuDNN's graphs, printed with the numbers), a trial that does not catch
// a cuDNN run with a wrong scale, a verdict not remembered, or a layer that does not run
// what its trial chose.
#include "gpu_test_util.hpp"

#include "layers/attention_choice.hpp"
#include "layers/attention_cuda.hpp"
#include "layers/attention_trial_cuda.hpp"
#include "tarantella/config.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

using namespace tnt;
using cuda::AttentionEngine;
using tnt::test::gpu;

namespace {

struct Case {
  DType dtype;
  int64_t batch, heads, tq, tk, depth;
  bool causal;
  float rate;
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.dtype)) + " B" + std::to_string(c.batch) + " H" + std::to_string(c.heads) + " Tq" +
         std::to_string(c.tq) + " Tk" + std::to_string(c.tk) + " d" + std::to_string(c.depth) +
         (c.causal ? " causal" : "") + " dropout " + std::to_string(c.rate);
}

struct Inputs {
  Tensor q, k, v, ids, d_o;
};

// Padding ids (B, Tk) i64: row b ends in b % 5 padding keys (key 0 never one).
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
  std::vector<int64_t> ids(static_cast<size_t>(c.batch * c.tk));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < c.tk; ++j) ids[static_cast<size_t>(b * c.tk + j)] = j >= c.tk - b % 5 ? 0 : 1 + j % 7;
  in.ids = Tensor::from_data(ids.data(), {c.batch, c.tk}).to(gpu());
  return in;
}

AttentionCoreArgs args_of(const Case& c) {
  AttentionCoreArgs a;
  a.batch = c.batch;
  a.tq = c.tq;
  a.tk = c.tk;
  a.heads = c.heads;
  a.depth = c.depth;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.depth));
  a.causal = c.causal;
  a.rate = c.rate;
  a.key = 0xa070ULL;
  a.base = 99;
  return a;
}

struct Result {
  bool cudnn = false, fused = false;
  Tensor o, dq;
};

Result run(const Inputs& in, const AttentionCoreArgs& a, AttentionEngine engine) {
  std::shared_ptr<void> state;
  Result r;
  r.o = cuda::attention_core_forward(in.q, in.k, in.v, in.ids, a, state, engine);
  r.cudnn = cuda::attention_core_cudnn(state);
  r.fused = cuda::attention_core_fused(state);
  Tensor dk, dv;
  cuda::attention_core_backward(in.d_o, state, r.dq, dk, dv);
  r.o = ops::cast(r.o, DType::f32).to(Device::cpu());
  r.dq = ops::cast(r.dq, DType::f32).to(Device::cpu());
  return r;
}

// The Transformer's three kinds: encoder self-attention (padding, dropout), decoder
// self-attention (causal, padding, dropout), encoder-decoder attention in f16 at evaluation
// (no dropout, Tq != Tk). B * H * Tq >= 4096 where there is dropout, so the mean is checked.
const Case kCases[] = {
    {DType::bf16, 16, 4, 96, 96, 64, false, 0.1f},
    {DType::bf16, 16, 4, 80, 80, 64, true, 0.1f},
    {DType::f16, 8, 4, 80, 96, 64, false, 0.0f},
};

}  // namespace

TEST_CASE("TNT_CUDNN_ATTENTION=auto: a trial per shape checks cuDNN and picks the engine", "[gpu][attention_auto]") {
  REQUIRE(tnt::config().cudnn_attention.automatic());
  REQUIRE_FALSE(tnt::config().deterministic);
  REQUIRE(tnt::config().fused_attention);
  namespace rules = attention_choice;
  // Each section starts with the hooks off, whatever an earlier one left on failing.
  cuda::attention_trial_prefer_cudnn(false);
  cuda::attention_trial_corrupt_scale(false);
  cuda::attention_trial_corrupt_dropout(false);

  SECTION("cuDNN agrees with the fused engine on the Transformer's kinds of attention") {
    cuda::attention_trials_reset();
    cuda::attention_trial_prefer_cudnn(true);  // take cuDNN wherever it agrees: its path is run
    size_t n = 0;
    for (const Case& c : kCases) {
      INFO(describe(c));
      const Inputs in = make_inputs(c, "auto" + std::to_string(n));
      const Result r = run(in, args_of(c), AttentionEngine::config);
      const std::vector<cuda::AttentionTrialRecord> trials = cuda::attention_trials();
      REQUIRE(trials.size() == n + 1);
      const cuda::AttentionTrialRecord& t = trials.back();
      INFO(t.str());
      CHECK_FALSE(t.suspect);
      CHECK(t.other == "fused");
      CHECK(t.use_cudnn);
      CHECK(r.cudnn);
      CHECK(rules::agrees(t.o.diff, t.o.largest));
      CHECK(rules::agrees(t.dq.diff, t.dq.largest));
      CHECK(rules::agrees(t.dk.diff, t.dk.largest));
      CHECK(rules::agrees(t.dv.diff, t.dv.largest));
      if (c.rate > 0.0f) {
        CHECK(rules::dropout_backward_consistent(t.o_dot_o, t.v_dot_dv));
        CHECK(std::isfinite(t.mean_ratio));
        CHECK(rules::dropout_noise_agrees(t.noise, c.rate));
      } else {
        // What the layer ran is cuDNN's, and right: against the fused engine forced, within
        // the trial's own rule (the inputs here are the test's, not the trial's).
        const Result fused = run(in, args_of(c), AttentionEngine::fused);
        CHECK(fused.fused);
        const double largest = test::max_abs(fused.o), largest_dq = test::max_abs(fused.dq);
        CHECK(rules::agrees(test::max_abs_diff(r.o, fused.o), largest));
        CHECK(rules::agrees(test::max_abs_diff(r.dq, fused.dq), largest_dq));
      }
      CHECK(t.cudnn_ms > 0.0);
      CHECK(t.other_ms > 0.0);
      // The verdict is remembered: the same shape again runs no second trial.
      const Result again = run(in, args_of(c), AttentionEngine::config);
      CHECK(again.cudnn);
      CHECK(cuda::attention_trials().size() == n + 1);
      ++n;
    }
    cuda::attention_trial_prefer_cudnn(false);
  }

  SECTION("a cuDNN run with a wrong scale is caught, and the fused engine runs") {
    cuda::attention_trials_reset();
    cuda::attention_trial_corrupt_scale(true);
    const Case c = kCases[0];
    const Inputs in = make_inputs(c, "auto_wrong");
    const Result r = run(in, args_of(c), AttentionEngine::config);
    cuda::attention_trial_corrupt_scale(false);
    const std::vector<cuda::AttentionTrialRecord> trials = cuda::attention_trials();
    REQUIRE(trials.size() == 1);
    INFO(trials[0].str());
    CHECK(trials[0].suspect);
    CHECK_FALSE(trials[0].use_cudnn);
    CHECK_THAT(trials[0].verdict, Catch::Contains("differs from the fused engine"));
    CHECK_FALSE(r.cudnn);
    CHECK(r.fused);
    // What ran is the fused engine: its bits (no atomics; the same dropout mask).
    const Result fused = run(in, args_of(c), AttentionEngine::fused);
    test::require_equal(r.o, fused.o, "o under auto, cuDNN ruled out");
    test::require_equal(r.dq, fused.dq, "dq under auto, cuDNN ruled out");
  }

  SECTION("a cuDNN dropout that drops nothing is caught") {
    cuda::attention_trials_reset();
    cuda::attention_trial_corrupt_dropout(true);
    const Case c = kCases[1];
    const Inputs in = make_inputs(c, "auto_nodrop");
    const Result r = run(in, args_of(c), AttentionEngine::config);
    cuda::attention_trial_corrupt_dropout(false);
    const std::vector<cuda::AttentionTrialRecord> trials = cuda::attention_trials();
    REQUIRE(trials.size() == 1);
    INFO(trials[0].str());
    CHECK(trials[0].suspect);
    CHECK_FALSE(trials[0].use_cudnn);
    CHECK_THAT(trials[0].verdict, Catch::Contains("with dropout"));
    CHECK_FALSE(r.cudnn);
  }

  SECTION("the times decide") {
    cuda::attention_trials_reset();
    const Case c = kCases[0];
    const Inputs in = make_inputs(c, "auto_timed");
    const Result r = run(in, args_of(c), AttentionEngine::config);
    const std::vector<cuda::AttentionTrialRecord> trials = cuda::attention_trials();
    REQUIRE(trials.size() == 1);
    const cuda::AttentionTrialRecord& t = trials[0];
    INFO(t.str());
    CHECK_FALSE(t.suspect);
    CHECK(t.use_cudnn == rules::prefer_cudnn(t.cudnn_ms, t.other_ms));
    CHECK(r.cudnn == t.use_cudnn);
    CHECK(r.fused == !t.use_cudnn);
    // So that the log of a passing run says which engine is faster at this size.
    WARN("auto: " << t.str());
  }

  SECTION("decoding's single query row takes no trial") {
    cuda::attention_trials_reset();
    const Case c{DType::bf16, 4, 4, 1, 40, 64, false, 0.0f};
    const Inputs in = make_inputs(c, "auto_step");
    const Result r = run(in, args_of(c), AttentionEngine::config);
    CHECK_FALSE(r.cudnn);
    CHECK(cuda::attention_trials().empty());
  }
}
