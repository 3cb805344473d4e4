// Gradient clipping (GradientClipping in tarantella/optim.hpp). On parameters that start at 0
// with SGD at lr 1 the update is p = -g exactly, so a step shows the clipped gradient itself,
// which is compared with the formula computed here. Then Model::fit on 1-3 ranks against
// a serial loop that clips with its own code, and with fp16 loss scaling (clipping sees the
// unscaled gradient). Bad thresholds, and ranks that clip differently, are InputErrors.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace tnt;

namespace {

using test::weights_of;

// Two parameters at 0: a with |g|_2 = 5, b with |g|_2 = 3 (global norm sqrt(34)).
const std::vector<float> kGradA = {3.0f, -4.0f};
const std::vector<float> kGradB = {1.0f, 2.0f, -2.0f};

struct Params {
  Parameter a, b;
  Params() {
    for (auto [p, g] : {std::pair{&a, &kGradA}, std::pair{&b, &kGradB}}) {
      const Shape shape{static_cast<int64_t>(g->size())};
      p->value = Tensor::zeros(shape);
      p->grad = Tensor::from_vector(*g, shape);
    }
  }
  std::vector<NamedParameter> named() { return {{"a", &a}, {"b", &b}}; }
};

// The gradients one SGD step at lr 1 from 0 applied: p = -g.
std::vector<std::vector<float>> applied(const GradientClipping& clipping) {
  Params ps;
  SGD sgd(1.0, {.clipping = clipping});
  sgd.step(ps.named());
  std::vector<std::vector<float>> out;
  for (Parameter* p : {&ps.a, &ps.b}) {
    std::vector<float> v = p->value.to_vector();
    for (float& x : v) x = -x;
    out.push_back(v);
  }
  return out;
}

std::vector<float> scaled(const std::vector<float>& g, double factor) {
  std::vector<float> out;
  for (float x : g) out.push_back(static_cast<float>(static_cast<double>(x) * factor));
  return out;
}

double norm_of(const std::vector<float>& g) {
  double s = 0;
  for (float x : g) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// The library rounds the factor limit/norm to f32 once and multiplies in f32; here the
// product is taken in double and rounded once. The two differ by at most 2 ulps of f32
// (2 * 2^-24 relative), so 3e-7 relative; a wrong factor (e.g. limit/norm^2, or the other
// tensor's norm) is off by 10% or more.
void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= 3e-7 * std::fabs(want[i]));
  }
}

}  // namespace

TEST_CASE("clipping: each mode gives the clipped gradient of its formula") {
  SECTION("by value: each element into [-2.5, 2.5]") {
    auto g = applied({.value = 2.5});
    CHECK(g[0] == std::vector<float>{2.5f, -2.5f});
    CHECK(g[1] == kGradB);  // within the limit: untouched
  }
  SECTION("by norm per tensor: a (norm 5) to norm 4, b (norm 3) untouched") {
    auto g = applied({.norm = 4.0});
    check_close(g[0], scaled(kGradA, 4.0 / norm_of(kGradA)));
    CHECK(g[1] == kGradB);
    CHECK(norm_of(g[0]) == Approx(4.0).epsilon(1e-6));
  }
  SECTION("by global norm: both tensors by 2 / sqrt(34)") {
    auto g = applied({.global_norm = 2.0});
    const double factor = 2.0 / std::sqrt(norm_of(kGradA) * norm_of(kGradA) + norm_of(kGradB) * norm_of(kGradB));
    check_close(g[0], scaled(kGradA, factor));
    check_close(g[1], scaled(kGradB, factor));
  }
  SECTION("global norm then value: the norm first (to 2 / sqrt(34) g), then each element into [-0.5, 0.5]") {
    auto g = applied({.value = 0.5, .global_norm = 2.0});
    const double factor = 2.0 / std::sqrt(34.0);
    std::vector<float> want_a = scaled(kGradA, factor), want_b = scaled(kGradB, factor);
    for (float& x : want_a) x = std::fmax(-0.5f, std::fmin(0.5f, x));
    for (float& x : want_b) x = std::fmax(-0.5f, std::fmin(0.5f, x));
    REQUIRE(want_b[0] > -0.5f);  // b's first element stays inside, the others are cut
    check_close(g[0], want_a);
    check_close(g[1], want_b);
  }
  SECTION("a NaN gradient stays NaN under clipping by value (the loss scaler must see it)") {
    Params ps;
    ps.a.grad.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    SGD sgd(1.0, {.clipping = {.value = 1.0}});
    sgd.step(ps.named());
    CHECK(std::isnan(ps.a.value.to_vector()[0]));
  }
}

