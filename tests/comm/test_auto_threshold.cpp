// --fusion-threshold auto's decision alone (comm/auto_threshold), without MPI: from what the
// tuner measured on its own steps (ready times, every rank's compute times with one rank
// lagging, the allreduces' time in training against the probe's) it builds a profile that
// carries the model's corrections, and picks what scaling::best_prediction picks on that
// profile. The case is made so that the plain model (no lag, the probe's speed beside
// backward) keeps 32 KB and the corrected one does not: without the corrections the test
// fails. The multi-rank path (gathering, broadcasts) is tests/comm/test_reducer_auto.cpp.
#include "comm/auto_threshold.hpp"

#include "comm/scaling_model.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <string>

#include <vector>

using namespace tnt::comm;
using Catch::Matchers::Contains;

namespace {

// 2 ranks, 16 gradients of 64 KB, the first final 2.5 ms into a 40 ms backward and one more
// every 2.5 ms (registration order is the reverse: gradient 0 is the last final). At 32 KB
// every gradient is its own bucket. The probe: 1.5 ms + 1 ns a byte (an allreduce of 64 KB
// costs 1.5655 ms), so at the probe's speed each bucket is done before the next is ready
// and only the last one's 1.5655 ms is exposed: the plain model predicts 41.5655 ms and
// nothing faster (fewer, larger buckets expose a larger last one).
AutoMeasurement measured() {
  AutoMeasurement m;
  m.ranks = 2;
  m.threshold_bytes = 32 * 1024;
  for (int g = 0; g < 16; ++g) {
    m.gradient_bytes.push_back(64 * 1024);
    m.ready_s.push_back(0.040 - 0.0025 * g);
  }
  m.backward_s = 0.040;
  // In training the 16 allreduces took 50 ms in all, not 16 x 1.5655 ms: backward shares
  // the cores with them, and they were still running 10 ms after backward ended.
  m.comm_s = 0.050;
  // (ranks * steps,) rank 0 computes 50 ms a step, rank 1 60 ms: sorted, five of each; the
  // expected maximum of 2 draws is 50 * 1/4 + 60 * 3/4 = 57.5 ms, the median 55 ms, so the
  // slowest rank's lag at 2 ranks is 2.5 ms.
  m.compute_samples_s = {0.050, 0.050, 0.050, 0.050, 0.050, 0.060, 0.060, 0.060, 0.060, 0.060};
  m.probe = scaling::AllreduceFit{2, 1.5e-3, 1e-9};
  return m;
}

// Times compared with a relative 1e-9: a few additions in double precision (as in
// test_scaling_model.cpp); comm_factor is a bisection of 60 halvings, far below that.
Approx near(double v) { return Approx(v).epsilon(1e-9).margin(1e-15); }

}  // namespace

TEST_CASE("auto's profile carries the lag and the slowdown beside backward", "[comm][auto]") {
  const AutoMeasurement m = measured();
  const scaling::Profile p = auto_profile(m);
  CHECK(p.ranks == 2);
  CHECK(p.threshold_bytes == 32 * 1024);
  CHECK(p.backward_s == near(0.040));
  CHECK(p.comm_s == near(0.050));
  CHECK(p.compute_samples_s == m.compute_samples_s);
  REQUIRE(p.allreduce.has_value());
  CHECK(p.allreduce->a_s == near(1.5e-3));
  REQUIRE(p.gradients.size() == 16);
  CHECK(p.gradients[15].ready_s == near(0.0025));
  CHECK(scaling::straggle_s(p, 2) == near(2.5e-3));
  // 47.5 ms (50 less the lag) against 25 ms of probe time, with a tail after backward at
  // the probe's speed: 2.79 (computed once), well above 1.
  CHECK(scaling::comm_factor(p) == Approx(2.79).margin(0.01));
  const auto net = scaling::measured_network(p);
  REQUIRE(net.has_value());
  CHECK(net->comm_factor == near(scaling::comm_factor(p)));
  // The probe's line is given back for the job's own ranks.
  CHECK(scaling::allreduce_s(64 * 1024, *net) == near(1.5e-3 + 1e-9 * 64 * 1024));
}

