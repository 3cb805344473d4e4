// The training loop's data-parallel contract, checked on 1, 2 and 3 ranks (3 does not
// divide the global batch of 32): p ranks on global batch B give the weights that a plain
// serial loop gives on the same B samples; micro_batch_size and distribute_dataset=false
// give the same; two runs with one seed are bitwise equal; a run resumed from a checkpoint
// is bitwise equal to the uninterrupted one; a step that fails during backward leaves the
// model able to fit again.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>

namespace {

using tnt::test::weights_of;

constexpr int64_t kSamples = 96;   // 3 global batches of 32
constexpr int64_t kBatch = 32;
constexpr uint64_t kSeed = 7;

// A small CNN with every kind of layer whose gradient crosses ranks: conv, pooling, dense;
// `after_conv`, if given, goes between conv1 and relu1.
std::shared_ptr<tnt::Sequential> make_net(std::shared_ptr<tnt::Layer> after_conv = nullptr) {
  return tnt::test::small_cnn("small_cnn", /*conv_bias=*/true, std::move(after_conv));
}

// Deterministic data: images from a counter-based generator, labels from a rule the
// network can learn (which quadrant is brightest, mod 3).
struct Data {
  tnt::Tensor images;  // (N, 1, 8, 8)
  tnt::Tensor labels;  // (N,) i64
};

Data make_data() {
  Data d{tnt::Tensor::empty({kSamples, 1, 8, 8}), tnt::Tensor::empty({kSamples}, tnt::DType::i64)};
  tnt::CounterRng rng(123, "test_model_parallel");
  float* x = d.images.data<float>();
  for (int64_t i = 0; i < d.images.numel(); ++i) x[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t n = 0; n < kSamples; ++n) d.labels.data<int64_t>()[n] = n % 3;
  return d;
}

// Dropout after conv1: its masks are keyed on each sample's index in the global batch
// (RunContext::sample_offset), so p ranks draw the masks one process draws.
std::shared_ptr<tnt::Layer> maybe_dropout(bool dropout) {
  return dropout ? std::make_shared<tnt::Dropout>(0.25, "drop1") : nullptr;
}

std::vector<std::vector<double>> train_with_model(int epochs, bool distribute, int64_t micro_batch,
                                                  bool dropout = false) {
  Data d = make_data();
  auto net = make_net(maybe_dropout(dropout));
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  tnt::FitOptions fit;
  fit.epochs = epochs;
  fit.verbose = 0;
  fit.batch_size = kBatch;
  fit.micro_batch_size = micro_batch;
  fit.distribute_dataset = distribute;
  if (distribute) {
    model.fit(tnt::Dataset::from_tensors({d.images, d.labels}), fit);
  } else {
    // The user's own sharding: each rank's contiguous slice of every global batch.
    int64_t b = tnt::micro_batch_size(kBatch, tnt::rank(), tnt::size());
    int64_t off = tnt::micro_batch_offset(kBatch, tnt::rank(), tnt::size());
    std::vector<int64_t> rows;
    for (int64_t g = 0; g < kSamples; g += kBatch)
      for (int64_t i = 0; i < b; ++i) rows.push_back(g + off + i);
    tnt::Tensor xi = tnt::Tensor::empty({static_cast<int64_t>(rows.size()), 1, 8, 8});
    tnt::Tensor yi = tnt::Tensor::empty({static_cast<int64_t>(rows.size())}, tnt::DType::i64);
    for (size_t r = 0; r < rows.size(); ++r) {
      tnt::Tensor dst = xi.slice_rows(r, r + 1);
      dst.copy_from(d.images.slice_rows(rows[r], rows[r] + 1));
      yi.data<int64_t>()[r] = d.labels.data<int64_t>()[rows[r]];
    }
    fit.micro_batch_size = 0;
    model.fit(tnt::Dataset::from_tensors({xi, yi}).batch(b), fit);
  }
  return weights_of(*net);
}

// The serial reference: no Model, no communication; one process on whole global batches.
// before_epoch(net, e), if given, runs at the start of each epoch (to freeze a parameter).
std::vector<std::vector<double>> train_serial(int epochs, bool dropout = false,
                                              const std::function<void(tnt::Network&, int)>& before_epoch = {}) {
  Data d = make_data();
  auto net = make_net(maybe_dropout(dropout));
  net->initialize(kSeed);
  tnt::SGD sgd(0.1);
  tnt::SoftmaxCrossEntropy loss;
  tnt::RunContext rc;
  rc.training = true;
  rc.seed = kSeed;
  for (int e = 0; e < epochs; ++e) {
    if (before_epoch) before_epoch(*net, e);
    for (int64_t g = 0; g < kSamples; g += kBatch) {
      net->zero_grad();
      auto out = net->forward({d.images.slice_rows(g, g + kBatch)}, rc);
      tnt::SavedState s;
      loss.forward(out[0], d.labels.slice_rows(g, g + kBatch), kBatch, s);
      net->backward({loss.backward(s)}, rc);
      sgd.step(net->trainable_parameters());
      ++rc.step;
    }
  }
  return weights_of(*net);
}

// Sums over p ranks are taken in another order than the serial sum; after 6 SGD steps on
// values of order 1 the differences stay within a few float ulps of the weights' scale.
// rtol 1e-4 and atol 1e-5 leave room for that and fail on any real error (a wrong scale
// factor or a missing rank's gradient moves weights by 1e-2 or more here).
void require_close(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t].size() == b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i) {
      INFO("tensor " << t << " element " << i << " on rank " << tnt::rank() << " of " << tnt::size());
      REQUIRE(std::fabs(a[t][i] - b[t][i]) <= 1e-5 + 1e-4 * std::fabs(b[t][i]));
    }
  }
}

}  // namespace

