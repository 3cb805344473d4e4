// The TensorBoard callback inside fit on 2 ranks: one event file per split, written by the
// master alone, read back by tests/train/read_tfevents.py (code independent of ours, CRCs
// checked): epoch scalars at steps 0 and 1, batch scalars every update_freq steps, the
// profile_batch timeline in train/plugins/profile/<run>/timeline.trace.json (counted from the
// callback's first step, written as soon as its window closes, once over several fit()
// calls, nothing left for a window never reached, and a timeline already recording wins);
// a log_dir that cannot be made fails on every rank; a resumed run removes the earlier
// files' points of the epochs it redoes.
#include "job_dir.hpp"
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"
#include "tarantella/timeline.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string job_dir() { return tnt::test::job_dir("tnt_tensorboard"); }

// step -> tag -> value, from read_tfevents.py's JSON lines.
std::map<int64_t, std::map<std::string, double>> read_events(const fs::path& file) {
  const std::string cmd = std::string("python3 ") + TNT_READ_TFEVENTS + " '" + file.string() + "'";
  std::FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  REQUIRE(pclose(p) == 0);
  std::map<int64_t, std::map<std::string, double>> events;
  std::istringstream lines(out);
  bool first = true;
  for (std::string line; std::getline(lines, line);) {
    json e = json::parse(line);
    if (first) {
      CHECK(e["file_version"] == "brain.Event:2");
      first = false;
      continue;
    }
    for (auto& [tag, value] : e["values"].items()) events[e["step"].get<int64_t>()][tag] = value.get<double>();
  }
  return events;
}

// The steps of a trace's complete events ("ph": "X").
std::set<int64_t> trace_steps(const fs::path& file) {
  std::ifstream in(file);
  REQUIRE(in.good());
  json trace = json::parse(in);
  std::set<int64_t> steps;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") steps.insert(e["args"]["step"].get<int64_t>());
  }
  return steps;
}

// Every file under dir/train/plugins/profile (none when it does not exist).
std::vector<fs::path> profile_files(const fs::path& dir) {
  std::vector<fs::path> out;
  const fs::path root = dir / "train" / "plugins" / "profile";
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) out.push_back(e.path());
  }
  return out;
}

tnt::Model small_model() {
  return tnt::Model(tnt::test::small_mlp(), 5);
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  }
  return out;
}

}  // namespace

TEST_CASE("TensorBoard: epoch and batch scalars, master only, profile_batch timeline") {
  const std::string dir = job_dir();
  tnt::Model model(tnt::test::small_mlp(), 5);
  model.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  auto tb = std::make_shared<tnt::TensorBoard>(dir, /*update_freq=*/2, /*profile_batch=*/"2,3");
  tnt::FitOptions fit;
  fit.batch_size = 16;  // 64 samples: 4 steps an epoch
  fit.epochs = 2;
  fit.verbose = 0;
  fit.validation_data = tnt::test::threshold_data("tb-val");
  fit.callbacks = {tb};
  tnt::History history = model.fit(tnt::test::threshold_data("tb"), fit);
  CHECK(tb->train_file().empty() == !tnt::is_master_rank());
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) {
    const auto train_files = event_files(fs::path(dir) / "train");
    const auto val_files = event_files(fs::path(dir) / "validation");
    REQUIRE(train_files.size() == 1);  // one writer: the master's
    REQUIRE(val_files.size() == 1);
    CHECK(train_files[0].string() == tb->train_file());
    auto train = read_events(train_files[0]);
    auto val = read_events(val_files[0]);
    // Epochs at steps 0 and 1 and batches at global steps 2, 4, 6, 8 share the train file;
    // steps 0 and 1 never collide with a batch step (update_freq 2 starts at 2).
    for (int epoch = 0; epoch < 2; ++epoch) {
      INFO("epoch " << epoch);
      // float32 in the file against the double of History: relative 1e-6 (float's 2^-24).
      for (const char* name : {"loss", "accuracy", "learning_rate"}) {
        const double want = history.history.at(name)[static_cast<size_t>(epoch)];
        CHECK(train[epoch].at(std::string("epoch_") + name) == Approx(want).epsilon(1e-6));
      }
      for (const char* name : {"loss", "accuracy"}) {
        const double want = history.history.at(std::string("val_") + name)[static_cast<size_t>(epoch)];
        CHECK(val[epoch].at(std::string("epoch_") + name) == Approx(want).epsilon(1e-6));
      }
      CHECK(train[epoch].at("epoch_step_time_ms") > 0);
      CHECK(train[epoch].at("epoch_samples_per_second") > 0);
      CHECK(train[epoch].count("epoch_hidden_communication") == (tnt::size() > 1 ? 1u : 0u));
      CHECK(train[epoch].count("epoch_rank_lag_ms") == (tnt::size() > 1 ? 1u : 0u));
      if (tnt::size() > 1) CHECK(train[epoch].at("epoch_rank_lag_ms") >= 0);
    }
    for (int64_t step : {2, 4, 6, 8}) {
      INFO("step " << step);
      CHECK(train[step].count("batch_loss") == 1);
      CHECK(train[step].count("batch_accuracy") == 1);
    }
    CHECK(train.size() == 6);  // 2 epochs + 4 batch records, nothing else
    // profile_batch "2,3": the timeline of steps 2 and 3, alone in its run's directory.
    const std::vector<fs::path> profiles = profile_files(dir);
    REQUIRE(profiles.size() == 1);
    CHECK(profiles[0].string() == tb->profile_file());
    CHECK(profiles[0].filename() == "timeline.trace.json");
    CHECK(profiles[0].parent_path().parent_path() == fs::path(dir) / "train" / "plugins" / "profile");
    CHECK(trace_steps(profiles[0]) == std::set<int64_t>{2, 3});
    fs::remove_all(dir);
  }
}

