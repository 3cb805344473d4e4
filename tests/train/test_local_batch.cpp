// Local batch sizes (Tarantella's micro_batch_size) and the distributed predict, on 1, 2 and
// 3 ranks (3 splits 7 or 32 unevenly, which 2 may hide):
// - fit(unbatched, micro_batch_size = m) batches with m x p itself: the weights of a serial
//   loop on global batches of m x p (a last partial one included), and bitwise those of
//   fit(batch_size = m x p);
// - evaluate and fit's validation_micro_batch_size do the same for their data;
// - predict, distributed, gives one rank's rows in the dataset's order, gathered on every
//   rank or on the master, for uneven splits, a partial last batch and a dataset smaller
//   than the number of ranks;
// - neither size, sizes that disagree (on some ranks only), and bad predict options are an
//   InputError on every rank.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <string>

namespace {

using tnt::test::weights_of;

constexpr int64_t kSamples = 96;
constexpr uint64_t kSeed = 11;

struct Data {
  tnt::Tensor images;  // (N, 1, 8, 8)
  tnt::Tensor labels;  // (N,) i64
};

Data make_data(int64_t n = kSamples) {
  Data d{tnt::Tensor::empty({n, 1, 8, 8}), tnt::Tensor::empty({n}, tnt::DType::i64)};
  tnt::CounterRng rng(321, "test_local_batch");
  float* x = d.images.data<float>();
  for (int64_t i = 0; i < d.images.numel(); ++i) x[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t k = 0; k < n; ++k) d.labels.data<int64_t>()[k] = k % 3;
  return d;
}

tnt::Dataset dataset(const Data& d) { return tnt::Dataset::from_tensors({d.images, d.labels}); }

std::shared_ptr<tnt::Sequential> make_net() { return tnt::test::small_cnn("small_cnn"); }

void compile(tnt::Model& model) {
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
}

// The serial reference: one process, global batches of `global` samples, the last one
// partial (its loss averaged over its real samples, as the padded distributed step does).
std::vector<std::vector<double>> train_serial(int epochs, int64_t global) {
  Data d = make_data();
  auto net = make_net();
  net->initialize(kSeed);
  tnt::SGD sgd(0.1);
  tnt::SoftmaxCrossEntropy loss;
  tnt::RunContext rc;
  rc.training = true;
  rc.seed = kSeed;
  for (int e = 0; e < epochs; ++e) {
    for (int64_t g = 0; g < kSamples; g += global) {
      const int64_t end = std::min(g + global, kSamples);
      net->zero_grad();
      auto out = net->forward({d.images.slice_rows(g, end)}, rc);
      tnt::SavedState s;
      loss.forward(out[0], d.labels.slice_rows(g, end), end - g, s);
      net->backward({loss.backward(s)}, rc);
      sgd.step(net->trainable_parameters());
      ++rc.step;
    }
  }
  return weights_of(*net);
}

// As in test_model_parallel: p ranks sum gradients in another order than one process, so
// weights after a few SGD steps on values of order 1 differ by a few float ulps; rtol 1e-4
// and atol 1e-5 leave room for that, while a wrong global batch (another step count, another
// loss scale) moves weights by 1e-2 or more here (checked below by the control).
double max_violation(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double worst = 0;
  REQUIRE(a.size() == b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t].size() == b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i) {
      worst = std::max(worst, std::fabs(a[t][i] - b[t][i]) - (1e-5 + 1e-4 * std::fabs(b[t][i])));
    }
  }
  return worst;
}

std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tnt::InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

// The global batch size the evaluation callbacks were told.
class EvalBatch : public tnt::Callback {
 public:
  EvalBatch() : tnt::Callback(Ranks::all) {}
  void on_test_begin(const tnt::Logs&) override { seen.push_back(eval_params_.batch_size); }
  std::vector<int64_t> seen;
};

}  // namespace

