// Progress inside Model::fit and Model::evaluate on 1 and 2 ranks: FitOptions::max_steps
// ends training at the same step on every rank and the bar counts exactly the steps that
// run; every rank's callbacks see the evaluation hooks (with its steps, global batch and
// samples) once per validation pass; the announcement and the result lines come from the
// master alone.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

// The program's stdout (fd 1) goes to a file while the object lives; text() reads it.
class CapturedStdout {
 public:
  CapturedStdout() {
    char tmpl[] = "/tmp/tnt_progress_fit_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    path_ = tmpl;
    std::fflush(stdout);
    saved_ = ::dup(STDOUT_FILENO);
    REQUIRE(::dup2(fd, STDOUT_FILENO) == STDOUT_FILENO);
    ::close(fd);
  }
  ~CapturedStdout() {
    restore();
    std::remove(path_.c_str());
  }
  std::string text() {
    restore();
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stdout);
    ::dup2(saved_, STDOUT_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// Lines that start with `prefix`.
std::vector<std::string> starting(const std::vector<std::string>& lines, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& l : lines) {
    if (l.rfind(prefix, 0) == 0) out.push_back(l);
  }
  return out;
}

// Records the evaluation hooks on every rank.
class EvalRecorder : public tnt::Callback {
 public:
  EvalRecorder() : tnt::Callback(Ranks::all) {}
  void on_test_begin(const tnt::Logs&) override {
    ++begins;
    params.push_back(eval_params_);
    batches.push_back(0);
  }
  void on_test_batch_end(int64_t batch, const tnt::Logs& logs) override {
    CHECK(batch == batches.back());
    CHECK(logs.empty());
    ++batches.back();
  }
  void on_test_end(const tnt::Logs& logs) override {
    ++ends;
    results.push_back(logs);
  }
  int begins = 0, ends = 0;
  std::vector<tnt::EvalParams> params;
  std::vector<int64_t> batches;
  std::vector<tnt::Logs> results;
};

std::unique_ptr<tnt::Model> make_model() {
  auto model = std::make_unique<tnt::Model>(tnt::test::small_mlp(), 11);
  model->compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                 {std::make_shared<tnt::Accuracy>()});
  return model;
}

}  // namespace

TEST_CASE("max_steps ends training at that global step on every rank; the bar counts the steps that run") {
  ::setenv("TNT_STDOUT_IS_TTY", "0", 1);
  auto model = make_model();
  tnt::FitOptions fit;
  fit.batch_size = 16;  // 64 samples: 4 steps an epoch
  fit.epochs = 5;
  fit.max_steps = 6;
  fit.verbose = 2;
  std::string out;
  tnt::History history;
  {
    CapturedStdout capture;
    history = model->fit(tnt::test::threshold_data("progress"), fit);
    out = capture.text();
  }
  CHECK(model->global_step() == 6);
  CHECK(history.epochs == std::vector<int>{0, 1});
  std::vector<std::string> lines = lines_of(out);
  if (tnt::is_master_rank()) {
    // The epochs that run, not FitOptions::epochs: the step limit falls in the second.
    CHECK(starting(lines, "Epoch ") ==
          std::vector<std::string>{"Epoch 1/2", "Epoch 2/2 (2 of 4 steps: the run stops at step 6)"});
    REQUIRE(starting(lines, "4/4 - ").size() == 1);
    REQUIRE(starting(lines, "2/2 - ").size() == 1);  // not "2/4": the epoch that max_steps cuts
  } else {
    CHECK(out.empty());
  }

  // Resumed at the limit: nothing more runs. A higher limit: the steps left.
  {
    CapturedStdout capture;
    tnt::History again = model->fit(tnt::test::threshold_data("progress"), fit);
    CHECK(again.epochs.empty());
    CHECK(capture.text().empty());
  }
  CHECK(model->global_step() == 6);
  fit.initial_epoch = 1;
  fit.max_steps = 9;
  {
    CapturedStdout capture;
    tnt::History more = model->fit(tnt::test::threshold_data("progress"), fit);
    out = capture.text();
    CHECK(more.epochs == std::vector<int>{1});
  }
  CHECK(model->global_step() == 9);
  if (tnt::is_master_rank()) {
    CHECK(starting(lines_of(out), "3/3 - ").size() == 1);
    CHECK(starting(lines_of(out), "Epoch ") ==
          std::vector<std::string>{"Epoch 2/2 (3 of 4 steps: the run stops at step 9)"});
  }
}