TEST_CASE("p ranks on global batch B give the serial weights") {
  auto serial = train_serial(2);
  auto before = make_net();
  before->initialize(kSeed);
  // The test would pass vacuously if training changed nothing.
  auto initial = weights_of(*before);
  double moved = 0;
  for (size_t t = 0; t < serial.size(); ++t)
    for (size_t i = 0; i < serial[t].size(); ++i) moved = std::max(moved, std::fabs(serial[t][i] - initial[t][i]));
  REQUIRE(moved > 1e-3);

  SECTION("distributed dataset") { require_close(train_with_model(2, true, 0), serial); }
  SECTION("with the matching micro_batch_size") {
    require_close(train_with_model(2, true, tnt::micro_batch_size(kBatch, tnt::rank(), tnt::size())), serial);
  }
  SECTION("distribute_dataset=false with the user's own micro-batches") {
    require_close(train_with_model(2, false, 0), serial);
  }
}

TEST_CASE("p ranks draw the serial dropout masks (each sample's offset in the global batch)") {
  auto serial = train_serial(2, /*dropout=*/true);
  // The masks matter: without them the weights differ.
  auto plain = train_serial(2, /*dropout=*/false);
  double differ = 0;
  for (size_t t = 0; t < serial.size(); ++t)
    for (size_t i = 0; i < serial[t].size(); ++i) differ = std::max(differ, std::fabs(serial[t][i] - plain[t][i]));
  REQUIRE(differ > 1e-3);
  SECTION("distributed dataset") { require_close(train_with_model(2, true, 0, true), serial); }
  SECTION("distribute_dataset=false") { require_close(train_with_model(2, false, 0, true), serial); }
}

TEST_CASE("a micro_batch_size that disagrees with the global batch is an error on every rank") {
  Data d = make_data();
  auto net = make_net();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.micro_batch_size = kBatch + 1;
  fit.verbose = 0;
  REQUIRE_THROWS_WITH(model.fit(tnt::Dataset::from_tensors({d.images, d.labels}), fit),
                      Catch::Contains("micro_batch_size=33"));
}