TEST_CASE("fit with micro_batch_size m batches with m x ranks: the serial weights of that global batch") {
  const int p = tnt::size();
  // 10 x p does not divide 96 for p = 1, 2, 3: a padded last batch every epoch.
  constexpr int64_t kMicro = 10;
  const int64_t global = kMicro * p;
  const auto serial = train_serial(2, global);
  // The control: the batch the ranks would use if micro_batch_size were taken as global.
  if (p > 1) REQUIRE(max_violation(train_serial(2, kMicro), serial) > 1e-3);

  auto net = make_net();
  tnt::Model model(net, kSeed);
  compile(model);
  tnt::FitOptions fit;
  fit.epochs = 2;
  fit.verbose = 0;
  fit.micro_batch_size = kMicro;
  model.fit(dataset(make_data()), fit);
  const auto by_micro = weights_of(*net);
  CHECK(max_violation(by_micro, serial) <= 0);
  CHECK(model.global_step() == 2 * ((kSamples + global - 1) / global));

  // The same global batch given as batch_size: the same code path, bitwise.
  auto net2 = make_net();
  tnt::Model model2(net2, kSeed);
  compile(model2);
  fit.micro_batch_size = 0;
  fit.batch_size = global;
  model2.fit(dataset(make_data()), fit);
  CHECK(weights_of(*net2) == by_micro);
}

TEST_CASE("micro_batch_size with a batch_size it agrees with keeps the consistency check") {
  // 32 over 3 ranks: 11, 11, 10. Each rank's own share is accepted, as before.
  auto net = make_net();
  tnt::Model model(net, kSeed);
  compile(model);
  tnt::FitOptions fit;
  fit.verbose = 0;
  fit.batch_size = 32;
  fit.micro_batch_size = tnt::micro_batch_size(32, tnt::rank(), tnt::size());
  CHECK_NOTHROW(model.fit(dataset(make_data()), fit));
}

TEST_CASE("evaluate and fit's validation take micro_batch_size x ranks as their global batch") {
  const int p = tnt::size();
  tnt::Model model(make_net(), kSeed);
  compile(model);
  const tnt::Dataset data = dataset(make_data());
  const tnt::Dataset val = dataset(make_data(23));  // 23: a partial last batch for 7 x p

  SECTION("evaluate") {
    tnt::EvaluateOptions by_micro;
    by_micro.micro_batch_size = 7;
    tnt::Logs a = model.evaluate(val, by_micro);
    tnt::EvaluateOptions by_global;
    by_global.batch_size = 7 * p;
    tnt::Logs b = model.evaluate(val, by_global);
    // Same partition, same sums, same order: bitwise.
    CHECK(a == b);
    CHECK(a.at("accuracy") > 0);
  }
  SECTION("fit's validation_micro_batch_size") {
    auto seen = std::make_shared<EvalBatch>();
    tnt::FitOptions fit;
    fit.verbose = 0;
    fit.micro_batch_size = 5;
    fit.validation_micro_batch_size = 7;
    fit.validation_data = val;
    fit.callbacks = {seen};
    tnt::History h = model.fit(data, fit);
    REQUIRE(seen->seen == std::vector<int64_t>{7 * p});
    tnt::EvaluateOptions ev;
    ev.batch_size = 7 * p;
    CHECK(h.last("val_loss") == model.evaluate(val, ev).at("loss"));
  }
  SECTION("fit's validation batch defaults to the training global batch") {
    auto seen = std::make_shared<EvalBatch>();
    tnt::FitOptions fit;
    fit.verbose = 0;
    fit.micro_batch_size = 5;
    fit.validation_data = val;
    fit.callbacks = {seen};
    model.fit(data, fit);
    CHECK(seen->seen == std::vector<int64_t>{5 * p});
  }
}

TEST_CASE("neither batch_size nor micro_batch_size is an error naming both, on every rank") {
  tnt::Model model(make_net(), kSeed);
  compile(model);
  const tnt::Dataset data = dataset(make_data());
  std::string msg = input_error_of([&] { model.fit(data, tnt::FitOptions{}); });
  CHECK_THAT(msg, Catch::Contains("fit: batch_size=0 and micro_batch_size=0"));
  msg = input_error_of([&] { model.evaluate(data, tnt::EvaluateOptions{}); });
  CHECK_THAT(msg, Catch::Contains("evaluate: batch_size=0 and micro_batch_size=0"));
  msg = input_error_of([&] { model.predict(data, tnt::PredictOptions{}); });
  CHECK_THAT(msg, Catch::Contains("predict: batch_size=0 and micro_batch_size=0"));
  tnt::FitOptions fit;
  fit.batch_size = 32;
  fit.validation_data = data;
  fit.validation_batch_size = -1;
  msg = input_error_of([&] { model.fit(data, fit); });
  CHECK_THAT(msg, Catch::Contains("fit: validation_batch_size=-1 must be positive"));
  fit = {};
  fit.micro_batch_size = -2;
  msg = input_error_of([&] { model.fit(data, fit); });
  CHECK_THAT(msg, Catch::Contains("fit: micro_batch_size=-2 must be positive"));
}