TEST_CASE("an epoch resumed inside counts the steps it still runs toward max_steps") {
  ::setenv("TNT_STDOUT_IS_TTY", "0", 1);
  // 4 steps an epoch; resumed 1 step into the second epoch (FitOptions::initial_step).
  for (const auto& [max_steps, epochs] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           // the resumed epoch's 3 steps are all that is left: it runs to its end
           {3, {"Epoch 2/2"}},
           // one step more: a third epoch (before, "Epoch 2/2" then "Epoch 3/3")
           {4, {"Epoch 2/3", "Epoch 3/3 (1 of 4 steps: the run stops at step 4)"}},
           {2, {"Epoch 2/2 (3 of 4 steps: the run stops at step 2)"}}}) {
    INFO("max_steps " << max_steps);
    auto model = make_model();
    tnt::FitOptions fit;
    fit.batch_size = 16;
    fit.epochs = 5;
    fit.initial_epoch = 1;
    fit.initial_step = 1;
    fit.max_steps = max_steps;
    fit.verbose = 2;
    std::string out;
    {
      CapturedStdout capture;
      model->fit(tnt::test::threshold_data("progress"), fit);
      out = capture.text();
    }
    CHECK(model->global_step() == max_steps);
    if (tnt::is_master_rank()) CHECK(starting(lines_of(out), "Epoch ") == epochs);
  }
}

// A program that calls fit in pieces (the Transformer: fit to epoch 2, its own evaluation,
// fit from 2 to 4) counts its epochs over the whole run: 1/4 ... 4/4, not 1/2 then 3/4. A
// step limit far beyond the run's epochs leaves the count alone.
TEST_CASE("FitOptions::total_epochs: one epoch count over fit called in pieces") {
  ::setenv("TNT_STDOUT_IS_TTY", "0", 1);
  auto model = make_model();
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.verbose = 2;
  fit.total_epochs = 4;
  fit.max_steps = 1000;
  std::vector<std::string> epochs;
  for (int from = 0; from < 4; from += 2) {
    fit.initial_epoch = from;
    fit.epochs = from + 2;
    CapturedStdout capture;
    model->fit(tnt::test::threshold_data("progress"), fit);
    for (const std::string& l : starting(lines_of(capture.text()), "Epoch ")) epochs.push_back(l);
  }
  if (tnt::is_master_rank()) {
    CHECK(epochs == std::vector<std::string>{"Epoch 1/4", "Epoch 2/4", "Epoch 3/4", "Epoch 4/4"});
  }
  fit.initial_epoch = 4;
  fit.epochs = 5;
  CHECK_THROWS_AS(model->fit(tnt::test::threshold_data("progress"), fit), tnt::InputError);  // total_epochs < epochs
}

TEST_CASE("fit's validation passes: hooks on every rank with the pass's size; announced by the master") {
  ::setenv("TNT_STDOUT_IS_TTY", "0", 1);
  auto model = make_model();
  auto recorder = std::make_shared<EvalRecorder>();
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 3;
  fit.verbose = 1;
  fit.validation_freq = 2;  // after epochs 2 and 3 (the last)
  fit.validation_batch_size = 10;
  fit.validation_data = tnt::test::threshold_data("progress-validation").take(45);
  fit.callbacks = {recorder};
  std::string out;
  tnt::History history;
  {
    CapturedStdout capture;
    history = model->fit(tnt::test::threshold_data("progress"), fit);
    out = capture.text();
  }
  CHECK(recorder->begins == 2);
  CHECK(recorder->ends == 2);
  REQUIRE(recorder->params.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(recorder->params[i].steps == 5);  // 45 samples in global batches of 10, the last padded
    CHECK(recorder->params[i].batch_size == 10);
    CHECK(recorder->params[i].samples == 45);
    CHECK(recorder->params[i].verbose == 1);
    CHECK(recorder->batches[i] == 5);
    // on_test_end gets the global results, the ones fit logs as val_.
    CHECK(recorder->results[i].at("loss") == history.history.at("val_loss")[i]);
  }
  std::vector<std::string> lines = lines_of(out);
  if (tnt::is_master_rank()) {
    CHECK(starting(lines, "Evaluating on 45 samples (5 steps, global batch 10)").size() == 2);
    // Epoch 1 has no validation: its line has no evaluation time.
    std::vector<std::string> ends = starting(lines, "4/4 - ");
    REQUIRE(ends.size() == 3);
    CHECK(ends[0].find("evaluation") == std::string::npos);
    CHECK(ends[1].find(" - evaluation: ") != std::string::npos);
    CHECK(ends[2].find(" - evaluation: ") != std::string::npos);
  } else {
    CHECK(out.empty());
  }
}

