// EarlyStopping(restore_best_weights) and ReduceLROnPlateau, on 1 and 2 ranks: the weights
// fit leaves are those of the best epoch, bit for bit, on every rank (and BatchNorm's
// running statistics those each rank had then); ReduceLROnPlateau's
// rule on a crafted metric sequence (worked out by hand below), and inside fit on top of a
// schedule, every rank with the same rates.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"
#include "temp_dir.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using tnt::test::weights_of;
using Weights = std::vector<std::vector<double>>;

constexpr int64_t kBatch = 16;  // 4 steps per epoch over threshold_data's 64 samples

// Every buffer's values (BatchNorm's running statistics), in named_buffers() order.
Weights buffers_of(tnt::Network& net) {
  Weights b;
  for (auto& p : net.named_buffers()) b.push_back(p.param->value.to_double_vector());
  return b;
}

// The weights and buffers at the end of every epoch, as the test's own record.
class WeightsRecorder : public tnt::Callback {
 public:
  WeightsRecorder() : tnt::Callback(Ranks::all) {}
  void on_epoch_end(int, const tnt::Logs&) override {
    epochs.push_back(weights_of(model_->network()));
    buffers.push_back(buffers_of(model_->network()));
  }
  std::vector<Weights> epochs;
  std::vector<Weights> buffers;
};

// Every rank holds the same values, bit for bit.
void require_equal_on_all_ranks(const std::vector<double>& values) {
  REQUIRE(tnt::communicator().allreduce_min(values) == tnt::communicator().allreduce_max(values));
}

void require_equal_on_all_ranks(const Weights& w) {
  std::vector<double> flat;
  for (const auto& t : w) flat.insert(flat.end(), t.begin(), t.end());
  require_equal_on_all_ranks(flat);
}

struct EarlyStoppingRun {
  tnt::History history;
  Weights final_weights, final_buffers;
  std::vector<Weights> recorded, recorded_buffers;
  int best_epoch = -1;
  int stopped_epoch = -1;
};

// 64 images (1, 8, 8) for small_cnn, labelled by which half is brighter.
tnt::Dataset image_data() {
  tnt::Tensor x = tnt::Tensor::empty({64, 1, 8, 8});
  tnt::Tensor y = tnt::Tensor::empty({64}, tnt::DType::i64);
  tnt::CounterRng rng(17, "restore_images");
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t n = 0; n < 64; ++n) {
    double top = 0, bottom = 0;
    for (int64_t i = 0; i < 32; ++i) top += x.data<float>()[n * 64 + i];
    for (int64_t i = 32; i < 64; ++i) bottom += x.data<float>()[n * 64 + i];
    y.data<int64_t>()[n] = top > bottom ? 1 : 0;
  }
  return tnt::Dataset::from_tensors({x, y});
}

