// FitOptions::validation_split on 1-3 ranks: the last fraction of the global data set
// (Keras' floor(n * (1 - split)) first samples train) is held out and validated on. The
// held-out samples here are far from the others, with inverted labels, so training on any
// of them would move the weights; the run must equal a serial loop on the first samples
// alone, and its val_loss the serial loss on the held-out ones.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <cmath>
#include <limits>

namespace {

using tnt::test::weights_of;
using Weights = std::vector<std::vector<double>>;

constexpr int64_t kSamples = 70;
constexpr double kSplit = 0.25;
constexpr int64_t kTrain = 52;  // floor(70 * 0.75) = floor(52.5)
constexpr int64_t kBatch = 16;  // 3 full global batches and one of 4
constexpr uint64_t kSeed = 13;
constexpr double kLr = 0.3;

struct Data {
  tnt::Tensor x;  // (N, 4)
  tnt::Tensor y;  // (N,) i64
};

// threshold_data's rule on the first kTrain samples; the others at 3 + noise, labels inverted.
Data make_data() {
  Data d{tnt::Tensor::empty({kSamples, 4}), tnt::Tensor::empty({kSamples}, tnt::DType::i64)};
  tnt::CounterRng rng(77, "validation_split");
  float* x = d.x.data<float>();
  for (int64_t i = 0; i < kSamples * 4; ++i) x[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t n = 0; n < kSamples; ++n) {
    const bool held_out = n >= kTrain;
    if (held_out) {
      for (int64_t k = 0; k < 4; ++k) x[n * 4 + k] += 3.0f;
    }
    const bool above = x[n * 4] > (held_out ? 3.5f : 0.5f);
    d.y.data<int64_t>()[n] = above != held_out ? 1 : 0;
  }
  return d;
}

tnt::Dataset rows(const Data& d, int64_t from, int64_t to) {
  return tnt::Dataset::from_tensors({d.x.slice_rows(from, to), d.y.slice_rows(from, to)});
}

struct Run {
  Weights weights;
  double val_loss = 0;
};

Run fit(const tnt::Dataset& train, tnt::FitOptions options, int epochs = 2) {
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(kLr), std::make_shared<tnt::SoftmaxCrossEntropy>());
  options.batch_size = kBatch;
  options.epochs = epochs;
  options.verbose = 0;
  tnt::History h = model.fit(train, options);
  REQUIRE(h.history.at("val_loss").size() == static_cast<size_t>(epochs));
  return {weights_of(*net), h.last("val_loss")};
}

// One process, no Model: SGD on global batches of the first n_train samples, then the mean
// loss over the samples after them.
Run serial(const Data& d, int64_t n_train, int epochs = 2) {
  auto net = tnt::test::small_mlp();
  net->initialize(kSeed);
  tnt::SGD sgd(kLr);
  tnt::SoftmaxCrossEntropy loss;
  tnt::RunContext rc;
  rc.training = true;
  rc.seed = kSeed;
  for (int e = 0; e < epochs; ++e) {
    for (int64_t b = 0; b < n_train; b += kBatch) {
      const int64_t end = std::min(b + kBatch, n_train);
      net->zero_grad();
      auto out = net->forward({d.x.slice_rows(b, end)}, rc);
      tnt::SavedState s;
      loss.forward(out[0], d.y.slice_rows(b, end), end - b, s);
      net->backward({loss.backward(s)}, rc);
      sgd.step(net->trainable_parameters());
      ++rc.step;
    }
  }
  Run r;
  r.weights = weights_of(*net);
  tnt::RunContext eval;
  auto out = net->forward({d.x.slice_rows(n_train, kSamples)}, eval, false);
  tnt::SavedState s;
  r.val_loss = tnt::Loss::value(loss.forward(out[0], d.y.slice_rows(n_train, kSamples), kSamples - n_train, s));
  return r;
}

double max_abs_diff(const Weights& a, const Weights& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t].size() == b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i) m = std::max(m, std::fabs(a[t][i] - b[t][i]));
  }
  return m;
}

}  // namespace