TEST_CASE("clipping: thresholds the gradients stay within leave the steps bitwise unchanged") {
  // Adam over three steps: every bit of the gradient reaches the parameters and the state.
  auto run = [](const GradientClipping& clipping) {
    Params ps;
    Adam adam(0.1, {.clipping = clipping});
    for (int step = 0; step < 3; ++step) {
      ps.a.grad.copy_from(Tensor::from_vector(scaled(kGradA, 0.3 + step), {2}));
      ps.b.grad.copy_from(Tensor::from_vector(scaled(kGradB, 1.7 - step), {3}));
      adam.step(ps.named());
    }
    std::vector<float> out = ps.a.value.to_vector();
    for (float x : ps.b.value.to_vector()) out.push_back(x);
    return out;
  };
  const std::vector<float> plain = run({});
  // Largest gradient: |g| <= 4 * 2.3 = 9.2, tensor norm <= 5 * 2.3 = 11.5, global <= sqrt(34) * 2.3 < 13.5.
  for (const GradientClipping& c :
       {GradientClipping{.value = 9.5}, GradientClipping{.norm = 12.0}, GradientClipping{.global_norm = 13.5},
        GradientClipping{.value = 9.5, .norm = 12.0}}) {
    INFO(c.describe());
    const std::vector<float> clipped = run(c);
    REQUIRE(clipped.size() == plain.size());
    CHECK(std::memcmp(clipped.data(), plain.data(), plain.size() * sizeof(float)) == 0);
  }
  // ... and one that bites does change them.
  CHECK(run({.global_norm = 1.0}) != plain);
}

TEST_CASE("clipping: non-positive thresholds are input errors naming the threshold") {
  using Catch::Matchers::Contains;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {0.0, -1.0, nan}) {
    INFO("threshold " << bad);
    CHECK_THROWS_AS(SGD(0.1, {.clipping = {.value = bad}}), InputError);
    CHECK_THROWS_WITH(SGD(0.1, {.clipping = {.value = bad}}), Contains("clip value") && Contains("must be positive"));
    CHECK_THROWS_AS(Adam(0.1, {.clipping = {.norm = bad}}), InputError);
    CHECK_THROWS_WITH(Adam(0.1, {.clipping = {.norm = bad}}), Contains("clip norm"));
    SGD sgd(0.1);
    CHECK_THROWS_AS(sgd.set_clipping({.global_norm = bad}), InputError);
    CHECK_THROWS_WITH(sgd.set_clipping({.global_norm = bad}), Contains("clip global norm"));
    CHECK_FALSE(sgd.clipping().active());  // a refused setting leaves the old one
  }
  CHECK_THROWS_AS(AdamW(0.1, {.clipping = {.norm = 1.0, .global_norm = 1.0}}), InputError);
  CHECK_THROWS_WITH(AdamW(0.1, {.clipping = {.norm = 1.0, .global_norm = 1.0}}), Contains("choose one"));
  SGD sgd(0.1, {.clipping = {.value = 0.5, .global_norm = 2.0}});
  CHECK_THAT(sgd.describe(), Catch::Matchers::EndsWith(", clip_value=0.5, clip_global_norm=2)"));
}

// ---------------------------------------------------------------------------------------
// In Model::fit, on 1 and 2 ranks

