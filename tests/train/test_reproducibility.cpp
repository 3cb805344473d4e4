// Claims of docs/reproducibility.md that the other training tests leave out, on 1-3 CPU
// ranks (3 does not divide the global batch of 16): with Dropout in the network and a
// dataset that reshuffles every epoch, two runs with one seed end bitwise equal, and a run
// resumed from a checkpoint ends with the uninterrupted run's weights bitwise. Both rest on
// every random draw being a function of (seed, name, step or epoch, global index): the
// masks are keyed on the global step, which the checkpoint restores, and the order on
// (shuffle seed, epoch), which fit's initial_epoch restores.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"
#include "temp_dir.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

namespace {

using tnt::test::weights_of;
using Weights = std::vector<std::vector<double>>;

constexpr int64_t kBatch = 16;          // threshold_data's 64 samples: 4 steps an epoch
constexpr uint64_t kShuffleSeed = 31;   // the dataset's, apart from the model's
constexpr int kEpochs = 3;

// fc1, ReLU, Dropout (rate 0.3), fc2: dropout changes every step's gradient.
std::shared_ptr<tnt::Sequential> make_net() {
  auto net = std::make_shared<tnt::Sequential>("repro_mlp");
  net->add(std::make_shared<tnt::Dense>(16, "fc1"));
  net->add(std::make_shared<tnt::ReLU>("relu"));
  net->add(std::make_shared<tnt::Dropout>(0.3, "drop"));
  net->add(std::make_shared<tnt::Dense>(2, "fc2"));
  net->build({4});
  return net;
}

std::unique_ptr<tnt::Model> make_model(const std::shared_ptr<tnt::Sequential>& net, uint64_t seed) {
  auto model = std::make_unique<tnt::Model>(net, seed);
  model->compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  return model;
}

tnt::Dataset data() { return tnt::test::threshold_data("reproducibility").shuffle(64, kShuffleSeed); }

tnt::FitOptions fit_options(int initial_epoch, int epochs) {
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.initial_epoch = initial_epoch;
  fit.epochs = epochs;
  fit.verbose = 0;
  return fit;
}

Weights train(uint64_t seed) {
  auto net = make_net();
  make_model(net, seed)->fit(data(), fit_options(0, kEpochs));
  return weights_of(*net);
}

double max_abs_diff(const Weights& a, const Weights& b) {
  double d = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) d = std::max(d, std::fabs(a[t][i] - b[t][i]));
  return d;
}

}  // namespace

TEST_CASE("with Dropout and a reshuffling dataset, two runs with one seed are bitwise equal") {
  const Weights a = train(5);
  const Weights b = train(5);
  REQUIRE(a == b);
  // The seed is used: another one (other initial weights and masks) ends elsewhere.
  REQUIRE(max_abs_diff(a, train(6)) > 1e-3);
}

TEST_CASE("with Dropout and a reshuffling dataset, a resumed run ends bitwise where the uninterrupted one does") {
  tnt::test::TempDir dir("tnt_reproducibility");
  // One directory for the job: the master's name, shared (all ranks run on this host).
  std::string path = dir.path.string() + "/ck.safetensors";
  tnt::communicator().broadcast(path, tnt::master_rank());

  const Weights uninterrupted = train(5);

  auto first_net = make_net();
  auto first = make_model(first_net, 5);
  first->fit(data(), fit_options(0, 1));
  first->save_checkpoint(path, 1);

  auto resume = [&](uint64_t seed) {
    auto net = make_net();
    auto model = make_model(net, seed);
    const int epoch = model->load_checkpoint(path);
    REQUIRE(epoch == 1);
    model->fit(data(), fit_options(epoch, kEpochs));
    return weights_of(*net);
  };
  REQUIRE(resume(5) == uninterrupted);
  // The masks matter after the resume: the same checkpoint continued under another model
  // seed (its weights, optimizer state, step and data order, other masks) ends elsewhere.
  REQUIRE(max_abs_diff(resume(6), uninterrupted) > 1e-4);
  tnt::communicator().barrier();  // every rank has read the file before TempDir removes it
}

