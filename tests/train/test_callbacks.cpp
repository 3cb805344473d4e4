// Callbacks inside Model::fit on several ranks: the master-only ones write once, the
// all-rank ones make every rank act together (so nothing hangs).
#include <catch2/catch.hpp>

#include "capture_stderr.hpp"
#include "comm/collective_scope.hpp"

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"
#include "train/batch_sources.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

namespace {

std::shared_ptr<tnt::Sequential> make_net() { return tnt::test::small_mlp(); }

tnt::Dataset make_data() { return tnt::test::threshold_data("callbacks"); }

std::string job_dir() {
  std::string dir;
  if (tnt::is_master_rank()) {
    char tmpl[] = "/tmp/tnt_callbacks_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  tnt::communicator().broadcast(dir);
  return dir;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// Counts the hooks it sees.
class Counter : public tnt::Callback {
 public:
  explicit Counter(Ranks r) : tnt::Callback(r) {}
  void on_epoch_end(int, const tnt::Logs&) override { ++epochs; }
  void on_train_batch_end(int64_t, const tnt::Logs&) override { ++batches; }
  int epochs = 0;
  int batches = 0;
};

// Fit options of the cases below: global batch 16, quiet.
tnt::FitOptions quiet_fit(int epochs) {
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = epochs;
  fit.verbose = 0;
  return fit;
}

}  // namespace

TEST_CASE("CSVLogger and ModelCheckpoint write on the master only; History on every rank") {
  const std::string dir = job_dir();
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 3;
  fit.verbose = 0;
  fit.validation_data = make_data();
  auto master_counter = std::make_shared<Counter>(tnt::Callback::Ranks::master);
  auto all_counter = std::make_shared<Counter>(tnt::Callback::Ranks::all);
  auto checkpoint = std::make_shared<tnt::ModelCheckpoint>(dir + "/ck-{epoch}.safetensors", "val_loss");
  fit.callbacks = {std::make_shared<tnt::CSVLogger>(dir + "/history.csv"), checkpoint, master_counter, all_counter};
  tnt::History h = model.fit(make_data(), fit);

  REQUIRE(h.epochs == std::vector<int>{0, 1, 2});
  REQUIRE(h.history.at("loss").size() == 3);
  REQUIRE(h.history.at("val_accuracy").size() == 3);
  REQUIRE(all_counter->epochs == 3);
  REQUIRE(all_counter->batches == 12);  // 64 samples / 16 per global batch * 3 epochs
  REQUIRE(master_counter->epochs == (tnt::is_master_rank() ? 3 : 0));
  tnt::communicator().barrier();
  auto lines = lines_of(dir + "/history.csv");
  REQUIRE(lines.size() == 4);  // header + 3 epochs, written once even with several ranks
  REQUIRE(lines[0].rfind("epoch,", 0) == 0);
  REQUIRE(lines[1].rfind("1,", 0) == 0);
  REQUIRE(lines[3].rfind("3,", 0) == 0);
  for (int e = 1; e <= 3; ++e) REQUIRE(std::filesystem::exists(fmt::format("{}/ck-{:02d}.safetensors", dir, e)));
  // The checkpoint loads into a fresh model and holds the trained weights.
  tnt::Model other(make_net(), 99);
  other.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  REQUIRE(other.load_checkpoint(dir + "/ck-03.safetensors") == 3);
  auto a = model.network().named_parameters();
  auto b = other.network().named_parameters();
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i].param->value.to_vector() == b[i].param->value.to_vector());
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}

// Run by the CTest entry train_callbacks_output_on_all_devices.np2 with
// TNT_OUTPUT_ON_ALL_DEVICES=1 (what tarantella --output-on-all-devices sets): progress
// callbacks then run on every rank, but a file is still written by the master alone.
TEST_CASE("with output on all devices, CSVLogger still writes on the master only", "[.output_on_all_devices]") {
  REQUIRE(tnt::config().output_on_all_devices);
  const std::string dir = job_dir();
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 2;
  fit.verbose = 0;
  auto master_counter = std::make_shared<Counter>(tnt::Callback::Ranks::master);
  // A path of its own on each rank: a rank that writes shows up as its file.
  const std::string mine = fmt::format("{}/history-{}.csv", dir, tnt::rank());
  fit.callbacks = {std::make_shared<tnt::CSVLogger>(mine), master_counter};
  model.fit(make_data(), fit);
  CHECK(master_counter->epochs == 2);  // progress-type callbacks: every rank
  tnt::communicator().barrier();
  CHECK(std::filesystem::exists(mine) == tnt::is_master_rank());
  CHECK(lines_of(mine).size() == (tnt::is_master_rank() ? 3u : 0u));
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}

