// BinaryPrecision, BinaryRecall and AUC: the CUDA engine's counts against the CPU engine's on
// the same data (integer counts: equal), on f32 and half predictions, with NaN, infinities and
// bad targets (label gpu).
#include "gpu_test_util.hpp"

#include "tarantella/check.hpp"
#include "tarantella/metrics.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

using namespace tnt;
using tnt::test::gpu;

namespace {

// Scores in [-0.2, 1.2) (some outside [0, 1], to be clamped), with NaN and infinities, and
// 0/1 targets.
std::pair<Tensor, Tensor> make_data(int64_t n, const std::string& key) {
  Tensor p = test::random_tensor({n, 1}, key + "_p", -0.2f, 1.2f);
  Tensor u = test::random_tensor({n, 1}, key + "_t");
  Tensor t = Tensor::empty({n, 1});
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    t.data<float>()[i] = u.data<float>()[i] < 0.4f * p.data<float>()[i] ? 1.0f : 0.0f;
    if (i % 97 == 3) p.data<float>()[i] = nan;
    if (i % 89 == 5) p.data<float>()[i] = i % 2 ? inf : -inf;
  }
  return {p, t};
}

std::vector<std::shared_ptr<Metric>> all_metrics(bool from_logits) {
  return {std::make_shared<BinaryPrecision>(BinaryMetricOptions{.threshold = 0.4, .from_logits = from_logits}),
          std::make_shared<BinaryRecall>(BinaryMetricOptions{.from_logits = from_logits}),
          std::make_shared<AUC>(200, from_logits)};
}

}  // namespace

namespace {

// The logits of the centres of the 200 AUC bins nearest to each score (specials kept): the
// device's expf may differ from the host's by an ulp or two, and a sigmoid that lands in the
// middle of a bin (0.0025 from every edge and from the thresholds 0.4 and 0.5, themselves
// edges) cannot cross one by that.
Tensor centre_logits(const Tensor& p) {
  Tensor x = Tensor::empty(p.shape());
  for (int64_t i = 0; i < p.numel(); ++i) {
    const float v = p.data<float>()[i];
    if (!std::isfinite(v)) {
      x.data<float>()[i] = v;
      continue;
    }
    const double clamped = std::min(std::max(static_cast<double>(v), 0.0), 0.999);
    const double c = (std::floor(clamped * 200) + 0.5) / 200;
    x.data<float>()[i] = static_cast<float>(std::log(c / (1.0 - c)));
  }
  return x;
}

}  // namespace

TEST_CASE("binary metrics: CUDA counts equal the CPU counts", "[gpu][metrics]") {
  // 100000 elements: many blocks, each thread looping, many atomics on the same bins.
  auto [scores, t] = make_data(100000, "binary");
  for (bool from_logits : {false, true}) {
    // Probabilities: the same float comparisons on both sides, so the counts are equal.
    const Tensor p = from_logits ? centre_logits(scores) : scores;
    for (DType target_dtype : {DType::f32, DType::i32, DType::i64}) {
      INFO("from_logits " << from_logits << ", targets " << dtype_name(target_dtype));
      const Tensor targets = ops::cast(t, target_dtype);
      auto cpu = all_metrics(from_logits), cuda = all_metrics(from_logits);
      for (size_t m = 0; m < cpu.size(); ++m) {
        INFO(cpu[m]->name());
        cpu[m]->update(p, targets);
        cuda[m]->update(p.to(gpu()), targets.to(gpu()));
        // Integer counts: equal (a broken kernel miscounts, or loses atomics, by far more).
        CHECK(cuda[m]->sums() == cpu[m]->sums());
      }
    }
  }
}

TEST_CASE("binary metrics on CUDA: half predictions, and a bad target names its element", "[gpu][metrics]") {
  auto [p, t] = make_data(5000, "binary_half");
  for (DType dt : {DType::f16, DType::bf16}) {
    INFO(dtype_name(dt));
    // The CPU engine on the half values widened to f32: the same numbers the kernel reads.
    const Tensor half = ops::cast(p, dt);
    const Tensor widened = ops::cast(half, DType::f32);
    auto cpu = all_metrics(false), cuda = all_metrics(false);
    for (size_t m = 0; m < cpu.size(); ++m) {
      cpu[m]->update(widened, t);
      cuda[m]->update(half.to(gpu()), t.to(gpu()));
      CHECK(cuda[m]->sums() == cpu[m]->sums());
    }
  }
  t.data<float>()[4321] = 0.5f;
  for (auto& m : all_metrics(false)) {
    INFO(m->name());
    try {
      m->update(p.to(gpu()), t.to(gpu()));
      FAIL("no InputError");
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Catch::Contains(m->name()) && Catch::Contains("target 0.5") &&
                               Catch::Contains("element 4321"));
    }
  }
}