TEST_CASE("auto picks the corrected model's best, which the plain model would not", "[comm][auto]") {
  const scaling::Profile corrected = auto_profile(measured());
  const AutoChoice c = AutoThreshold::choose(corrected);
  const scaling::Prediction best = scaling::best_prediction(corrected, *scaling::measured_network(corrected));
  INFO("corrected: now " << c.now.step_s << " s, best " << best.step_s << " s at " << best.threshold_bytes << " B");
  CHECK(c.best.threshold_bytes == best.threshold_bytes);
  CHECK(c.best.step_s == near(best.step_s));
  CHECK(c.now.straggle_s == near(2.5e-3));
  // At 32 KB the model gives back what was measured: the first bucket ready at 2.5 ms plus
  // the lag, then the channel busy for the 47.5 ms comm_factor was fitted to.
  CHECK(c.now.step_s == Approx(0.0525).epsilon(1e-6));
  // The gain clears kMinGain by far, so the choice is the best.
  CHECK(c.gain > 2 * AutoThreshold::kMinGain);
  CHECK(c.threshold_bytes == best.threshold_bytes);
  CHECK(c.threshold_bytes > 32 * 1024);

  // The same steps without the corrections: no lag, the probe's speed beside backward.
  AutoMeasurement plain_m = measured();
  plain_m.compute_samples_s.clear();
  plain_m.comm_s = 0;
  const scaling::Profile plain = auto_profile(plain_m);
  const AutoChoice u = AutoThreshold::choose(plain);
  INFO("plain: now " << u.now.step_s << " s, best " << u.best.step_s << " s at " << u.best.threshold_bytes << " B");
  CHECK(u.comm_factor == 1);
  CHECK(u.now.straggle_s == 0);
  CHECK(u.now.step_s == near(0.040 + 1.5e-3 + 1e-9 * 64 * 1024));
  CHECK(u.threshold_bytes == 32 * 1024);
  CHECK(u.threshold_bytes != c.threshold_bytes);
}

TEST_CASE("auto's note names the choice and the corrections it used", "[comm][auto]") {
  const scaling::Profile p = auto_profile(measured());
  const AutoChoice c = AutoThreshold::choose(p);
  const std::string note = AutoThreshold::describe(c, p);
  INFO(note);
  CHECK_THAT(note, Contains("fusion threshold auto: "));
  CHECK_THAT(note, Contains("instead of 32 KB"));
  CHECK_THAT(note, Contains("the slowest rank's lag 2.500 ms (from 10 compute samples)"));
  CHECK_THAT(note, Contains(fmt::format("allreduces beside backward {:.2f} x the probe's time", c.comm_factor)));
  CHECK_THAT(note, Contains("backward alone not measured"));
}

TEST_CASE("the gain must clear kMinGain: a small one keeps the threshold", "[comm][auto]") {
  // Without the corrections, at 128 KB (8 buckets of two gradients, the last exposing
  // 1.5 ms + 128 KB at 1 ns) against one bucket a gradient (1.5 ms + 64 KB at 1 ns): 0.16%
  // faster, kept.
  AutoMeasurement m = measured();
  m.compute_samples_s.clear();
  m.comm_s = 0;
  m.threshold_bytes = 128 * 1024;
  const scaling::Profile p = auto_profile(m);
  const AutoChoice c = AutoThreshold::choose(p);
  CHECK(c.now.step_s == near(0.040 + 1.5e-3 + 1e-9 * 128 * 1024));
  CHECK(c.best.step_s == near(0.040 + 1.5e-3 + 1e-9 * 64 * 1024));
  CHECK(c.gain > 0);
  CHECK(c.gain < AutoThreshold::kMinGain);
  CHECK(c.threshold_bytes == 128 * 1024);
  CHECK_THAT(AutoThreshold::describe(c, p), Contains("128 KB kept (the best"));
}

TEST_CASE("auto cannot choose without a probe", "[comm][auto]") {
  AutoMeasurement m = measured();
  m.probe.reset();
  CHECK_THROWS_WITH(AutoThreshold::choose(auto_profile(m)), Contains("without a probe"));
}