TEST_CASE("validation_split holds out the last samples of the global data set") {
  const Data d = make_data();
  tnt::FitOptions options;
  options.validation_split = kSplit;
  const Run run = fit(rows(d, 0, kSamples), options);

  SECTION("the same as the first samples with the rest as validation_data, bit for bit") {
    tnt::FitOptions explicit_split;
    explicit_split.validation_data = rows(d, kTrain, kSamples);
    const Run by_hand = fit(rows(d, 0, kTrain), explicit_split);
    CHECK(run.weights == by_hand.weights);
    CHECK(run.val_loss == by_hand.val_loss);
  }
  SECTION("the serial loop on the first samples only, whatever the number of ranks") {
    const Run ref = serial(d, kTrain);
    // Training on the held-out samples too would have moved the weights far more than the
    // tolerance below (so the comparison can tell).
    REQUIRE(max_abs_diff(serial(d, kSamples).weights, ref.weights) > 1e-2);
    // p ranks sum gradients in another order than one process (a few f32 ulps per step);
    // after 8 steps at lr 0.3 on weights of order 1 that stays below 1e-5.
    CHECK(max_abs_diff(run.weights, ref.weights) <= 1e-5);
    // val_loss: per-sample losses summed in double over the ranks versus the loss kernel's
    // mean over 18 samples in one call, on weights within 1e-5 of each other and inputs
    // below 4.1: within 1e-4 relative.
    CHECK(run.val_loss == Approx(ref.val_loss).epsilon(1e-4));
  }
  SECTION("every rank logs the same val_loss") {
    std::vector<double> v{run.val_loss};
    REQUIRE(tnt::communicator().allreduce_min(v) == tnt::communicator().allreduce_max(v));
  }
}

TEST_CASE("validation_split's bad uses are input errors on every rank") {
  using Catch::Matchers::Contains;
  const Data d = make_data();
  auto fails_with = [&](tnt::FitOptions options, const std::string& text, tnt::Dataset data) {
    INFO(text);
    CHECK_THROWS_AS(fit(data, options), tnt::InputError);
    CHECK_THROWS_WITH(fit(data, options), Contains(text));
  };
  const tnt::Dataset all = rows(d, 0, kSamples);
  for (double bad : {1.0, -0.25, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    tnt::FitOptions o;
    o.validation_split = bad;
    fails_with(o, "must be in (0, 1)", all);
  }
  tnt::FitOptions both;
  both.validation_split = kSplit;
  both.validation_data = rows(d, 0, 8);
  fails_with(both, "validation_split=0.25 and validation data are both given", all);
  tnt::FitOptions too_much;
  too_much.validation_split = 0.99;  // floor(70 * 0.01) = 0 samples left to train on
  fails_with(too_much, "leaves 0 for training and 70 for validation", all);
  tnt::FitOptions own_batches;
  own_batches.validation_split = kSplit;
  own_batches.distribute_dataset = false;
  fails_with(own_batches, "needs distribute_dataset=true", all.batch(8));
  tnt::FitOptions unknown;
  unknown.validation_split = kSplit;
  tnt::Dataset stream = tnt::Dataset::generator([&](int64_t) -> tnt::ElementFn {
    return []() -> std::optional<tnt::Element> { return std::nullopt; };
  });
  fails_with(unknown, "needs a dataset of known size", stream);
  // A shuffle anywhere upstream, even under a map, changes the held-out samples per epoch.
  tnt::FitOptions shuffled;
  shuffled.validation_split = kSplit;
  fails_with(shuffled, "shuffled every epoch", all.shuffle(kSamples, 3).map([](tnt::Element e) { return e; }));
  CHECK_FALSE(all.map([](tnt::Element e) { return e; }).take(10).reshuffles_each_epoch());
  CHECK(all.shuffle(4, 1).take(10).reshuffles_each_epoch());
}

TEST_CASE("validation data that are empty, or differ between ranks, are input errors on every rank") {
  using Catch::Matchers::Contains;
  const Data d = make_data();
  const tnt::Dataset train = rows(d, 0, kTrain);
  // Before: val_loss 0 every epoch (a perfect model to EarlyStopping and save_best_only).
  tnt::FitOptions empty;
  empty.validation_data = rows(d, 0, kSamples).skip(kSamples);
  CHECK_THROWS_WITH(fit(train, empty), Contains("fit: validation_data is empty"));
  tnt::FitOptions no_step;
  no_step.distributed_validation_data = rows(d, 0, 8).distribute(kBatch, tnt::Remainder::drop);
  CHECK_THROWS_WITH(fit(train, no_step), Contains("fit: distributed_validation_data gives no step"));
  if (tnt::size() > 1) {
    // Before: each rank averaged its own set; the ranks' val_loss differed, silently.
    tnt::FitOptions uneven;
    uneven.validation_data = rows(d, kTrain, tnt::rank() == 0 ? kSamples : kSamples - 5);
    CHECK_THROWS_WITH(fit(train, uneven), Contains("validation samples"));
  }
}