// Checks, when the step after the profile's window begins, that its file is there already.
class ProfileWritten : public tnt::Callback {
 public:
  ProfileWritten(std::shared_ptr<tnt::TensorBoard> tb, int64_t after) : Callback(Ranks::all), tb_(tb), after_(after) {}
  void on_train_batch_end(int64_t, const tnt::Logs&) override {
    if (model_->global_step() != after_ + 1) return;
    seen = !tb_->profile_file().empty() && fs::exists(tb_->profile_file());
  }
  bool seen = false;

 private:
  std::shared_ptr<tnt::TensorBoard> tb_;
  int64_t after_;
};

TEST_CASE("TensorBoard: profile_batch counts from the callback's first step and is written when its window closes") {
  const std::string dir = job_dir();
  tnt::Model model = small_model();
  model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;  // 64 samples: 4 steps an epoch
  fit.epochs = 1;
  fit.verbose = 0;
  model.fit(tnt::test::threshold_data("tb"), fit);  // steps 1-4, without the callback
  REQUIRE(model.global_step() == 4);

  // Its step 2 is the run's step 6 (a resumed run profiles its own second step, as Keras).
  auto tb = std::make_shared<tnt::TensorBoard>(dir + "/a", 0, "2");
  auto written = std::make_shared<ProfileWritten>(tb, 6);
  fit.callbacks = {tb, written};
  fit.epochs = 2;
  fit.initial_epoch = 1;
  model.fit(tnt::test::threshold_data("tb"), fit);
  CHECK(written->seen);  // before training ended
  if (tnt::is_master_rank()) {
    const std::vector<fs::path> profiles = profile_files(dir + "/a");
    REQUIRE(profiles.size() == 1);
    CHECK(trace_steps(profiles[0]) == std::set<int64_t>{6});
  }

  // A window that training never reaches leaves no file and no empty directory.
  auto never = std::make_shared<tnt::TensorBoard>(dir + "/b", 0, "50");
  fit.callbacks = {never};
  fit.epochs = 3;
  fit.initial_epoch = 2;
  model.fit(tnt::test::threshold_data("tb"), fit);
  CHECK(never->profile_file().empty());
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) {
    CHECK(!fs::exists(fs::path(dir) / "b" / "train" / "plugins"));
    CHECK(fs::exists(fs::path(dir) / "b" / "train"));  // the event files are there
  }

  // Several fit() calls with one callback (the transformer's loop): the window "5" is the
  // fifth step the callback trains, in its second fit, recorded once.
  auto loop = std::make_shared<tnt::TensorBoard>(dir + "/c", 0, "5");
  fit.callbacks = {loop};
  for (int epoch = 3; epoch < 6; ++epoch) {
    fit.initial_epoch = epoch;
    fit.epochs = epoch + 1;
    model.fit(tnt::test::threshold_data("tb"), fit);  // 4 steps each: 13-16, 17-20, 21-24
  }
  CHECK(!loop->profile_file().empty());
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) {
    const std::vector<fs::path> profiles = profile_files(dir + "/c");
    REQUIRE(profiles.size() == 1);
    CHECK(trace_steps(profiles[0]) == std::set<int64_t>{17});
    fs::remove_all(dir);
  }
}