// Ranks that built different networks (another flag or program on one rank) exchange the
// initial weights tensor by tensor: before, the broadcasts paired tensors of other sizes and
// the job died inside MPI (SIGSEGV). Now every rank refuses it, naming the tensor and ranks.
TEST_CASE("ranks that built different networks are refused on every rank, naming the first tensor that differs") {
  auto build = [] {
    auto net = std::make_shared<tnt::Sequential>("mlp");
    net->add(std::make_shared<tnt::Dense>(tnt::rank() == 1 ? 16 : 8, "fc1"));
    net->add(std::make_shared<tnt::ReLU>("relu"));
    net->add(std::make_shared<tnt::Dense>(2, "fc2"));
    net->build({4});
    return net;
  };
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.verbose = 0;
  const auto refused = Catch::Matchers::Predicate<tnt::InputError>([](const tnt::InputError& e) {
    const std::string w = e.what();
    return w.find("the ranks built different networks (tensor 1: rank(s) 0") != std::string::npos &&
           w.find("parameter 'fc1.weight' (8, 4) f32") != std::string::npos &&
           w.find("parameter 'fc1.weight' (16, 4) f32") != std::string::npos;
  });
  tnt::Model model(build(), kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::Model other(build(), kSeed);
  other.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  if (tnt::size() == 1) {
    CHECK_NOTHROW(model.fit(tnt::test::threshold_data("nets"), fit));
    return;
  }
  CHECK_THROWS_MATCHES(model.fit(tnt::test::threshold_data("nets"), fit), tnt::InputError, refused);
  tnt::EvaluateOptions eo;
  eo.batch_size = 16;
  eo.verbose = 0;
  CHECK_THROWS_MATCHES(other.evaluate(tnt::test::threshold_data("nets"), eo), tnt::InputError, refused);
}

// BatchNorm's running statistics are each rank's own while it trains (its micro-batches);
// an evaluation (and predict) runs on the master's, the ones a checkpoint saves, so the
// printed results are those of the saved model (before: each rank evaluated its share with
// its own statistics).
TEST_CASE("an evaluation uses the master's BatchNorm statistics on every rank") {
  Data d = make_data();
  auto net = make_net(std::make_shared<tnt::BatchNorm>(tnt::BatchNormOptions{}, "bn1"));
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.verbose = 0;
  const tnt::Dataset data = tnt::Dataset::from_tensors({d.images, d.labels});
  model.fit(data, fit);
  // The sum of every buffer's values, and whether all ranks hold the same.
  auto same_on_every_rank = [&] {
    double sum = 0;
    for (const auto& b : net->named_buffers()) {
      const tnt::Tensor& t = b.param->value;  // running mean and variance (f32); the i64 count is alike
      if (t.dtype() != tnt::DType::f32) continue;
      for (int64_t i = 0; i < t.numel(); ++i) sum += t.data<float>()[i];
    }
    return tnt::communicator().allreduce_max(sum) == -tnt::communicator().allreduce_max(-sum);
  };
  if (tnt::size() > 1) CHECK_FALSE(same_on_every_rank());  // each rank's micro-batches: its own
  tnt::EvaluateOptions eo;
  eo.batch_size = kBatch;
  eo.verbose = 0;
  model.evaluate(data, eo);
  CHECK(same_on_every_rank());
  // A predict of the rank's own batches stays no collective: the master alone may call it
  // (a broadcast of the statistics there would wait for ranks that never come).
  if (tnt::is_master_rank()) {
    tnt::PredictOptions po;
    po.distribute_dataset = false;
    CHECK(model.predict(data.batch(16), po).dim(0) == kSamples);
  }
  tnt::communicator().barrier();
}

TEST_CASE("validation_data and distributed_validation_data together are an error") {
  Data d = make_data();
  tnt::Model model(make_net(), kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.verbose = 0;
  tnt::Dataset data = tnt::Dataset::from_tensors({d.images, d.labels});
  fit.validation_data = data;
  fit.distributed_validation_data = data.distribute(kBatch, tnt::Remainder::pad);
  REQUIRE_THROWS_WITH(model.fit(data, fit), Catch::Contains("pass one of them"));
}

// Freezing or unfreezing renumbers the trainable parameters between two fits: the Model
// must reduce the new set (the Reducer of the first fit knew one gradient less).
TEST_CASE("a parameter unfrozen between two fits is trained like the others") {
  auto set_trainable = [](tnt::Network& net, bool on) {
    for (auto& p : net.named_parameters()) {
      if (p.name == "conv1.weight") p.param->trainable = on;
    }
  };
  Data d = make_data();
  // Serial reference: one epoch with conv1.weight frozen, one with it trained.
  auto ref = train_serial(2, false, [&](tnt::Network& net, int e) { set_trainable(net, e == 1); });

  auto net = make_net();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.verbose = 0;
  tnt::Dataset data = tnt::Dataset::from_tensors({d.images, d.labels});
  set_trainable(*net, false);
  model.fit(data, fit);
  set_trainable(*net, true);
  model.fit(data, fit);
  require_close(weights_of(*net), ref);
}

TEST_CASE("an evaluation inside fit leaves the metric objects with the epoch's training totals") {
  Data d = make_data();
  tnt::Model model(make_net(), kSeed);
  auto accuracy = std::make_shared<tnt::Accuracy>();
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>(), {accuracy});
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.verbose = 0;
  // Validation on the first global batch only: one step, against three of training.
  fit.validation_data = tnt::Dataset::from_tensors({d.images.slice_rows(0, kBatch), d.labels.slice_rows(0, kBatch)});
  tnt::History h = model.fit(tnt::Dataset::from_tensors({d.images, d.labels}), fit);
  REQUIRE(h.history.count("val_accuracy") == 1);
  // This rank's share of the epoch's training samples, not of the validation batch.
  CHECK(accuracy->count() == static_cast<double>(3 * tnt::micro_batch_size(kBatch, tnt::rank(), tnt::size())));
}

TEST_CASE("fit before compile is an error") {
  auto net = make_net();
  tnt::Model model(net, kSeed);
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  Data d = make_data();
  REQUIRE_THROWS_WITH(model.fit(tnt::Dataset::from_tensors({d.images, d.labels}), fit), Catch::Contains("compile"));
}

TEST_CASE("two runs with one seed give bitwise-equal weights") {
  auto a = train_with_model(1, true, 0);
  auto b = train_with_model(1, true, 0);
  REQUIRE(a == b);
}

TEST_CASE("resuming from a checkpoint gives the uninterrupted run's weights bitwise") {
  namespace fs = std::filesystem;
  // One directory for the job, named by the master and shared (all ranks run on this host).
  std::string dir;
  if (tnt::is_master_rank()) {
    char tmpl[] = "/tmp/tnt_resume_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  tnt::communicator().broadcast(dir);
  const std::string path = dir + "/ck.safetensors";
  Data d = make_data();
  auto data = tnt::Dataset::from_tensors({d.images, d.labels}).shuffle(kSamples, 99);
  auto make_model = [&](std::shared_ptr<tnt::Sequential> net) {
    auto m = std::make_unique<tnt::Model>(net, kSeed);
    m->compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>(),
               {std::make_shared<tnt::Accuracy>()});
    return m;
  };
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.verbose = 0;

  auto full_net = make_net();
  auto full = make_model(full_net);
  fit.epochs = 3;
  full->fit(data, fit);

  auto first_net = make_net();
  auto first = make_model(first_net);
  fit.epochs = 1;
  first->fit(data, fit);
  first->save_checkpoint(path, 1);

  auto resumed_net = make_net();
  auto resumed = make_model(resumed_net);
  int epoch = resumed->load_checkpoint(path);
  REQUIRE(epoch == 1);
  fit.initial_epoch = epoch;
  fit.epochs = 3;
  resumed->fit(data, fit);
  REQUIRE(weights_of(*resumed_net) == weights_of(*full_net));
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) fs::remove_all(dir);
}