TEST_CASE("a run cut inside an epoch by max_steps resumes at its next step and ends bitwise where the uninterrupted "
          "one does") {
  tnt::test::TempDir dir("tnt_reproducibility");
  std::string path = dir.path.string() + "/ck.safetensors";
  tnt::communicator().broadcast(path, tnt::master_rank());
  const Weights uninterrupted = train(5);

  // 4 steps an epoch: step 6 is the second of epoch 2.
  auto first_net = make_net();
  auto first = make_model(first_net, 5);
  tnt::FitOptions cut = fit_options(0, kEpochs);
  cut.max_steps = 6;
  cut.callbacks = {std::make_shared<tnt::ModelCheckpoint>(path, "loss")};
  first->fit(data(), cut);
  REQUIRE(first->partial_epoch_steps() == 2);

  auto resume = [&](bool at_its_step) {
    auto net = make_net();
    auto model = make_model(net, 5);
    const int epoch = model->load_checkpoint_from_master(path);
    REQUIRE(epoch == 1);  // epoch 2 is unfinished
    REQUIRE(model->checkpoint_epoch_step() == 2);
    REQUIRE(model->global_step() == 6);
    tnt::FitOptions rest = fit_options(epoch, kEpochs);
    if (at_its_step) rest.initial_step = model->checkpoint_epoch_step();
    model->fit(data(), rest);
    REQUIRE(model->partial_epoch_steps() == 0);
    return weights_of(*net);
  };
  REQUIRE(resume(true) == uninterrupted);
  // The step matters: epoch 2 from its start (what a checkpoint that counted it done, or one
  // without its step, gave) trains other batches and ends elsewhere.
  REQUIRE(max_abs_diff(resume(false), uninterrupted) > 1e-4);

  // The checkpoint's steps are of its global batch (16): with another they would skip other
  // samples (before, a batch of 8 skipped 2 x 8 and trained 16 of the epoch's samples
  // twice), so another batch is refused on every rank, naming both.
  {
    auto net = make_net();
    auto model = make_model(net, 5);
    const int epoch = model->load_checkpoint_from_master(path);
    REQUIRE(model->checkpoint_epoch_batch() == kBatch);
    tnt::FitOptions other = fit_options(epoch, kEpochs);
    other.batch_size = kBatch / 2;
    other.initial_step = model->checkpoint_epoch_step();
    REQUIRE_THROWS_WITH(model->fit(data(), other),
                        Catch::Contains("fit: initial_step=2 is the checkpoint's position, 2 steps of a global batch "
                                        "of 16 into its epoch, but this fit's global batch is 8: resume with the "
                                        "checkpoint's global batch of 16 samples"));
    REQUIRE(model->global_step() == 6);  // nothing trained
    // The ranks' own micro-batches (distribute_dataset=false): the global batch is known at
    // the first step, 5 a rank here (5, 10 or 15 in all, never 16), and checked there.
    tnt::FitOptions own = fit_options(epoch, kEpochs);
    own.batch_size = 0;
    own.distribute_dataset = false;
    own.initial_step = model->checkpoint_epoch_step();
    const tnt::Dataset mine = data().shard(tnt::size(), tnt::rank()).batch(5);
    REQUIRE_THROWS_WITH(model->fit(mine, own),
                        Catch::Contains("fit: initial_step=2 is the checkpoint's position, 2 steps of a global batch "
                                        "of 16 into its epoch, but this fit's global batch is " +
                                        std::to_string(5 * tnt::size())));
    REQUIRE(model->global_step() == 6);
  }

  // A step that is not one of the epoch's is refused on every rank.
  auto net = make_net();
  auto model = make_model(net, 5);
  tnt::FitOptions bad = fit_options(0, 1);
  bad.initial_step = 4;
  REQUIRE_THROWS_WITH(model->fit(data(), bad),
                      Catch::Contains("fit: initial_step=4 is not a step of initial_epoch=0 (epoch 1 of the logs; 4 "
                                      "steps an epoch)"));
  tnt::communicator().barrier();
}

namespace {
// Rank 0 alone asks for a stop, as a signal reaching one rank first would.
class StopOnRankZero : public tnt::Callback {
 public:
  explicit StopOnRankZero(int64_t at_step) : tnt::Callback(Ranks::all), at_step_(at_step) {}
  void on_train_batch_end(int64_t, const tnt::Logs&) override {
    if (tnt::rank() == 0 && model_->global_step() == at_step_) tnt::request_stop_after_step();
  }

 private:
  int64_t at_step_;
};
}  // namespace

TEST_CASE("a stop requested on one rank ends every rank after the same step, and the run resumes there bitwise") {
  tnt::test::TempDir dir("tnt_reproducibility");
  std::string path = dir.path.string() + "/ck.safetensors";
  tnt::communicator().broadcast(path, tnt::master_rank());
  const Weights uninterrupted = train(5);

  auto net = make_net();
  auto model = make_model(net, 5);
  tnt::FitOptions cut = fit_options(0, kEpochs);
  // Asked after step 5 on rank 0: it travels with step 6's metrics, so every rank stops after
  // step 6, the second of epoch 2.
  cut.callbacks = {std::make_shared<StopOnRankZero>(5), std::make_shared<tnt::ModelCheckpoint>(path, "loss")};
  model->fit(data(), cut);
  CHECK(model->stopped_on_request());
  CHECK_FALSE(tnt::stop_after_step_requested());  // honoured, so cleared
  const std::vector<int64_t> steps = tnt::communicator().allgather(model->global_step());
  CHECK(std::all_of(steps.begin(), steps.end(), [](int64_t s) { return s == 6; }));
  CHECK(model->partial_epoch_steps() == 2);

  auto resumed_net = make_net();
  auto resumed = make_model(resumed_net, 5);
  const int epoch = resumed->load_checkpoint_from_master(path);
  REQUIRE(epoch == 1);
  tnt::FitOptions rest = fit_options(epoch, kEpochs);
  rest.initial_step = resumed->checkpoint_epoch_step();
  resumed->fit(data(), rest);
  CHECK_FALSE(resumed->stopped_on_request());
  CHECK(weights_of(*resumed_net) == uninterrupted);
  tnt::communicator().barrier();
}