TEST_CASE("a micro_batch_size that fits some ranks' share only is an error on every rank") {
  // 32 over 3 ranks gives 11, 11, 10: 11 fits ranks 0 and 1, not 2. Every rank must throw
  // (a rank that went on would wait in the first collective for the one that threw).
  tnt::Model model(make_net(), kSeed);
  compile(model);
  const tnt::Dataset data = dataset(make_data());
  tnt::FitOptions fit;
  fit.verbose = 0;
  fit.batch_size = 32;
  fit.micro_batch_size = 11;
  const int p = tnt::size();
  if (p == 3) {
    std::string msg = input_error_of([&] { model.fit(data, fit); });
    CHECK_THAT(msg, Catch::Contains("fit: micro_batch_size=11 disagrees with batch_size=32: over 3 ranks that is "
                                    "11, 11, 10 (ranks 0 to 2) samples per rank; give one of the two"));
  } else {
    CHECK_THAT(input_error_of([&] { model.fit(data, fit); }),
               Catch::Contains("fit: micro_batch_size=11 disagrees with batch_size=32"));
  }
  tnt::EvaluateOptions ev;
  ev.batch_size = 32;
  ev.micro_batch_size = 11;
  CHECK_THAT(input_error_of([&] { model.evaluate(data, ev); }),
             Catch::Contains("evaluate: micro_batch_size=11 disagrees with batch_size=32"));
  tnt::PredictOptions pr;
  pr.batch_size = 32;
  pr.micro_batch_size = 11;
  CHECK_THAT(input_error_of([&] { model.predict(data, pr); }),
             Catch::Contains("predict: micro_batch_size=11 disagrees with batch_size=32"));
  fit.micro_batch_size = 0;
  fit.validation_data = data;
  fit.validation_batch_size = 32;
  fit.validation_micro_batch_size = 11;
  CHECK_THAT(input_error_of([&] { model.fit(data, fit); }),
             Catch::Contains("fit: validation_micro_batch_size=11 disagrees with validation_batch_size=32"));
  // The model is still usable afterwards on every rank (no rank was left in a collective).
  fit = {};
  fit.verbose = 0;
  fit.micro_batch_size = 4;
  CHECK_NOTHROW(model.fit(data, fit));
}

TEST_CASE("the ranks' own micro-batches, as many on every rank, are checked before the first step") {
  // distribute_dataset=false: the last rank has one micro-batch more. Before, the others
  // trained the first epoch and found out at its end, when they ran out first.
  tnt::Model model(make_net(), kSeed);
  compile(model);
  const int p = tnt::size();
  const int64_t batches = tnt::rank() == p - 1 && p > 1 ? 3 : 2;
  const tnt::Dataset mine = dataset(make_data(4 * batches)).batch(4);
  tnt::FitOptions fit;
  fit.verbose = 0;
  fit.distribute_dataset = false;
  if (p == 1) {
    CHECK(model.fit(mine, fit).epochs.size() == 1);
    return;
  }
  const std::string msg = input_error_of([&] { model.fit(mine, fit); });
  CHECK_THAT(msg, Catch::Contains("fit: the ranks' passes over their data differ") &&
                      Catch::Contains("2 micro-batches an epoch (distribute_dataset=false)") &&
                      Catch::Contains("3 micro-batches an epoch"));
  CHECK(model.global_step() == 0);  // refused before any step
  // A max_steps beyond the shorter count changes nothing: refused the same way.
  fit.max_steps = 1000;
  CHECK_THAT(input_error_of([&] { model.fit(mine, fit); }), Catch::Contains("micro-batches an epoch"));
  // With max_steps the ranks stop together before the shorter one runs out: allowed.
  fit.max_steps = 2;
  CHECK(model.fit(mine, fit).epochs.size() == 1);
}