TEST_CASE("TensorBoard: a timeline already recording (TNT_TIMELINE, start_timeline) wins over profile_batch") {
  const std::string dir = job_dir();
  tnt::Model model = small_model();
  model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  REQUIRE(tnt::start_timeline(dir + "/user.json", 1, 3));
  auto tb = std::make_shared<tnt::TensorBoard>(dir + "/tb", 0, "2");
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 1;
  fit.verbose = 0;
  fit.callbacks = {tb};
  model.fit(tnt::test::threshold_data("tb"), fit);
  tnt::stop_timeline();
  CHECK(tb->profile_file().empty());
  if (tnt::is_master_rank()) {
    CHECK(profile_files(dir + "/tb").empty());
    CHECK(trace_steps(dir + "/user.json") == std::set<int64_t>{1, 2, 3});
    fs::remove_all(dir);
  }
}

TEST_CASE("TensorBoard: a log_dir that cannot be made fails on every rank") {
  tnt::Model model(tnt::test::small_mlp(), 5);
  model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 1;
  fit.verbose = 0;
  fit.callbacks = {std::make_shared<tnt::TensorBoard>("/proc/tnt-no-such-dir/logs")};
  CHECK_THROWS_WITH(model.fit(tnt::test::threshold_data("tb"), fit), Catch::Contains("/proc/tnt-no-such-dir/logs"));
  CHECK_THROWS_AS(tnt::TensorBoard(""), tnt::InputError);
  CHECK_THROWS_AS(tnt::TensorBoard("x", -1), tnt::InputError);
  CHECK_THROWS_WITH(tnt::TensorBoard("x", 0, "3,2"), Catch::Contains("profile_batch '3,2'"));
  CHECK_THROWS_WITH(tnt::TensorBoard("x", 0, "two"), Catch::Contains("profile_batch 'two'"));
  CHECK_NOTHROW(tnt::TensorBoard("x", 0, "0"));
}

namespace {
// Rank 0 alone asks for a stop after global step `at`, as a signal reaching one rank would.
class StopAfter : public tnt::Callback {
 public:
  explicit StopAfter(int64_t at) : tnt::Callback(Ranks::all), at_(at) {}
  void on_train_batch_end(int64_t, const tnt::Logs&) override {
    if (tnt::rank() == 0 && model_->global_step() == at_) tnt::request_stop_after_step();
  }

 private:
  int64_t at_;
};
}  // namespace

TEST_CASE("TensorBoard: the ranks' own micro-batches give samples per second; an epoch stopped on request is "
          "left to its resume where a checkpoint was saved") {
  for (const bool checkpoint : {true, false}) {
    INFO("with a checkpoint: " << checkpoint);
    const std::string dir = job_dir();
    tnt::Model model(tnt::test::small_mlp(), 5);
    model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
    auto tb = std::make_shared<tnt::TensorBoard>(dir, /*update_freq=*/0);
    tnt::FitOptions fit;
    fit.epochs = 2;
    fit.verbose = 0;
    fit.distribute_dataset = false;  // 64 samples a rank in micro-batches of 8: 8 steps an epoch
    // A stop asked for after global step 11, in the second epoch (steps 9-16): that epoch is
    // unfinished (the stop is agreed with a step's metrics, one step later).
    fit.callbacks = {tb, std::make_shared<StopAfter>(11)};
    if (checkpoint) fit.callbacks.push_back(std::make_shared<tnt::ModelCheckpoint>(dir + "/ck.safetensors", "loss"));
    model.fit(tnt::test::threshold_data("tb-own").batch(8), fit);
    CHECK(model.stopped_on_request());
    CHECK(model.partial_epoch_steps() > 0);
    CHECK(model.partial_epoch_steps() < 8);
    CHECK((model.last_checkpoint_step() == model.global_step()) == checkpoint);
    tnt::communicator().barrier();
    if (tnt::is_master_rank()) {
      const auto files = event_files(fs::path(dir) / "train");
      REQUIRE(files.size() == 1);
      auto train = read_events(files[0]);
      // Before: no samples per second (the fit's batch_size is 0 with the ranks' own
      // batches). With a checkpoint of the unfinished epoch, its point is the resumed run's
      // (before: one here for part of its steps, and one from the resume for all of them);
      // without one, nothing resumes it, and the point is written here.
      REQUIRE(train.count(0) == 1);
      CHECK(train[0].at("epoch_samples_per_second") > 0);
      CHECK(train.count(1) == (checkpoint ? 0u : 1u));
      fs::remove_all(dir);
    }
    tnt::communicator().barrier();
  }
}