TEST_CASE("a stop on request at an epoch's last step leaves its validation to the resume, and a resumed epoch logs "
          "all of its steps") {
  tnt::test::TempDir dir("tnt_reproducibility");
  std::string path = dir.path.string() + "/ck.safetensors";
  tnt::communicator().broadcast(path, tnt::master_rank());
  auto with_validation = [](int initial_epoch) {
    tnt::FitOptions fit = fit_options(initial_epoch, kEpochs);
    fit.validation_data = tnt::test::threshold_data("validation");
    return fit;
  };
  auto straight_net = make_net();
  const tnt::History straight = make_model(straight_net, 5)->fit(data(), with_validation(0));
  REQUIRE(straight.history.at("val_loss").size() == kEpochs);

  // Stops after step `stop_after` (asked one step before on rank 0), then resumes there; the
  // history of the resumed fit.
  auto stopped_and_resumed = [&](int64_t stop_after, int64_t expect_partial) {
    auto net = make_net();
    auto model = make_model(net, 5);
    tnt::FitOptions cut = with_validation(0);
    cut.callbacks = {std::make_shared<StopOnRankZero>(stop_after - 1), std::make_shared<tnt::ModelCheckpoint>(path, "loss")};
    const tnt::History first = model->fit(data(), cut);
    REQUIRE(model->stopped_on_request());
    // The epoch is unfinished, also when all its steps ran: its validation did not.
    REQUIRE(model->partial_epoch_steps() == expect_partial);
    // The stopped epoch's row has no validation (the epochs before it have theirs).
    CHECK(first.history.count("val_loss") == (first.epochs.size() > 1 ? 1u : 0u));
    if (first.epochs.size() > 1) CHECK(first.history.at("val_loss").size() == first.epochs.size() - 1);
    auto resumed_net = make_net();
    auto resumed = make_model(resumed_net, 5);
    const int epoch = resumed->load_checkpoint_from_master(path);
    REQUIRE(resumed->checkpoint_epoch_step() == expect_partial);
    tnt::FitOptions rest = with_validation(epoch);
    rest.initial_step = resumed->checkpoint_epoch_step();
    const tnt::History h = resumed->fit(data(), rest);
    CHECK(weights_of(*resumed_net) == weights_of(*straight_net));
    return h;
  };
  // After step 4, the last of epoch 1 (4 steps an epoch): the resume trains nothing of it,
  // validates it and logs its row; its training sums come from the checkpoint alone, so the
  // row equals the straight run's bitwise.
  const tnt::History at_end = stopped_and_resumed(4, 4);
  REQUIRE(at_end.epochs == std::vector<int>{0, 1, 2});
  for (const char* key : {"loss", "val_loss"}) {
    REQUIRE(at_end.history.at(key).size() == kEpochs);
    CHECK(at_end.history.at(key) == straight.history.at(key));
  }
  // A checkpoint at the epoch's end of steps without its sums (an fp16 run's infinite sum is
  // left out): the resume still validates the epoch (its training columns then cover no step).
  {
    auto net = make_net();
    auto model = make_model(net, 5);
    tnt::FitOptions cut = with_validation(0);
    cut.callbacks = {std::make_shared<StopOnRankZero>(3), std::make_shared<tnt::ModelCheckpoint>(path, "loss")};
    model->fit(data(), cut);
    REQUIRE(model->partial_epoch_steps() == 4);
    tnt::communicator().barrier();
    if (tnt::is_master_rank()) {
      tnt::Checkpoint ck = tnt::Checkpoint::read(path);
      REQUIRE(ck.has_metadata("epoch_sums"));
      ck.erase_metadata("epoch_sums");
      ck.write(path);
    }
    tnt::communicator().barrier();
    auto resumed = make_model(make_net(), 5);
    const int epoch = resumed->load_checkpoint_from_master(path);
    tnt::FitOptions rest = with_validation(epoch);
    rest.initial_step = resumed->checkpoint_epoch_step();
    rest.epochs = 1;
    const tnt::History h = resumed->fit(data(), rest);
    REQUIRE(h.epochs == std::vector<int>{0});
    CHECK(h.history.at("val_loss").at(0) == straight.history.at("val_loss").at(0));
  }
  // After step 6, inside epoch 2: the resumed row covers the epoch's 4 steps (before: its last
  // 2), the same sums added in another order: within a few units of the last place of a
  // double (1e-12 relative).
  const tnt::History inside = stopped_and_resumed(6, 2);
  REQUIRE(inside.epochs == std::vector<int>{1, 2});
  for (const char* key : {"loss", "val_loss"}) {
    for (size_t i = 0; i < 2; ++i) {
      const double want = straight.history.at(key)[i + 1];
      CHECK(std::fabs(inside.history.at(key)[i] - want) <= 1e-12 * std::fabs(want));
    }
  }
  tnt::communicator().barrier();
}