TEST_CASE("distributed predict gives one rank's rows in the dataset's order") {
  const int p = tnt::size();
  tnt::Model model(make_net(), kSeed);
  compile(model);
  // Trained a little, so that rows differ in more than their inputs' noise.
  tnt::FitOptions fit;
  fit.verbose = 0;
  fit.micro_batch_size = 8;
  model.fit(dataset(make_data()), fit);

  struct Case {
    int64_t samples;
    int64_t batch_size;
    int64_t micro_batch_size;
  };
  // 96 in 10 x p: a partial last batch; 7 in 5: 2, 2, 1 on 3 ranks and a last batch of 2
  // (rank 2 gets padding only); 2 and 1 samples, fewer than the ranks: one batch, partial.
  const std::vector<Case> cases{{96, 0, 10}, {7, 5, 0}, {2, 0, 1}, {1, 0, 1}, {1, std::max(p, 1), 0}};
  for (const Case& c : cases) {
    for (tnt::Gather gather : {tnt::Gather::all, tnt::Gather::master}) {
      INFO("samples " << c.samples << ", batch_size " << c.batch_size << ", micro_batch_size "
                      << c.micro_batch_size << ", gather " << (gather == tnt::Gather::all ? "all" : "master")
                      << ", rank " << tnt::rank() << " of " << p);
      const tnt::Dataset data = dataset(make_data(c.samples));
      // The reference: this rank alone, in batches of the global batch.
      const int64_t global = c.batch_size > 0 ? c.batch_size : c.micro_batch_size * p;
      const tnt::Tensor reference = model.predict(data, global);
      REQUIRE(reference.dim(0) == c.samples);
      tnt::PredictOptions options;
      options.batch_size = c.batch_size;
      options.micro_batch_size = c.micro_batch_size;
      options.gather = gather;
      // Counts the elements built: distribute() steps over other ranks' elements of a
      // random-access source without building them.
      auto built = std::make_shared<std::atomic<int64_t>>(0);
      const Data d = make_data(c.samples);
      const tnt::Dataset counted = tnt::Dataset::from_function(c.samples, [d, built](int64_t i) {
        ++*built;
        return tnt::Element{d.images.slice_rows(i, i + 1).reshape({1, 8, 8}), d.labels.slice_rows(i, i + 1).reshape({})};
      });
      const tnt::Tensor got = model.predict(counted, options);
      // Each rank predicted its share, not the whole dataset.
      if (p > 1 && c.samples == kSamples) CHECK(built->load() < c.samples);
      if (gather == tnt::Gather::master && !tnt::is_master_rank()) {
        CHECK_FALSE(got.defined());
        continue;
      }
      REQUIRE(got.defined());
      REQUIRE(got.shape() == reference.shape());
      // Bitwise: a row's output does not depend on the other rows of its batch here (the
      // CPU engines compute each sample's row alone; no statistics across the batch).
      CHECK(got.to_double_vector() == reference.to_double_vector());
    }
  }
}

TEST_CASE("predict's local form and its bad options") {
  tnt::Model model(make_net(), kSeed);
  compile(model);
  const tnt::Dataset data = dataset(make_data(9));
  // distribute_dataset=false: this rank's own batches, no collective.
  tnt::PredictOptions local;
  local.distribute_dataset = false;
  const tnt::Tensor a = model.predict(data.batch(4), local);
  CHECK(a.dim(0) == 9);
  CHECK(a.to_double_vector() == model.predict(data, 4).to_double_vector());
  local.batch_size = 4;
  CHECK_THAT(input_error_of([&] { model.predict(data, local); }),
             Catch::Contains("predict: distribute_dataset=false predicts the dataset's own batches"));
  tnt::PredictOptions options;
  options.micro_batch_size = 2;
  CHECK_THAT(input_error_of([&] { model.predict(data.take(0), options); }),
             Catch::Contains("predict: the dataset is empty"));
}