// Also under TNT_OUTPUT_ON_ALL_DEVICES=1: the ranks' lines land mixed on one terminal, so
// each starts with the rank's tag, and the bar is not redrawn in place even on a terminal
// (two ranks' bars on one line would overwrite each other). Fails if either line lacks the
// tag or the bar redraws.
TEST_CASE("with output on all devices, every line of print() and of the bar names its rank",
          "[.output_on_all_devices]") {
  REQUIRE(tnt::config().output_on_all_devices);
  const std::string tag = fmt::format("[rank {}] ", tnt::rank());
  CHECK(tnt::output_tag() == tag);
  const std::string dir = job_dir();
  const std::string path = fmt::format("{}/out-{}.txt", dir, tnt::rank());

  // print(): stdout goes to a file for the call; a message of two lines gets two tags.
  std::fflush(stdout);
  const int saved = ::dup(1);
  REQUIRE(saved >= 0);
  std::FILE* file = std::fopen(path.c_str(), "w+");
  REQUIRE(file != nullptr);
  REQUIRE(::dup2(::fileno(file), 1) == 1);
  tnt::print("first\nsecond");
  std::fflush(stdout);
  REQUIRE(::dup2(saved, 1) == 1);
  ::close(saved);

  // The bar, told that stdout is a terminal, still writes whole lines, each tagged.
  ::setenv("TNT_STDOUT_IS_TTY", "1", 1);
  double clock = 0;
  tnt::ProgressBar bar(tnt::ProgressBarOptions{file, [&clock] { return clock; }});
  tnt::TrainParams params;
  params.epochs = 1;
  params.steps = 20;
  params.verbose = 1;
  bar.set_params(params);
  bar.on_train_begin({});
  CHECK_FALSE(bar.redraws());
  bar.on_epoch_begin(0, {});
  for (int64_t step = 0; step < 20; ++step) {
    clock += 0.5;
    bar.on_train_batch_end(step, {{"loss", 0.5}});
  }
  bar.on_epoch_end(0, {{"loss", 0.5}});
  bar.on_train_end({});
  ::unsetenv("TNT_STDOUT_IS_TTY");
  std::fclose(file);

  const std::vector<std::string> lines = lines_of(path);
  REQUIRE(lines.size() >= 5);  // 2 printed, "Epoch 1/1", the tenths' lines, the epoch's line
  CHECK(lines[0] == tag + "first");
  CHECK(lines[1] == tag + "second");
  CHECK(lines[2] == tag + "Epoch 1/1");
  for (const std::string& line : lines) {
    INFO(line);
    CHECK(line.rfind(tag, 0) == 0);
    CHECK(line.find('\r') == std::string::npos);
  }
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}

TEST_CASE("CSVLogger continuing a resumed run drops the rows of the epochs it redoes") {
  const std::string dir = job_dir();
  const std::string path = dir + "/history.csv";
  // What a run that crashed after epoch 3's row, before epoch 3's checkpoint, leaves (the
  // checkpoint says epoch 2), and a row cut short by the crash.
  if (tnt::is_master_rank()) {
    std::ofstream out(path);
    out << "epoch,loss\n1,101\n2,102\n3,103\n4,10";
  }
  tnt::communicator().barrier();
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.initial_epoch = 2;
  fit.epochs = 4;
  fit.verbose = 0;
  fit.callbacks = {std::make_shared<tnt::CSVLogger>(path, /*append=*/true)};
  model.fit(make_data(), fit);
  tnt::communicator().barrier();
  const std::vector<std::string> lines = lines_of(path);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == "epoch,loss");
  CHECK(lines[1] == "1,101");
  CHECK(lines[2] == "2,102");
  CHECK(lines[3].rfind("3,", 0) == 0);
  CHECK(lines[3] != "3,103");  // this run's epoch 3
  CHECK(lines[4].rfind("4,", 0) == 0);
  CHECK(lines[4].find("4,10") != 0);  // ... and not glued to the partial line
  // The rewrite left no temporary file behind.
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}