// A resumed run redoes the epochs after its checkpoint: the earlier run's points there (epoch
// points from initial_epoch on, batch points after the checkpoint's step) go from its files,
// so TensorBoard draws one point an epoch, as history.csv keeps one row. The same callback
// in a second fit() (a program that trains in pieces) removes nothing.
TEST_CASE("TensorBoard: a resumed run removes the points of the epochs it redoes from the earlier files") {
  const std::string dir = job_dir();
  const std::string ck = dir + "/ck.safetensors";
  tnt::FitOptions fit;
  fit.batch_size = 16;  // 64 samples: 4 steps an epoch
  fit.verbose = 0;
  fit.validation_data = tnt::test::threshold_data("tb-val");
  auto data = tnt::test::threshold_data("tb");
  // The run that "crashed": epoch 1 checkpointed, then epochs 2 and 3 with their points.
  auto first = std::make_shared<tnt::TensorBoard>(dir, /*update_freq=*/2);
  {
    tnt::Model model(tnt::test::small_mlp(), 5);
    model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
    fit.callbacks = {first};
    fit.epochs = 1;
    model.fit(data, fit);
    model.save_checkpoint(ck, 1);
    fit.initial_epoch = 1;
    fit.epochs = 3;
    model.fit(data, fit);  // the same callback goes on in its file: nothing removed
    CHECK(model.global_step() == 12);
  }
  tnt::communicator().barrier();
  // A crash mid-write leaves a record cut short at the end of the file: the prune keeps
  // what precedes it (before: the whole file was skipped, its points shown twice).
  if (tnt::is_master_rank()) {
    std::ofstream(first->train_file(), std::ios::binary | std::ios::app) << std::string("\x40\x00\x00", 3);
  }
  tnt::communicator().barrier();
  // The resume: from the checkpoint at epoch 1 (step 4), epoch 2 again.
  auto second = std::make_shared<tnt::TensorBoard>(dir, /*update_freq=*/2);
  {
    tnt::Model model(tnt::test::small_mlp(), 5);
    model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
    REQUIRE(model.load_checkpoint(ck) == 1);
    fit.callbacks = {second};
    fit.initial_epoch = 1;
    fit.epochs = 2;
    model.fit(data, fit);
  }
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) {
    const auto keys = [](const std::map<int64_t, std::map<std::string, double>>& events) {
      std::map<int64_t, std::set<std::string>> out;
      for (const auto& [step, values] : events) {
        for (const auto& [tag, v] : values) out[step].insert(tag.substr(0, tag.find('_')));
      }
      return out;
    };
    using Kinds = std::map<int64_t, std::set<std::string>>;
    // Train files: epoch points at steps 0, 1 (and batch points at global steps 2, 4, ...).
    CHECK(keys(read_events(first->train_file())) == Kinds{{0, {"epoch"}}, {2, {"batch"}}, {4, {"batch"}}});
    CHECK(keys(read_events(second->train_file())) == Kinds{{1, {"epoch"}}, {6, {"batch"}}, {8, {"batch"}}});
    CHECK(keys(read_events(first->validation_file())) == Kinds{{0, {"epoch"}}});
    CHECK(keys(read_events(second->validation_file())) == Kinds{{1, {"epoch"}}});
    CHECK(event_files(fs::path(dir) / "train").size() == 2);
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(fs::path(dir) / "train")) entries += e.is_regular_file() ? 1 : 0;
    CHECK(entries == 2);  // no temporary file left
    fs::remove_all(dir);
  }
  tnt::communicator().barrier();
}