// Validation on the training data; epoch 2 trains at a rate 40 times too high, which throws
// the model off its best and takes several epochs to recover from. batchnorm: the small CNN
// with a BatchNorm (buffers to restore too) on images, else the MLP.
EarlyStoppingRun run_early_stopping(int epochs, int patience, bool restore, bool batchnorm = false) {
  std::shared_ptr<tnt::Network> net =
      batchnorm ? std::shared_ptr<tnt::Network>(
                      tnt::test::small_cnn("bn_cnn", false, std::make_shared<tnt::BatchNorm>("bn1")))
                : tnt::test::small_mlp();
  const tnt::Dataset data = batchnorm ? image_data() : tnt::test::threshold_data("restore");
  tnt::Model model(net, 5);
  model.compile(std::make_shared<tnt::SGD>(0.5), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.epochs = epochs;
  fit.verbose = 0;
  fit.validation_data = data;
  auto stop = std::make_shared<tnt::EarlyStopping>("val_loss", 0.0, patience, tnt::MonitorMode::automatic, restore);
  auto recorder = std::make_shared<WeightsRecorder>();
  fit.callbacks = {std::make_shared<tnt::LearningRateScheduler>([](int epoch, double) { return epoch == 2 ? 20.0 : 0.5; }),
                   stop, recorder};
  EarlyStoppingRun run;
  run.history = model.fit(data, fit);
  run.final_weights = weights_of(*net);
  run.final_buffers = buffers_of(*net);
  run.recorded = recorder->epochs;
  run.recorded_buffers = recorder->buffers;
  run.best_epoch = stop->best_epoch();
  run.stopped_epoch = stop->stopped_epoch();
  return run;
}

// The epoch with the lowest val_loss, from the history (the first of equal ones).
int best_in_history(const tnt::History& h) {
  const std::vector<double>& v = h.history.at("val_loss");
  return static_cast<int>(std::min_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

TEST_CASE("EarlyStopping with restore_best_weights leaves the best epoch's weights on every rank") {
  SECTION("stopped early") {
    const EarlyStoppingRun run = run_early_stopping(12, 2, true);
    REQUIRE(run.stopped_epoch >= 0);  // it did stop early
    REQUIRE(run.recorded.size() == static_cast<size_t>(run.stopped_epoch + 1));
    const int best = best_in_history(run.history);
    REQUIRE(run.best_epoch == best);
    REQUIRE(best < run.stopped_epoch);
    REQUIRE(run.recorded.back() != run.recorded[best]);  // restoring has something to do
    REQUIRE(run.final_weights == run.recorded[best]);
    require_equal_on_all_ranks(run.final_weights);
    require_equal_on_all_ranks(run.history.history.at("val_loss"));
  }
  SECTION("ran all its epochs, ending on a worse one") {
    const EarlyStoppingRun run = run_early_stopping(4, 10, true);
    REQUIRE(run.stopped_epoch == -1);
    REQUIRE(run.recorded.size() == 4);
    const int best = best_in_history(run.history);
    REQUIRE(best < 3);
    REQUIRE(run.recorded.back() != run.recorded[best]);
    REQUIRE(run.final_weights == run.recorded[best]);
    require_equal_on_all_ranks(run.final_weights);
  }
  SECTION("with BatchNorm: its running statistics come back too (each rank's own)") {
    const EarlyStoppingRun run = run_early_stopping(12, 2, true, /*batchnorm=*/true);
    REQUIRE(run.stopped_epoch >= 0);
    const int best = best_in_history(run.history);
    REQUIRE(best < run.stopped_epoch);
    REQUIRE(run.recorded_buffers.back() != run.recorded_buffers[best]);
    REQUIRE(run.final_weights == run.recorded[best]);
    REQUIRE(run.final_buffers == run.recorded_buffers[best]);
    require_equal_on_all_ranks(run.final_weights);
  }
  SECTION("without restore_best_weights the last epoch's weights stay") {
    const EarlyStoppingRun run = run_early_stopping(12, 2, false);
    REQUIRE(run.stopped_epoch >= 0);
    REQUIRE(run.final_weights == run.recorded.back());
  }
}

// Keras' rule with factor 0.5, patience 2, cooldown 1, min_delta 0.01, min_lr 0.2 on a
// crafted val_loss sequence, from rate 1:
//   e0 1.0    first value: best                                         lr 1
//   e1 0.9    < 1.0 - 0.01: best                                        lr 1
//   e2 0.895  not < 0.89: wait 1                                        lr 1
//   e3 0.9    wait 2 = patience: x0.5, cooldown 1                       lr 0.5
//   e4 0.8    cooldown ends (wait 0); < 0.89: best                      lr 0.5
//   e5 0.85   wait 1                                                    lr 0.5
//   e6 0.85   wait 2: x0.5, cooldown 1                                  lr 0.25
//   e7 0.85   cooldown ends (wait 0), then wait 1                       lr 0.25
//   e8 0.85   wait 2: 0.125 is below min_lr, so 0.2                     lr 0.2
//   e9 0.85   cooldown ends, wait 1                                     lr 0.2
//   e10 0.85  wait 2, but the rate is not above min_lr: no reduction    lr 0.2
TEST_CASE("ReduceLROnPlateau follows Keras' rule on a crafted metric sequence") {
  tnt::Model model(tnt::test::small_mlp(), 1);
  model.compile(std::make_shared<tnt::SGD>(1.0), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::ReduceLROnPlateau plateau("val_loss", 0.5, 2, 0.01, 1, 0.2);
  plateau.set_model(&model);
  plateau.on_train_begin({});
  const std::vector<double> val_loss = {1.0, 0.9, 0.895, 0.9, 0.8, 0.85, 0.85, 0.85, 0.85, 0.85, 0.85};
  const std::vector<double> want_lr = {1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2, 0.2};
  std::vector<double> lr;
  for (size_t e = 0; e < val_loss.size(); ++e) {
    plateau.on_epoch_end(static_cast<int>(e), {{"loss", 0.0}, {"val_loss", val_loss[e]}});
    lr.push_back(model.learning_rate());
  }
  CHECK(lr == want_lr);
  CHECK(plateau.reductions() == 3);
  // A metric that is not logged changes nothing.
  plateau.on_epoch_end(11, {{"loss", 0.0}});
  CHECK(model.learning_rate() == 0.2);
  // mode max: higher is better; a falling accuracy with patience 0 reduces at once.
  tnt::ReduceLROnPlateau by_acc("val_accuracy", 0.1, 0, 0.0);
  model.set_learning_rate(1.0);
  by_acc.set_model(&model);
  by_acc.on_train_begin({});
  by_acc.on_epoch_end(0, {{"val_accuracy", 0.5}});
  by_acc.on_epoch_end(1, {{"val_accuracy", 0.6}});
  CHECK(model.learning_rate() == 1.0);
  by_acc.on_epoch_end(2, {{"val_accuracy", 0.55}});
  CHECK(model.learning_rate() == Approx(0.1).epsilon(1e-15));
}

TEST_CASE("ReduceLROnPlateau's bad arguments are input errors naming them") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_AS(tnt::ReduceLROnPlateau("val_loss", 1.0), tnt::InputError);
  CHECK_THROWS_WITH(tnt::ReduceLROnPlateau("val_loss", 1.0), Contains("factor=1"));
  CHECK_THROWS_WITH(tnt::ReduceLROnPlateau("val_loss", 0.0), Contains("factor=0"));
  CHECK_THROWS_WITH(tnt::ReduceLROnPlateau("val_loss", 0.5, -1), Contains("patience=-1"));
  CHECK_THROWS_WITH(tnt::ReduceLROnPlateau("val_loss", 0.5, 1, 0.0, -2), Contains("cooldown=-2"));
  CHECK_THROWS_WITH(tnt::ReduceLROnPlateau("val_loss", 0.5, 1, 0.0, 0, -1.0), Contains("min_lr=-1"));
}

// In fit on a cosine schedule: "loss" with min_delta 100 never improves after epoch 0, so
// with patience 1 each epoch from the second on halves the factor. Epoch e's logged rate is
// that of its last step (4e + 3) times 0.5^max(0, e - 1): powers of two, so exact.
TEST_CASE("ReduceLROnPlateau in fit scales the schedule, identically on every rank") {
  const int epochs = 5;
  // alpha 0.1: the rate ends at 0.02, not 0 (a rate of 0 is not above min_lr 0: no reduction).
  auto schedule = std::make_shared<tnt::CosineSchedule>(0.2, epochs * 4, 0.1);
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, 9);
  model.compile(std::make_shared<tnt::SGD>(schedule), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.epochs = epochs;
  fit.verbose = 0;
  auto plateau = std::make_shared<tnt::ReduceLROnPlateau>("loss", 0.5, 1, 100.0);
  fit.callbacks = {plateau};
  tnt::History h = model.fit(tnt::test::threshold_data("plateau"), fit);
  std::vector<double> want;
  for (int e = 0; e < epochs; ++e) want.push_back(schedule->lr(4 * e + 3) * std::pow(0.5, std::max(0, e - 1)));
  CHECK(h.history.at("learning_rate") == want);
  CHECK(plateau->reductions() == epochs - 1);
  CHECK(model.optimizer().lr_factor() == std::pow(0.5, epochs - 1));
  require_equal_on_all_ranks(h.history.at("learning_rate"));
  require_equal_on_all_ranks(weights_of(*net));

  // The factor survives a checkpoint: a resumed run goes on at the reduced rate.
  tnt::test::TempDir dir("plateau");
  std::string base = dir.path.string();
  tnt::communicator().broadcast(base, tnt::master_rank());  // the master's directory for all
  const std::string path = base + "/ck.safetensors";
  model.save_checkpoint(path, epochs);
  tnt::Model resumed(tnt::test::small_mlp(), 9);
  resumed.compile(std::make_shared<tnt::SGD>(schedule), std::make_shared<tnt::SoftmaxCrossEntropy>());
  REQUIRE(resumed.optimizer().lr_factor() == 1.0);
  CHECK(resumed.load_checkpoint(path) == epochs);
  CHECK(resumed.optimizer().lr_factor() == model.optimizer().lr_factor());
  CHECK(resumed.optimizer().lr_floor() == model.optimizer().lr_floor());
  CHECK(resumed.learning_rate() == model.learning_rate());

  // A damaged factor in the file is named; a checkpoint without one resets the factor to 1.
  tnt::Checkpoint ck = tnt::Checkpoint::read(path);
  ck.set_metadata("lr_factor", "1.5");
  const std::string bad = base + "/bad.safetensors";
  const std::string plain = base + "/plain.safetensors";
  if (tnt::is_master_rank()) {
    ck.write(bad);
    tnt::Checkpoint without = tnt::Checkpoint::read(path);
    without.erase_metadata("lr_factor");
    without.erase_metadata("lr_floor");
    without.write(plain);
  }
  tnt::communicator().barrier();
  CHECK_THROWS_WITH(resumed.load_checkpoint(bad), Catch::Contains("lr_factor='1.5'"));
  CHECK(resumed.load_checkpoint(plain) == epochs);
  CHECK(resumed.optimizer().lr_factor() == 1.0);
  tnt::communicator().barrier();  // nobody reads the master's directory once it is removed
}