TEST_CASE("ModelCheckpoint with save_best_only writes only on improvement") {
  const std::string dir = job_dir();
  tnt::Model model(make_net(), 3);
  // A learning rate of 0 never improves the loss after the first epoch.
  model.compile(std::make_shared<tnt::SGD>(0.0), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 3;
  fit.verbose = 0;
  fit.callbacks = {std::make_shared<tnt::ModelCheckpoint>(dir + "/best-{epoch}.safetensors", "loss", true)};
  model.fit(make_data(), fit);
  tnt::communicator().barrier();
  REQUIRE(std::filesystem::exists(dir + "/best-01.safetensors"));
  REQUIRE_FALSE(std::filesystem::exists(dir + "/best-02.safetensors"));
  REQUIRE_FALSE(std::filesystem::exists(dir + "/best-03.safetensors"));
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}

TEST_CASE("EarlyStopping stops every rank after patience epochs without improvement") {
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.0), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 10;
  fit.verbose = 0;
  auto stop = std::make_shared<tnt::EarlyStopping>("loss", 0.0, 1);
  fit.callbacks = {stop};
  tnt::History h = model.fit(make_data(), fit);
  // epoch 0 sets the best; 1 waits; 2 exceeds patience 1 and stops.
  REQUIRE(h.epochs.size() == 3);
  REQUIRE(stop->stopped_epoch() == 2);
}

TEST_CASE("LearningRateScheduler sets the rate each epoch and it is logged") {
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 3;
  fit.verbose = 0;
  fit.callbacks = {std::make_shared<tnt::LearningRateScheduler>([](int epoch, double) { return 0.1 / (1 << epoch); })};
  tnt::History h = model.fit(make_data(), fit);
  REQUIRE(h.history.at("learning_rate") == std::vector<double>{0.1, 0.05, 0.025});
}