TEST_CASE("evaluate with verbose announces the pass and prints its results on the master; silent by default") {
  ::setenv("TNT_STDOUT_IS_TTY", "0", 1);
  auto model = make_model();
  const tnt::Dataset data = tnt::test::threshold_data("progress-evaluate");
  tnt::EvaluateOptions ev;
  ev.batch_size = 8;
  std::string out;
  tnt::Logs quiet, loud;
  {
    CapturedStdout capture;
    quiet = model->evaluate(data, ev);
    out = capture.text();
  }
  CHECK(out.empty());
  ev.verbose = 1;
  {
    CapturedStdout capture;
    loud = model->evaluate(data, ev);
    out = capture.text();
  }
  CHECK(loud == quiet);
  if (tnt::is_master_rank()) {
    std::vector<std::string> lines = lines_of(out);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0] == "Evaluating on 64 samples (8 steps, global batch 8)");
    CHECK(lines[1].rfind("8/8 - ", 0) == 0);
    CHECK(lines[1].find(fmt::format(" - loss: {:.4f} - accuracy: {:.4f}", loud.at("loss"), loud.at("accuracy"))) !=
          std::string::npos);
  } else {
    CHECK(out.empty());
  }
  // The same on a dataset already distributed (its sample count is not known there).
  const tnt::DistributedDataset dist = data.distribute(8, tnt::rank(), tnt::size(), tnt::Remainder::pad);
  tnt::EvaluateOptions dv;
  dv.verbose = 1;
  tnt::Logs from_dist;
  {
    CapturedStdout capture;
    from_dist = model->evaluate(dist, dv);
    out = capture.text();
  }
  CHECK(from_dist == quiet);
  if (tnt::is_master_rank()) {
    std::vector<std::string> lines = lines_of(out);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0] == "Evaluating (8 steps, global batch 8)");
    CHECK(lines[1].rfind("8/8 - ", 0) == 0);
  } else {
    CHECK(out.empty());
  }
}

TEST_CASE("the epoch timing line: the allreduce, the share while backward ran, and the wait after it, apart") {
  tnt::EpochTiming t;
  t.steps = 1;
  t.step_seconds = 0.0412;
  t.backward_seconds = 0.0201;
  t.comm_seconds = 0.008;
  t.hidden_comm_seconds = 0.006;
  t.exposed_comm_seconds = 0.0025;
  CHECK(tnt::describe_epoch_timing(3, t, 2) ==
        "epoch 3: 41.2 ms/step, backward 20.1 ms; gradient allreduce 8.0 ms a step, 75% of it while backward ran; "
        "after backward the step waited 2.5 ms for its gradients");
  CHECK(tnt::describe_epoch_timing(1, t, 1) == "epoch 1: 41.2 ms/step, backward 20.1 ms (1 rank: no gradient allreduce)");
  // A wait for the batches under 5% of the loop's time goes unmentioned; from 5% it is said.
  t.input_seconds = 0.002;
  CHECK(tnt::describe_epoch_timing(1, t, 1) == "epoch 1: 41.2 ms/step, backward 20.1 ms (1 rank: no gradient allreduce)");
  t.input_seconds = 0.0123;
  CHECK(tnt::describe_epoch_timing(1, t, 1) ==
        "epoch 1: 41.2 ms/step, backward 20.1 ms; waited 12.3 ms a step for its batch (23%: the input is too slow) "
        "(1 rank: no gradient allreduce)");
  // Under a millisecond, three decimals (before: "waited 0.0 ms a step ... (6%: ...)").
  {
    tnt::EpochTiming tiny;
    tiny.step_seconds = 0.0004;
    tiny.backward_seconds = 0.0001;
    tiny.input_seconds = 0.00003;
    CHECK(tnt::describe_epoch_timing(1, tiny, 1) ==
          "epoch 1: 0.400 ms/step, backward 0.100 ms; waited 0.030 ms a step for its batch (7%: the input is too "
          "slow) (1 rank: no gradient allreduce)");
  }
  t.input_seconds = 0;
  // A parameter-server worker has no allreduce: its pull and push instead.
  t.parameter_server = true;
  t.pull_seconds = 0.0031;
  t.push_seconds = 0.0012;
  CHECK(tnt::describe_epoch_timing(2, t, 2) ==
        "epoch 2: 41.2 ms/step, backward 20.1 ms; parameter servers: pull 3.1 ms a step, push 1.2 ms (this "
        "worker's own steps)");
}

TEST_CASE("the epoch timing counts the loop's wait for its batches") {
  // Each element takes 5 ms to make, on one worker: a batch of 8 waits about 40 ms a step,
  // far more than the small network's step. A lower bound only (a busy machine adds).
  auto model = make_model();
  tnt::Dataset slow = tnt::test::threshold_data("slow input").map(
      [](tnt::Element e) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return e;
      },
      1);
  tnt::FitOptions fit;
  fit.batch_size = 8 * tnt::size();
  fit.epochs = 1;
  fit.max_steps = 4;
  // No prefetch: its thread starts with the epoch and, on a loaded machine, got up to two
  // batches ahead of a loop slowed down by the load (31.7 ms a step measured under a load
  // average of 3.5, in 4 of 5 runs): the bound is about the loop's own wait.
  fit.prefetch = 0;
  model->fit(slow, fit);
  const tnt::EpochTiming& t = model->last_epoch_timing();
  CHECK(t.steps == 4);
  CHECK(t.input_seconds >= 0.035);  // 8 elements of 5 ms, less a little for the first's start
  CHECK(t.input_fraction() > tnt::kInputBoundFraction);
  CHECK_THAT(tnt::describe_epoch_timing(1, t, tnt::size()), Catch::Contains("for its batch"));
}