namespace {

// Identity, whose backward throws while `armed` is set: a step that fails in the middle of
// backpropagation, after the layers above it have handed their gradients to the Reducer.
class FailingBackward : public tnt::Layer {
 public:
  explicit FailingBackward(bool* armed) : tnt::Layer("failing_backward"), armed_(armed) {}
  std::string type() const override { return "FailingBackward"; }
  std::vector<tnt::Shape> output_shapes(const std::vector<tnt::Shape>& in) const override { return {in.at(0)}; }
  std::vector<tnt::Tensor> forward(const std::vector<tnt::Tensor>& in, const tnt::RunContext&,
                                   tnt::SavedState&) override {
    return {in.at(0)};
  }
  std::vector<tnt::Tensor> backward(const std::vector<tnt::Tensor>& g, const tnt::RunContext&,
                                    tnt::SavedState&) override {
    if (*armed_) throw std::runtime_error("backward failed on purpose");
    return {g.at(0)};
  }

 private:
  bool* armed_;
};

}  // namespace

TEST_CASE("a step that fails during backward leaves the model usable for the next fit") {
  // fc2's and fc1's gradients reach the Reducer before the failing layer throws, so the
  // Reducer is left mid-step. The next fit() must start clean (it used to fail with
  // "marked ready twice") and train exactly as a model that never failed: the failed step
  // changed no weight and no optimizer state.
  Data d = make_data();
  auto data = tnt::Dataset::from_tensors({d.images, d.labels});
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.verbose = 0;
  auto train = [&](bool fail_first) {
    bool armed = fail_first;
    auto net = make_net(std::make_shared<FailingBackward>(&armed));
    tnt::Model model(net, kSeed);
    tnt::SgdOptions momentum;
    momentum.momentum = 0.9;  // optimizer state, which the failed step must not touch either
    model.compile(std::make_shared<tnt::SGD>(0.1, momentum), std::make_shared<tnt::SoftmaxCrossEntropy>());
    if (fail_first) {
      REQUIRE_THROWS_WITH(model.fit(data, fit), Catch::Contains("backward failed on purpose"));
      armed = false;
    }
    model.fit(data, fit);
    return weights_of(*net);
  };
  auto clean = train(false);
  auto after_failure = train(true);
  REQUIRE(after_failure == clean);
}

TEST_CASE("logged metrics are global and equal on every rank") {
  Data d = make_data();
  auto net = make_net();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.verbose = 0;
  tnt::History h = model.fit(tnt::Dataset::from_tensors({d.images, d.labels}), fit);
  double loss = h.last("loss");
  double acc = h.last("accuracy");
  REQUIRE(std::isfinite(loss));
  auto lo = tnt::communicator().allreduce_min(std::vector<double>{loss, acc});
  auto hi = tnt::communicator().allreduce_max(std::vector<double>{loss, acc});
  REQUIRE(lo == hi);
  tnt::EvaluateOptions ev;
  ev.batch_size = kBatch;
  tnt::Logs e = model.evaluate(tnt::Dataset::from_tensors({d.images, d.labels}), ev);
  auto elo = tnt::communicator().allreduce_min(std::vector<double>{e["loss"], e["accuracy"]});
  auto ehi = tnt::communicator().allreduce_max(std::vector<double>{e["loss"], e["accuracy"]});
  REQUIRE(elo == ehi);
  // accuracy is a fraction of the 96 samples
  REQUIRE(std::fabs(e["accuracy"] * kSamples - std::round(e["accuracy"] * kSamples)) < 1e-9);
}