TEST_CASE("TerminateOnNaN stops on a non-finite loss") {
  tnt::Model model(make_net(), 3);
  // An enormous learning rate makes the loss overflow within a few steps.
  model.compile(std::make_shared<tnt::SGD>(1e30), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 50;
  fit.verbose = 0;
  auto counter = std::make_shared<Counter>(tnt::Callback::Ranks::all);
  fit.callbacks = {std::make_shared<tnt::TerminateOnNaN>(), counter};
  tnt::History h = model.fit(make_data(), fit);
  REQUIRE(counter->batches < 50 * 4);
  REQUIRE_FALSE(std::isfinite(h.last("loss")));
}

TEST_CASE("metric_improved follows the metric's direction") {
  REQUIRE(tnt::metric_improved("val_loss", tnt::MonitorMode::automatic, 0.5, 0.6, 0.0));
  REQUIRE_FALSE(tnt::metric_improved("val_loss", tnt::MonitorMode::automatic, 0.7, 0.6, 0.0));
  REQUIRE(tnt::metric_improved("val_accuracy", tnt::MonitorMode::automatic, 0.7, 0.6, 0.0));
  REQUIRE_FALSE(tnt::metric_improved("val_accuracy", tnt::MonitorMode::automatic, 0.65, 0.6, 0.1));
  REQUIRE(tnt::metric_improved("x", tnt::MonitorMode::max, 2, 1, 0));
}

TEST_CASE("a stop asked for by a callback on the master alone stops every rank at the epoch's end") {
  // Before, the master left fit after the epoch and the other ranks waited for it in the
  // next step's collectives until TNT_COLLECTIVE_TIMEOUT.
  class StopAfterFirst : public tnt::Callback {
   public:
    StopAfterFirst() : tnt::Callback(Ranks::master) {}
    void on_epoch_end(int epoch, const tnt::Logs&) override {
      if (epoch == 0) model_->stop_training();
    }
  };
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit = quiet_fit(5);
  fit.callbacks = {std::make_shared<StopAfterFirst>()};
  const tnt::History h = model.fit(make_data(), fit);
  CHECK(h.epochs.size() == 1);  // on every rank
}

TEST_CASE("a stop asked for by a callback on the master alone inside an epoch stops every rank after the same step") {
  // Before, the master left the epoch's loop at once and the other ranks waited for it at the
  // next step's collectives until TNT_COLLECTIVE_TIMEOUT (10 minutes), with a message naming
  // no callback. The request now travels with the next step's metrics.
  class StopAt : public tnt::Callback {
   public:
    StopAt(const char* where, int64_t step) : tnt::Callback(Ranks::master), where_(where), step_(step) {}
    void on_train_begin(const tnt::Logs&) override {
      if (where_ == "train_begin") model_->stop_training();
    }
    void on_epoch_begin(int epoch, const tnt::Logs&) override {
      if (where_ == "epoch_begin" && epoch == 1) model_->stop_training();
    }
    void on_train_batch_begin(int64_t, const tnt::Logs&) override {
      if (where_ == "batch_begin" && model_->global_step() == step_) model_->stop_training();
    }
    void on_train_batch_end(int64_t, const tnt::Logs&) override {
      if (where_ == "batch_end" && model_->global_step() == step_) model_->stop_training();
    }

   private:
    std::string where_;
    int64_t step_;
  };
  // make_data's epoch holds several steps; step 2 is inside the first epoch.
  struct Case {
    const char* where;
    int64_t after_step;  // the global step every rank ends at
  };
  // batch_begin before step 3: carried by step 3; batch_end after step 2: by step 3;
  // epoch_begin of epoch 2: by its first step. On one rank nothing waits: the stop comes at
  // once, as in Keras (after step 2; epoch 2 with no step).
  const int64_t steps_per_epoch = [] {
    tnt::Model probe(make_net(), 3);
    probe.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
    tnt::FitOptions one = quiet_fit(1);
    probe.fit(make_data(), one);
    return probe.global_step();
  }();
  REQUIRE(steps_per_epoch >= 4);
  const bool several = tnt::size() > 1;
  for (const Case c : {Case{"train_begin", 0}, Case{"epoch_begin", steps_per_epoch + (several ? 1 : 0)},
                       Case{"batch_begin", 3}, Case{"batch_end", several ? 3 : 2}}) {
    DYNAMIC_SECTION(c.where) {
      tnt::Model model(make_net(), 3);
      model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
      tnt::FitOptions fit = quiet_fit(5);
      fit.callbacks = {std::make_shared<StopAt>(c.where, 2)};
      model.fit(make_data(), fit);
      const std::vector<int64_t> steps = tnt::communicator().allgather(model.global_step());
      for (const int64_t s : steps) CHECK(s == c.after_step);
    }
  }
}

TEST_CASE("a learning rate set by code that runs on some ranks only is refused, naming it") {
  // A callback on the master that sets the rate made the ranks train on with different rates
  // and weights, silently. Each rank enters the region itself here, so nothing waits.
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  const std::string where = "callback 'MyRate'";
  {
    const tnt::detail::SomeRanksRegion region(where, "the master only (Ranks::master)");
    CHECK_THROWS_WITH(model.set_learning_rate(0.5),
                      Catch::Contains("Model::set_learning_rate changes what every rank's replica must have alike, "
                                      "but it was called from callback 'MyRate'") &&
                          Catch::Contains("Callback::Ranks::all"));
  }
  CHECK(model.learning_rate() == 0.1);
  model.set_learning_rate(0.5);  // outside such code: every rank alike
  CHECK(model.learning_rate() == 0.5);
}

TEST_CASE("ranks whose data differ in size are refused by fit, evaluate and predict on every rank") {
  // Before, fit paired the steps of the rank with more samples with nothing (a wait until
  // TNT_COLLECTIVE_TIMEOUT) and evaluate averaged mismatched steps into a wrong loss.
  if (tnt::size() < 2) return;
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  const tnt::Dataset data = make_data().take(tnt::rank() == 0 ? 64 : 32);
  tnt::FitOptions fit = quiet_fit(1);
  CHECK_THROWS_WITH(model.fit(data, fit), Catch::Contains("fit: the ranks' passes over their data differ") &&
                                              Catch::Contains("steps an epoch"));
  tnt::EvaluateOptions ev;
  ev.batch_size = 16;
  CHECK_THROWS_WITH(model.evaluate(data, ev), Catch::Contains("evaluate: the ranks' passes over their data differ") &&
                                                  Catch::Contains("64 samples") && Catch::Contains("32 samples"));
  tnt::PredictOptions pr;
  pr.batch_size = 16;
  const tnt::Dataset inputs = data.map([](tnt::Element e) { return tnt::Element{e.front()}; });
  CHECK_THROWS_WITH(model.predict(inputs, pr), Catch::Contains("predict: the ranks' passes over their data differ"));
  // The same data on every rank trains.
  CHECK(model.fit(make_data().take(32), fit).epochs.size() == 1);
}

TEST_CASE("fit and evaluate refuse data that give no step, naming the sizes") {
  // Before, fit returned an empty History and evaluate a loss of 0, as for a perfect model.
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit = quiet_fit(1);
  CHECK_THROWS_WITH(model.fit(make_data().take(0), fit),
                    Catch::Contains("fit: the training data give no step (0 samples, global batch 16)"));
  fit.remainder = tnt::Remainder::drop;
  CHECK_THROWS_WITH(model.fit(make_data().take(8), fit),
                    Catch::Contains("(8 samples, global batch 16, the last partial batch dropped)"));
  tnt::EvaluateOptions ev;
  ev.batch_size = 16;
  CHECK_THROWS_WITH(model.evaluate(make_data().take(0), ev), Catch::Contains("evaluate: the dataset is empty"));
}

TEST_CASE("a batch larger than the data is one batch of all of it, as in Keras") {
  // Before, the one partial batch was padded with copies up to the batch size: a batch of
  // 10^6 on 64 samples computed 10^6 rows. Now fit, its validation, evaluate and predict take
  // the data's size; the results are those of a batch of exactly that size, bit for bit.
  class Sizes : public tnt::Callback {
   public:
    Sizes() : tnt::Callback(Ranks::all) {}
    void on_train_begin(const tnt::Logs&) override { train = params_.batch_size; }
    void on_test_begin(const tnt::Logs&) override { validation = eval_params_.batch_size; }
    int64_t train = 0, validation = 0;
  };
  auto run = [](int64_t batch) {
    auto net = make_net();
    tnt::Model model(net, 3);
    model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
    auto sizes = std::make_shared<Sizes>();
    tnt::FitOptions fit = quiet_fit(2);
    fit.batch_size = batch;
    fit.validation_data = make_data().take(40);
    fit.callbacks = {sizes};
    model.fit(make_data(), fit);
    tnt::EvaluateOptions ev;
    ev.batch_size = batch;
    const double loss = model.evaluate(make_data(), ev).at("loss");
    tnt::PredictOptions pr;
    pr.batch_size = batch;
    const tnt::Tensor predictions =
        model.predict(make_data().map([](tnt::Element e) { return tnt::Element{e.front()}; }), pr);
    return std::make_tuple(sizes->train, sizes->validation, tnt::test::weights_of(*net), loss,
                           predictions.to_double_vector());
  };
  const auto [train, validation, weights, loss, predictions] = run(1'000'000);
  CHECK(train == 64);
  CHECK(validation == 40);
  const auto [train64, validation64, weights64, loss64, predictions64] = run(64);
  CHECK(validation64 == 40);  // the validation batch defaults to the training batch, and is cut too
  CHECK(weights == weights64);
  CHECK(loss == loss64);
  CHECK(predictions == predictions64);
}

TEST_CASE("a batch larger than data smaller than the ranks: the warning says one sample a rank") {
  // On 2 ranks, 1 sample: one batch of it, the second rank's slot a padding copy of weight 0.
  // Before: "each pass is one batch of 2", as if there were 2 samples.
  std::string text;
  int64_t batch = 0;
  text = tnt::test::captured_stderr([&] { batch = tnt::detail::batch_within_data("fit", "batch_size", 5, 1, true); });
  CHECK(batch == tnt::size());
  if (tnt::is_master_rank() && tnt::size() == 2) {
    CHECK_THAT(text, Catch::Contains("is larger than the data's 1 sample; each pass is one batch of them (as Keras "
                                     "does), one a rank over the 2 ranks (the 1 without one pad with a copy of "
                                     "weight 0)"));
  }
  text = tnt::test::captured_stderr([&] { batch = tnt::detail::batch_within_data("fit", "batch_size", 5, 3, true); });
  CHECK(batch == 3);
  if (tnt::is_master_rank()) CHECK_THAT(text, Catch::Contains("each pass is one batch of 3 (as Keras does)"));
}

TEST_CASE("samples batched already are refused with what to do") {
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit = quiet_fit(1);
  // A Keras habit: the dataset batched before fit, which batches it again.
  CHECK_THROWS_WITH(model.fit(make_data().batch(4), fit),
                    Catch::Contains("as if its samples were batched already") &&
                        Catch::Contains("give them unbatched samples"));
}

TEST_CASE("ModelCheckpoint fills Keras' fields and refuses a bad pattern or directory before the first epoch") {
  const std::string dir = job_dir();
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  // What a fit refuses, before it trains a step (global_step stays 0).
  auto refused = [&](const std::string& path) {
    tnt::FitOptions fit = quiet_fit(2);
    fit.callbacks = {std::make_shared<tnt::ModelCheckpoint>(path, "loss")};
    try {
      model.fit(make_data(), fit);
    } catch (const tnt::InputError& e) {
      CHECK(model.global_step() == 0);
      return std::string(e.what());
    }
    return std::string("(trained)");
  };
  // Before: a file named literally 'ck_{epoch:02d}_{val_los:.2f}.safetensors'.
  CHECK_THAT(refused(dir + "/ck_{epoch:02d}_{val_los:.2f}.safetensors"),
             Catch::Contains("{val_los} is neither {epoch} nor a value this fit logs") &&
                 Catch::Contains("val_accuracy"));
  CHECK_THAT(refused(dir + "/ck_{epoch:.2f}.safetensors"), Catch::Contains("the format '.2f' of {epoch} does not fit"));
  CHECK_THAT(refused(dir + "/ck_{epoch.safetensors"), Catch::Contains("a '{' without its '}'"));
  // Before: found after the first epoch's training.
  CHECK_THAT(refused(dir + "/no/such/dir/ck.safetensors"),
             Catch::Contains("cannot write checkpoints into '" + dir + "/no/such/dir'") &&
                 Catch::Contains("No such file or directory"));

  tnt::FitOptions fit = quiet_fit(2);
  fit.validation_data = make_data();
  auto ck = std::make_shared<tnt::ModelCheckpoint>(dir + "/ck_{epoch:03d}_{loss:.3f}_{val_accuracy:.2f}_{{x}}.safetensors",
                                                   "loss");
  fit.callbacks = {ck};
  const tnt::History h = model.fit(make_data(), fit);
  const std::string want = fmt::format("{}/ck_002_{:.3f}_{:.2f}_{{x}}.safetensors", dir, h.history.at("loss").back(),
                                       h.history.at("val_accuracy").back());
  CHECK(ck->last_path() == want);
  CHECK(std::filesystem::exists(want));
  // Plain {epoch}: two digits, as before.
  CHECK(tnt::ModelCheckpoint(dir + "/e{epoch}.safetensors").path_for(2, {}) == dir + "/e03.safetensors");
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}

TEST_CASE("compile refuses metric names that shadow the logs' keys and networks of several outputs") {
  class Named : public tnt::Accuracy {
   public:
    explicit Named(std::string n) : n_(std::move(n)) {}
    std::string name() const override { return n_; }

   private:
    std::string n_;
  };
  auto sgd = std::make_shared<tnt::SGD>(0.1);
  auto loss = std::make_shared<tnt::SoftmaxCrossEntropy>();
  tnt::Model model(make_net(), 3);
  // Before: a metric named "loss" replaced the logged loss (1000 where the loss was 0.6).
  CHECK_THROWS_WITH(model.compile(sgd, loss, {std::make_shared<Named>("loss")}),
                    Catch::Contains("a metric is named 'loss', a key the training logs use themselves"));
  CHECK_THROWS_WITH(model.compile(sgd, loss, {std::make_shared<Named>("val_x")}), Catch::Contains("'val_x'"));
  CHECK_THROWS_WITH(model.compile(sgd, loss, {std::make_shared<tnt::Accuracy>(), std::make_shared<tnt::Accuracy>()}),
                    Catch::Contains("two metrics are named 'accuracy'"));
  CHECK_NOTHROW(model.compile(sgd, loss, {std::make_shared<tnt::Accuracy>(), std::make_shared<Named>("acc2")}));

  // Two outputs: before, fit failed in backward ("has 2 outputs, backward() got 1 gradients").
  tnt::SymTensor x = tnt::Input({4}, tnt::DType::f32, "x");
  tnt::SymTensor a = tnt::call(std::make_shared<tnt::Dense>(2, "a"), x);
  tnt::SymTensor b = tnt::call(std::make_shared<tnt::Dense>(2, "b"), x);
  auto two = std::make_shared<tnt::Network>(std::vector<tnt::SymTensor>{x}, std::vector<tnt::SymTensor>{a, b}, "two");
  tnt::Model m2(two, 3);
  CHECK_THROWS_WITH(m2.compile(sgd, loss), Catch::Contains("network 'two' has 2 outputs, but a Model trains one output"));
}

TEST_CASE("Sequential and Dense mistakes are input errors that say what to do") {
  auto net = std::make_shared<tnt::Sequential>("seq");
  net->add(std::make_shared<tnt::Dense>(2, "fc"));
  net->build({4});
  CHECK_THROWS_AS(net->add(std::make_shared<tnt::Dense>(2, "late")), tnt::InputError);
  CHECK_THROWS_WITH(net->add(std::make_shared<tnt::Dense>(2, "late")), Catch::Contains("add every layer before build()"));
  CHECK_THROWS_AS(net->build({4}), tnt::InputError);
  // A sample of shape () has no feature dimension for a Dense.
  auto scalar = std::make_shared<tnt::Sequential>("scalar");
  scalar->add(std::make_shared<tnt::Dense>(1, "fc"));
  scalar->build({});
  tnt::RunContext rc;
  CHECK_THROWS_WITH(scalar->forward({tnt::Tensor::zeros({4})}, rc),
                    Catch::Contains("has no feature dimension") && Catch::Contains("(1,), not ()"));
}

TEST_CASE("softmax cross-entropy trains on sequences: the mean per label not ignored, on every rank count") {
  // Dense(3) over (B, T=4, F=2) inputs gives (B, 4, 3) logits; labels (B, 4), some ignored.
  // Before: fit stopped at step 1 (the gradient came back (B*4, 3)), and the loss was divided
  // by the samples, T times the per-token mean.
  const int64_t n = 12, t = 4, f = 2;
  std::vector<float> xs(static_cast<size_t>(n * t * f));
  std::vector<int64_t> ys(static_cast<size_t>(n * t));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 7) % 5) / 5.0f - 0.4f;
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = i % 5 == 4 ? -100 : static_cast<int64_t>(i % 3);
  const tnt::Tensor x = tnt::Tensor::from_vector(xs, {n, t, f});
  const tnt::Tensor y = tnt::Tensor::from_data(ys.data(), {n, t});
  auto net = std::make_shared<tnt::Sequential>("seq");
  net->add(std::make_shared<tnt::Dense>(3, "fc"));
  net->build({t, f});
  tnt::Model model(net, 3);
  auto loss = std::make_shared<tnt::SoftmaxCrossEntropy>();
  model.compile(std::make_shared<tnt::SGD>(0.0), loss);  // lr 0: the weights stay, the loss is comparable
  // The reference: the loss over all the data in one direct call (its own count of labels).
  tnt::RunContext rc;
  tnt::SavedState s;
  const double want = loss->forward(net->forward({x}, rc).at(0), y, 0, s).to_vector()[0];
  tnt::FitOptions fit;
  fit.batch_size = 6;  // 2 steps; 3 or 6 samples a rank
  fit.epochs = 1;
  fit.verbose = 0;
  const tnt::History h = model.fit(tnt::Dataset::from_tensors({x, y}), fit);
  // The epoch's loss: the steps' sums over all their labels not ignored (4 in the first
  // step, 5 in the second), so the whole's mean, on any number of ranks.
  CHECK(h.history.at("loss").at(0) == Approx(want).epsilon(1e-5));
  tnt::EvaluateOptions ev;
  ev.batch_size = 6;
  ev.verbose = 0;
  CHECK(model.evaluate(tnt::Dataset::from_tensors({x, y}), ev).at("loss") == Approx(want).epsilon(1e-5));
  // And it learns: a positive rate lowers the loss.
  model.set_learning_rate(0.5);
  fit.epochs = 5;
  const tnt::History h2 = model.fit(tnt::Dataset::from_tensors({x, y}), fit);
  CHECK(h2.history.at("loss").back() < want);
}
