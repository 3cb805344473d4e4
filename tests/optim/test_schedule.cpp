// Learning-rate schedules against values worked out by hand from their definitions
// (schedule.hpp). Rates are doubles computed in double, so tolerances are at rounding level.
#include <catch2/catch.hpp>

#include "tarantella/check.hpp"
#include "tarantella/optim.hpp"
#include "tarantella/schedule.hpp"

#include <cmath>

using namespace tnt;


TEST_CASE("schedule: constant") {
  ConstantSchedule s(0.125);
  CHECK(s.lr(0) == 0.125);
  CHECK(s.lr(123456789) == 0.125);
  CHECK_THROWS(ConstantSchedule(-1.0));
}

TEST_CASE("schedule: piecewise constant with linear warmup (TF ResNet)") {
  PiecewiseConstantWithWarmup s({10, 20}, {1.0, 0.1, 0.01}, 5);
  CHECK(s.lr(0) == 0.0);  // TF's first update uses step 0, so its rate is 0
  CHECK(s.lr(1) == Approx(0.2).epsilon(1e-15));
  CHECK(s.lr(4) == Approx(0.8).epsilon(1e-15));
  CHECK(s.lr(5) == 1.0);
  CHECK(s.lr(10) == 1.0);  // a boundary belongs to the interval it ends
  CHECK(s.lr(11) == 0.1);
  CHECK(s.lr(20) == 0.1);
  CHECK(s.lr(21) == 0.01);
  CHECK(s.lr(1000000) == 0.01);

  PiecewiseConstantWithWarmup no_warmup({3}, {0.5, 0.25}, 0);
  CHECK(no_warmup.lr(0) == 0.5);
  CHECK(no_warmup.lr(4) == 0.25);

  CHECK_THROWS_WITH(PiecewiseConstantWithWarmup({10, 20}, {1.0, 0.1}, 0), Catch::Contains("need 3 values"));
  CHECK_THROWS_WITH(PiecewiseConstantWithWarmup({20, 10}, {1.0, 0.1, 0.01}, 0), Catch::Contains("increase"));
}

TEST_CASE("schedule: the ResNet tutorial's parameters in epochs") {
  // ImageNet, global batch 512: 1281167 / 512 = 2502 steps per epoch (rounded down),
  // base rate 0.1 * 512 / 256 = 0.2, warmup 5 epochs, decays at epochs 30, 60, 80.
  auto s = PiecewiseConstantWithWarmup::from_epochs(512, 1281167, 5, {30, 60, 80}, {1.0, 0.1, 0.01, 0.001});
  CHECK(s->lr(0) == 0.0);
  CHECK(s->lr(6255) == Approx(0.1).epsilon(1e-15));  // halfway through 12510 warmup steps
  CHECK(s->lr(12510) == Approx(0.2).epsilon(1e-15));
  CHECK(s->lr(75060) == Approx(0.2).epsilon(1e-15));
  CHECK(s->lr(75061) == Approx(0.02).epsilon(1e-15));
  CHECK(s->lr(150121) == Approx(0.002).epsilon(1e-15));
  CHECK(s->lr(200161) == Approx(0.0002).epsilon(1e-15));
}

TEST_CASE("schedule: cosine") {
  CosineSchedule s(1.0, 100);
  CHECK(s.lr(0) == 1.0);
  CHECK(s.lr(50) == Approx(0.5).epsilon(1e-15));
  CHECK(s.lr(25) == Approx(0.5 * (1 + std::sqrt(0.5))).epsilon(1e-15));
  CHECK(s.lr(100) == Approx(0.0).margin(1e-15));
  CHECK(s.lr(250) == Approx(0.0).margin(1e-15));  // stays at the end value

  CosineSchedule floor(2.0, 100, 0.1);
  CHECK(floor.lr(50) == Approx(2.0 * (0.9 * 0.5 + 0.1)).epsilon(1e-15));
  CHECK(floor.lr(100) == Approx(0.2).epsilon(1e-15));

  CosineSchedule warm(1.0, 110, 0.0, 10);
  CHECK(warm.lr(5) == 0.5);
  CHECK(warm.lr(10) == 1.0);
  CHECK(warm.lr(60) == Approx(0.5).epsilon(1e-15));
  CHECK_THROWS(CosineSchedule(1.0, 10, 0.0, 10));
}

TEST_CASE("schedule: inverse square root with warmup (Transformer)") {
  InverseSqrtWithWarmup s(512, 4000);
  CHECK(s.lr(0) == 0.0);
  // At the end of warmup both branches meet: 512^-0.5 * 4000^-0.5 = 1 / sqrt(2048000).
  CHECK(s.lr(4000) == Approx(1.0 / std::sqrt(2048000.0)).epsilon(1e-14));
  // The paper's form, d^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1.
  for (int64_t step : {1, 100, 3999, 4001, 16000, 100000}) {
    const double paper = std::pow(512.0, -0.5) * std::min(std::pow(step, -0.5), step * std::pow(4000.0, -1.5));
    CHECK(s.lr(step) == Approx(paper).epsilon(1e-12));
  }
  InverseSqrtWithWarmup scaled(512, 16000, 2.0);  // the TF official big model's setting
  CHECK(scaled.lr(16000) == Approx(2.0 / std::sqrt(512.0 * 16000.0)).epsilon(1e-14));
}

// Optimizer::set_lr_factor (ReduceLROnPlateau's reductions) on a schedule: with s the
// schedule's rate, min(s, max(factor * s, floor)). Powers of two keep the products exact.
TEST_CASE("schedule: an optimizer's learning-rate factor scales the schedule, floored, never above it") {
  auto cosine = std::make_shared<CosineSchedule>(0.5, 100, 0.0, 10);
  SGD sgd(cosine);
  auto rate_at = [&](int64_t step) {
    sgd.set_step_count(step);
    return sgd.learning_rate();
  };
  for (int64_t step : {0, 5, 10, 50, 100}) {
    INFO("step " << step);
    sgd.set_lr_factor(1.0);
    CHECK(rate_at(step) == cosine->lr(step));  // factor 1: the schedule, bit for bit
    sgd.set_lr_factor(0.25);
    CHECK(rate_at(step) == 0.25 * cosine->lr(step));  // warmup and decay keep their shape
    sgd.set_lr_factor(0.25, 0.05);
    // The floor holds the reduced rate at 0.05, but never lifts it above the schedule
    // (0 at step 0 and at the end, 0.25 in mid-warmup).
    CHECK(rate_at(step) == std::min(cosine->lr(step), std::max(0.25 * cosine->lr(step), 0.05)));
  }
  // Worked out: warmup s = 0.5 * step / 10.
  sgd.set_lr_factor(0.25, 0.05);
  CHECK(rate_at(0) == 0.0);     // s = 0: the floor does not lift it
  CHECK(rate_at(2) == 0.05);    // s = 0.1, 0.25 s = 0.025: floored
  CHECK(rate_at(5) == 0.0625);  // s = 0.25, 0.25 s = 0.0625: above the floor
  // set_learning_rate gives the rate itself: the factor is folded in (reset to 1).
  sgd.set_learning_rate(0.125);
  CHECK(sgd.lr_factor() == 1.0);
  CHECK(sgd.learning_rate() == 0.125);
  CHECK_THROWS_AS(sgd.set_lr_factor(0.0), InputError);
  CHECK_THROWS_AS(sgd.set_lr_factor(1.5), InputError);
  CHECK_THROWS_AS(sgd.set_lr_factor(0.5, -1.0), InputError);
}