namespace {

constexpr int64_t kBatch = 16;  // 4 steps per epoch over threshold_data's 64 samples
constexpr uint64_t kSeed = 3;
constexpr double kLr = 0.5;

struct Reference {
  std::vector<std::vector<double>> weights;
  int clipped_steps = 0;  // steps whose clipping changed the gradient
  double max_abs_grad = 0;
};

// The serial loop with clipping written out here: the global batch's gradients, then the
// mode's formula on them (norms in double), then plain SGD.
Reference serial_clipped(const GradientClipping& c, int epochs) {
  Dataset data = test::threshold_data("clip");
  Element all = *data.batch(64).iterate(0).next();
  auto net = test::small_mlp();
  net->initialize(kSeed);
  SGD sgd(kLr);
  SoftmaxCrossEntropy loss;
  RunContext rc;
  rc.training = true;
  rc.seed = kSeed;
  Reference ref;
  for (int e = 0; e < epochs; ++e) {
    for (int64_t b = 0; b < 64; b += kBatch) {
      net->zero_grad();
      auto out = net->forward({all[0].slice_rows(b, b + kBatch)}, rc);
      SavedState s;
      loss.forward(out[0], all[1].slice_rows(b, b + kBatch), kBatch, s);
      net->backward({loss.backward(s)}, rc);
      std::vector<float*> grads;
      std::vector<int64_t> sizes;
      double global = 0;
      for (auto& np : net->trainable_parameters()) {
        grads.push_back(np.param->grad.data<float>());
        sizes.push_back(np.param->grad.numel());
        for (int64_t i = 0; i < sizes.back(); ++i) {
          global += static_cast<double>(grads.back()[i]) * grads.back()[i];
          ref.max_abs_grad = std::max(ref.max_abs_grad, std::fabs(static_cast<double>(grads.back()[i])));
        }
      }
      bool clipped = false;
      auto scale = [&](size_t t, double factor) {
        for (int64_t i = 0; i < sizes[t]; ++i) grads[t][i] = static_cast<float>(grads[t][i] * factor);
        clipped = true;
      };
      for (size_t t = 0; t < grads.size(); ++t) {
        if (c.global_norm && std::sqrt(global) > *c.global_norm) scale(t, *c.global_norm / std::sqrt(global));
        if (c.norm) {
          double sq = 0;
          for (int64_t i = 0; i < sizes[t]; ++i) sq += static_cast<double>(grads[t][i]) * grads[t][i];
          if (std::sqrt(sq) > *c.norm) scale(t, *c.norm / std::sqrt(sq));
        }
        if (c.value) {
          const float v = static_cast<float>(*c.value);
          for (int64_t i = 0; i < sizes[t]; ++i) {
            if (std::fabs(grads[t][i]) > v) {
              grads[t][i] = grads[t][i] > 0 ? v : -v;
              clipped = true;
            }
          }
        }
      }
      ref.clipped_steps += clipped ? 1 : 0;
      sgd.step(net->trainable_parameters());
      ++rc.step;
    }
  }
  ref.weights = weights_of(*net);
  return ref;
}

std::vector<std::vector<double>> fit_clipped(const GradientClipping& c, int epochs, Precision precision = {}) {
  auto net = test::small_mlp();
  Model model(net, kSeed);
  model.compile(std::make_shared<SGD>(kLr, SgdOptions{.clipping = c}), std::make_shared<SoftmaxCrossEntropy>(), {},
                precision);
  FitOptions fit;
  fit.batch_size = kBatch;
  fit.epochs = epochs;
  fit.verbose = 0;
  model.fit(test::threshold_data("clip"), fit);
  return weights_of(*net);
}

double max_abs_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t].size() == b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i) m = std::max(m, std::fabs(a[t][i] - b[t][i]));
  }
  return m;
}

// Every rank holds the same weights, bit for bit (the clipping factor is computed from
// bitwise-equal summed gradients on every rank).
void require_replicas_equal(const std::vector<std::vector<double>>& w) {
  std::vector<double> flat;
  for (const auto& t : w) flat.insert(flat.end(), t.begin(), t.end());
  REQUIRE(communicator().allreduce_min(flat) == communicator().allreduce_max(flat));
}

}  // namespace

TEST_CASE("clipping in fit on p ranks equals the serial loop clipping with its own code") {
  const int epochs = 2;
  const auto unclipped = serial_clipped({}, epochs).weights;
  // Thresholds below what this model's gradients reach (|g|_inf ~ 0.1-0.3, tensor norms
  // ~ 0.1-0.5), so that every step is clipped.
  for (const GradientClipping& c : {GradientClipping{.value = 0.02}, GradientClipping{.norm = 0.05},
                                    GradientClipping{.global_norm = 0.05}}) {
    INFO(c.describe() << " on " << size() << " rank(s)");
    const Reference ref = serial_clipped(c, epochs);
    REQUIRE(ref.clipped_steps == epochs * 64 / kBatch);
    REQUIRE(max_abs_diff(ref.weights, unclipped) > 1e-3);  // clipping mattered
    const auto got = fit_clipped(c, epochs);
    // On p ranks the gradient is summed in another order than serially (a few f32 ulps),
    // and the clipping factor follows the norm by the same relative amount; after 8 steps
    // at lr 0.5 on weights of order 1 that stays below 1e-5 absolute. A wrong factor (a
    // rank's local norm instead of the global one, the loss scale left in) moves weights by
    // more than 1e-3 here (the check above).
    CHECK(max_abs_diff(got, ref.weights) <= 1e-5);
    require_replicas_equal(got);
  }
}