namespace {
// Each step 60 ms longer: a known lower bound for an epoch's seconds.
class SlowSteps : public tnt::Callback {
 public:
  SlowSteps() : tnt::Callback(Ranks::all) {}
  void on_train_batch_end(int64_t, const tnt::Logs&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
  }
};
}  // namespace

TEST_CASE("an epoch resumed inside logs the seconds of its steps before the stop too") {
  tnt::test::TempDir dir("tnt_reproducibility");
  std::string path = dir.path.string() + "/ck.safetensors";
  tnt::communicator().broadcast(path, tnt::master_rank());
  auto model = make_model(make_net(), 5);
  tnt::FitOptions cut = fit_options(0, kEpochs);
  // Every rank stops after step 6, the second of epoch 2 (as above), both of its steps slowed.
  const std::string csv = dir.path.string() + "/history.csv";
  cut.callbacks = {std::make_shared<SlowSteps>(), std::make_shared<StopOnRankZero>(5),
                   std::make_shared<tnt::ModelCheckpoint>(path, "loss"), std::make_shared<tnt::CSVLogger>(csv)};
  model->fit(data(), cut);
  REQUIRE(model->partial_epoch_steps() == 2);
  tnt::communicator().barrier();
  // The cut epoch has no row until the resume writes it for all its steps (before, a row of
  // its first 2 steps read as a finished epoch 2).
  auto rows = [&] {
    std::ifstream in(csv);
    std::string line, firsts;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) firsts += line.substr(0, line.find(',')) + " ";
    return firsts;
  };
  if (tnt::is_master_rank()) CHECK(rows() == "1 ");
  double carried = 0;
  if (tnt::is_master_rank()) {
    const tnt::Checkpoint ck = tnt::Checkpoint::read(path);
    REQUIRE(ck.has_metadata("epoch_seconds"));
    carried = std::stod(ck.metadata("epoch_seconds"));
  }
  tnt::communicator().broadcast(&carried, 1, tnt::DType::f64, tnt::Device::cpu(), tnt::master_rank());
  CHECK(carried >= 0.12);  // the two sleeps alone
  auto resumed = make_model(make_net(), 5);
  const int epoch = resumed->load_checkpoint_from_master(path);
  tnt::FitOptions rest = fit_options(epoch, epoch + 1);
  rest.initial_step = resumed->checkpoint_epoch_step();
  rest.callbacks = {std::make_shared<tnt::CSVLogger>(csv, /*append=*/true)};
  const tnt::History h = resumed->fit(data(), rest);  // its 2 steps unslowed: a few ms
  REQUIRE(h.epochs == std::vector<int>{1});
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) CHECK(rows() == "1 2 ");
  // Before, the row's time was the resumed steps' alone, its loss all 4 steps'.
  CHECK(h.history.at("seconds").at(0) >= carried);
  tnt::communicator().barrier();
}

TEST_CASE("a second Model on a trained network says that it draws the weights again") {
  tnt::test::TempDir dir("tnt_reproducibility");
  auto net = make_net();
  make_model(net, 5)->fit(data(), fit_options(0, 1));
  // The master's standard error into a file while the second Model is made.
  const std::string path = dir.path.string() + "/stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  REQUIRE(saved >= 0);
  std::FILE* file = std::fopen(path.c_str(), "w+");
  REQUIRE(file != nullptr);
  REQUIRE(::dup2(::fileno(file), 2) == 2);
  auto second = make_model(net, 6);
  std::fflush(stderr);
  REQUIRE(::dup2(saved, 2) == 2);
  ::close(saved);
  std::fclose(file);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (tnt::is_master_rank()) {
    CHECK_THAT(text, Catch::Contains("network 'repro_mlp' was trained by another Model; this one draws its weights "
                                     "again (seed 6)"));
  } else {
    CHECK(text.empty());
  }
  // A fresh network says nothing.
  CHECK_FALSE(make_net()->trained());
}