TEST_CASE("clipping in fit with fp16 loss scaling acts on the unscaled gradient") {
  const Reference ref = serial_clipped({}, 1);
  // A limit above every unscaled gradient but below them all once scaled by fp16's
  // initial 65536: it bites only if it saw the scaled gradient.
  const double limit = 2.0 * ref.max_abs_grad;
  REQUIRE(ref.max_abs_grad * 65536.0 > 10.0 * limit);
  const Precision fp16 = Precision::from_name("fp16");
  REQUIRE(fp16.scales_loss());
  const auto plain = fit_clipped({}, 1, fp16);
  // fp16 activations round the gradients differently from f32 (which gave the limit) by
  // far less than a factor of 2, so the limit still stays clear of them.
  const auto with_limit = fit_clipped({.value = limit}, 1, fp16);
  CHECK(max_abs_diff(with_limit, plain) == 0.0);
  // A limit the unscaled gradients exceed does change the run (the clipping is in place).
  CHECK(max_abs_diff(fit_clipped({.value = ref.max_abs_grad / 4}, 1, fp16), plain) > 1e-4);
  require_replicas_equal(with_limit);
}

TEST_CASE("clipping that differs between ranks is an input error on every rank") {
  // Rank r clips at 1 + r: on one rank they agree and fit runs; on more, every rank fails
  // before the first step, naming the thresholds.
  auto net = test::small_mlp();
  Model model(net, kSeed);
  model.compile(std::make_shared<SGD>(kLr, SgdOptions{.clipping = {.norm = 1.0 + rank()}}),
                std::make_shared<SoftmaxCrossEntropy>());
  FitOptions fit;
  fit.batch_size = kBatch;
  fit.verbose = 0;
  if (size() == 1) {
    CHECK_NOTHROW(model.fit(test::threshold_data("clip"), fit));
  } else {
    CHECK_THROWS_AS(model.fit(test::threshold_data("clip"), fit), InputError);
    CHECK_THROWS_WITH(model.fit(test::threshold_data("clip"), fit),
                      Catch::Contains("clip gradients differently") && Catch::Contains("clip_norm=1") &&
                          Catch::Contains("clip_norm=2"));
  }
}

TEST_CASE("a learning rate, loss or metrics that differ between ranks are an input error on every rank") {
  // Before: another learning rate or label smoothing on one rank trained on, the replicas
  // drifting apart silently; other metrics failed at the first step with MPI_ERR_TRUNCATE.
  auto fit_with = [](double lr, double smoothing, bool accuracy) {
    Model model(test::small_mlp(), kSeed);
    std::vector<MetricPtr> metrics;
    if (accuracy) metrics.push_back(std::make_shared<Accuracy>());
    model.compile(std::make_shared<SGD>(lr), std::make_shared<SoftmaxCrossEntropy>(smoothing), metrics);
    FitOptions fit;
    fit.batch_size = kBatch;
    fit.verbose = 0;
    model.fit(test::threshold_data("agree"), fit);
  };
  const bool other = rank() == size() - 1;  // the last rank differs
  if (size() == 1) {
    CHECK_NOTHROW(fit_with(kLr * 2, 0.1, false));
    return;
  }
  CHECK_THROWS_WITH(fit_with(other ? kLr * 2 : kLr, 0.0, false),
                    Catch::Contains("the ranks compiled the model differently") && Catch::Contains("optimizer SGD(lr="));
  CHECK_THROWS_WITH(fit_with(kLr, other ? 0.1 : 0.0, false),
                    Catch::Contains("loss softmax_cross_entropy(label_smoothing=0.1"));
  CHECK_THROWS_WITH(fit_with(kLr, 0.0, other), Catch::Contains("metrics accuracy") && Catch::Contains("metrics none"));
}
