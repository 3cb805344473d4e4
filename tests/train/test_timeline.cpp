// The timeline (tarantella/timeline.hpp) around Model::fit on 1 and 2 ranks: the merged file
// is JSON in Chrome's trace-event form, every rank has its row and its events, the step
// window is respected, each bucket's allreduce starts only after the backward of the layers
// it holds and overlaps the rest of backward, a rank's part is readable mid-run, bad input
// fails on every rank, a resumed run records its own first steps unless TNT_TIMELINE_STEPS
// says otherwise (and then a window it passed is a warning), a directory as the path fails
// before training.
#include "job_dir.hpp"
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tarantella/tarantella.hpp"
#include "tarantella/timeline.hpp"

#include "core/context.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string job_dir() { return tnt::test::job_dir("tnt_timeline"); }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Wide enough that backward takes milliseconds and each weight is a bucket of its own
// (4 MiB > the 32 KB fusion threshold): fc3's bucket is ready long before fc1's backward ends.
std::shared_ptr<tnt::Sequential> wide_mlp() {
  auto net = std::make_shared<tnt::Sequential>("wide");
  net->add(std::make_shared<tnt::Dense>(1024, "fc1"));
  net->add(std::make_shared<tnt::ReLU>("relu1"));
  net->add(std::make_shared<tnt::Dense>(1024, "fc2"));
  net->add(std::make_shared<tnt::ReLU>("relu2"));
  net->add(std::make_shared<tnt::Dense>(1024, "fc3"));
  net->add(std::make_shared<tnt::ReLU>("relu3"));
  net->add(std::make_shared<tnt::Dense>(4, "fc4"));
  net->build({32});
  return net;
}

// 256 samples of 32 features, 4 classes.
tnt::Dataset data(uint64_t key) {
  tnt::Tensor x = tnt::Tensor::empty({256, 32});
  tnt::Tensor y = tnt::Tensor::empty({256}, tnt::DType::i64);
  tnt::CounterRng rng(key, "timeline");
  for (int64_t i = 0; i < 256 * 32; ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t n = 0; n < 256; ++n) y.data<int64_t>()[n] = n % 4;
  return tnt::Dataset::from_tensors({x, y});
}

// Reads this rank's part in the middle of the run (Chrome's array form, no closing bracket).
class PartCheck : public tnt::Callback {
 public:
  PartCheck(std::string part, int64_t at_step) : Callback(Ranks::all), part_(std::move(part)), at_(at_step) {}
  void on_train_batch_end(int64_t, const tnt::Logs&) override {
    if (model_->global_step() != at_) return;
    std::string text = read_file(part_);
    while (!text.empty() && (text.back() == '\n' || text.back() == ',')) text.pop_back();
    events = json::parse(text + "]");
  }
  json events;

 private:
  std::string part_;
  int64_t at_;
};

const json* find_meta(const json& events, int pid, const std::string& name) {
  for (const json& e : events) {
    if (e["ph"] == "M" && e["pid"] == pid && e["name"] == name) return &e;
  }
  return nullptr;
}

// TNT_TIMELINE and TNT_TIMELINE_STEPS as tnt::init read them, and the environment, set for
// one test and restored after it (the recorder is made at the start of fit()).
class TimelineConfig {
 public:
  TimelineConfig(const std::string& path, const char* steps) {
    tnt::Config& c = tnt::context_or_null()->config;
    saved_ = {c.timeline, c.timeline_steps};
    if (const char* e = std::getenv("TNT_TIMELINE_STEPS")) saved_env_ = e;
    had_env_ = std::getenv("TNT_TIMELINE_STEPS") != nullptr;
    c.timeline = path;
    c.timeline_steps = steps ? steps : "1-10";
    if (steps) {
      setenv("TNT_TIMELINE_STEPS", steps, 1);
    } else {
      unsetenv("TNT_TIMELINE_STEPS");
    }
  }
  ~TimelineConfig() {
    // As at the end of a program: fit() merged what it recorded; the recorder goes, with
    // its part when that holds nothing unmerged (stop_timeline would write a file anyway).
    tnt::communicator().barrier();
    tnt::context_or_null()->timeline.reset();
    tnt::Config& c = tnt::context_or_null()->config;
    c.timeline = saved_.first;
    c.timeline_steps = saved_.second;
    if (had_env_) {
      setenv("TNT_TIMELINE_STEPS", saved_env_.c_str(), 1);
    } else {
      unsetenv("TNT_TIMELINE_STEPS");
    }
  }

 private:
  std::pair<std::string, std::string> saved_;
  std::string saved_env_;
  bool had_env_ = false;
};

// What this process writes to stderr (the log) while f runs.
template <typename F>
std::string stderr_of(const std::string& file, F&& f) {
  std::fflush(stderr);
  std::cerr.flush();
  const int saved = dup(2);
  const int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  dup2(fd, 2);
  close(fd);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    throw;
  }
  std::fflush(stderr);
  std::cerr.flush();
  dup2(saved, 2);
  close(saved);
  return read_file(file);
}

std::shared_ptr<tnt::Sequential> small_mlp() {
  auto net = std::make_shared<tnt::Sequential>("small");
  net->add(std::make_shared<tnt::Dense>(16, "fc1"));
  net->add(std::make_shared<tnt::ReLU>("relu1"));
  net->add(std::make_shared<tnt::Dense>(4, "fc2"));
  net->build({32});
  return net;
}

std::unique_ptr<tnt::Model> small_model() {
  auto model = std::make_unique<tnt::Model>(small_mlp(), 7);
  model->compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  return model;
}

tnt::FitOptions small_fit(int initial_epoch, int epochs) {
  tnt::FitOptions fit;
  fit.batch_size = 32;  // 8 steps an epoch
  fit.initial_epoch = initial_epoch;
  fit.epochs = epochs;
  fit.verbose = 0;
  return fit;
}

std::set<int64_t> steps_in(const json& trace) {
  std::set<int64_t> steps;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") steps.insert(e["args"]["step"].get<int64_t>());
  }
  return steps;
}

}  // namespace

TEST_CASE("timeline: a resumed run records its own first steps unless TNT_TIMELINE_STEPS is given") {
  const std::string dir = job_dir();
  const std::string ckpt = dir + "/ckpt.safetensors";
  {
    auto first = small_model();
    first->fit(data(1), small_fit(0, 1));  // steps 1-8
    first->save_checkpoint(ckpt, 1);
  }

  SECTION("TNT_TIMELINE_STEPS unset: the first 10 steps of this run") {
    const std::string path = dir + "/resumed.json";
    TimelineConfig config(path, nullptr);
    auto resumed = small_model();
    REQUIRE(resumed->load_checkpoint(ckpt) == 1);
    resumed->fit(data(1), small_fit(1, 3));  // steps 9-24
    tnt::communicator().barrier();
    if (tnt::is_master_rank()) {
      const json trace = json::parse(read_file(path));
      CHECK(steps_in(trace) == std::set<int64_t>{9, 10, 11, 12, 13, 14, 15, 16, 17, 18});
      CHECK(trace["otherData"]["steps"] == "9-18");
    }
  }
  SECTION("TNT_TIMELINE_STEPS given and passed before the run began: one warning naming both, no file") {
    const std::string path = dir + "/passed.json";
    std::string log;
    {
      TimelineConfig config(path, "2-5");
      auto resumed = small_model();
      REQUIRE(resumed->load_checkpoint(ckpt) == 1);
      log = stderr_of(fmt::format("{}/stderr.rank{}", dir, tnt::rank()), [&] {
        resumed->fit(data(1), small_fit(1, 2));  // steps 9-16
      });
    }  // the recorder ends: its part, holding no step, is removed
    tnt::communicator().barrier();
    if (tnt::is_master_rank()) {
      INFO(log);
      CHECK_THAT(log, Catch::Contains("timeline: nothing recorded for '" + path + "': the window 2-5 "
                                      "(TNT_TIMELINE_STEPS) had passed when this run began at step 9 (it ran steps 9-16"));
      CHECK_THAT(log, Catch::Contains("set TNT_TIMELINE_STEPS to steps from 9 on"));
    }
    CHECK_FALSE(fs::exists(path));
    CHECK_FALSE(fs::exists(fmt::format("{}.rank{}", path, tnt::rank())));
  }
  SECTION("a window that training ends inside: the trace says the steps recorded") {
    // Before, otherData.steps gave the window asked for (13-40) though 13-24 were recorded.
    const std::string path = dir + "/cut.json";
    TimelineConfig config(path, "13-40");
    auto resumed = small_model();
    REQUIRE(resumed->load_checkpoint(ckpt) == 1);
    resumed->fit(data(1), small_fit(1, 3));  // steps 9-24
    tnt::communicator().barrier();
    if (tnt::is_master_rank()) {
      const json trace = json::parse(read_file(path));
      CHECK(steps_in(trace) == std::set<int64_t>{13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24});
      CHECK(trace["otherData"]["steps"] == "13-24");
    }
  }
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) fs::remove_all(dir);
}

TEST_CASE("timeline: a directory as the path fails on every rank before any step, writing nothing") {
  const std::string dir = job_dir();  // exists on every rank (one host)
  {
    TimelineConfig config(dir, nullptr);
    auto model = small_model();
    try {
      model->fit(data(1), small_fit(0, 1));
      FAIL("fit accepted a directory as the timeline's path");
    } catch (const tnt::InputError& e) {
      CHECK_THAT(e.what(), Catch::Contains("TNT_TIMELINE='" + dir + "'") && Catch::Contains("names a directory") &&
                               Catch::Contains(dir + "/trace.json"));
    }
    CHECK(model->global_step() == 0);  // before any step
    CHECK_FALSE(fs::exists(fmt::format("{}.rank{}", dir, tnt::rank())));
  }
  CHECK_THROWS_WITH(tnt::start_timeline(dir, 1, 2),
                    Catch::Contains("start_timeline's path '" + dir + "'") && Catch::Contains("names a directory"));
  CHECK_THROWS_WITH(tnt::start_timeline(dir + "/not-yet/", 1, 2), Catch::Contains("names a directory"));
  CHECK_FALSE(fs::exists(fmt::format("{}.rank{}", dir, tnt::rank())));
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) fs::remove_all(dir);
}

// Takes the trace's own name on the master in the middle of the run (a non-empty directory
// there), so the merge's rename fails as a full disk's write would.
class TakePath : public tnt::Callback {
 public:
  explicit TakePath(std::string path) : Callback(Ranks::master_only), path_(std::move(path)) {}
  void on_train_batch_end(int64_t, const tnt::Logs&) override {
    if (model_->global_step() != 1) return;
    fs::create_directories(path_);
    std::ofstream(path_ + "/x") << "x";
  }

 private:
  std::string path_;
};

TEST_CASE("timeline: a trace the merge cannot write is a run-time error on every rank, parts kept") {
  const std::string dir = job_dir();
  const std::string path = dir + "/taken.json";
  {
    TimelineConfig config(path, "1-2");
    auto model = small_model();
    tnt::FitOptions fit = small_fit(0, 1);
    fit.callbacks = {std::make_shared<TakePath>(path)};
    try {
      model->fit(data(1), fit);
      FAIL("fit ended although the trace could not be written");
    } catch (const tnt::InputError& e) {
      FAIL("an input error (exit 2) for a failed write: " << e.what());
    } catch (const tnt::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("timeline: cannot write '" + path + "'") &&
                               Catch::Contains("the per-rank parts " + path + ".rank<R> are left in place"));
    }
  }
  tnt::communicator().barrier();
  CHECK(fs::exists(fmt::format("{}.rank{}", path, tnt::rank())));
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) fs::remove_all(dir);
}

TEST_CASE("timeline: merged trace, rows, window, buckets against backward") {
  const std::string dir = job_dir();
  const std::string path = dir + "/trace.json";
  const int p = tnt::size();
  tnt::Model model(wide_mlp(), 7);
  model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  // A temporary file a master killed in its merge left (no process has that id): removed.
  const std::string stale = dir + "/.trace.json.tmp-999999999-AbCdEf";
  if (tnt::is_master_rank()) std::ofstream(stale) << "{\"traceEvents\":[";
  tnt::start_timeline(path, 3, 10);  // 8 steps a epoch: steps 3-8 of epoch 1, 9-10 of epoch 2
  auto part = std::make_shared<PartCheck>(fmt::format("{}.rank{}", path, tnt::rank()), 5);
  tnt::FitOptions fit;
  fit.batch_size = 32;
  fit.epochs = 2;
  fit.verbose = 0;
  fit.validation_data = data(2);
  fit.callbacks = {part, std::make_shared<tnt::ModelCheckpoint>(dir + "/ckpt.safetensors", "loss")};
  model.fit(data(1), fit);
  tnt::stop_timeline();  // the file is already merged at the end of fit; this ends the recorder
  if (tnt::is_master_rank()) {
    for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  }

  // Mid-run (at the end of step 5), this rank's part held its steps 3 and 4: a step's events
  // reach the part when the next step begins.
  {
    std::set<int64_t> steps;
    for (const json& e : part->events) {
      if (e["ph"] != "X") continue;
      CHECK(e["pid"] == tnt::rank());
      steps.insert(e["args"]["step"].get<int64_t>());
    }
    CHECK(steps == std::set<int64_t>{3, 4});
    CHECK(find_meta(part->events, tnt::rank(), "process_name") != nullptr);
  }
  // The merge removed the parts.
  CHECK_FALSE(fs::exists(fmt::format("{}.rank{}", path, tnt::rank())));
  tnt::communicator().barrier();
  if (!tnt::is_master_rank()) return;

  json trace = json::parse(read_file(path));
  const json& events = trace["traceEvents"];
  REQUIRE(events.is_array());
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r);
    const json* name = find_meta(events, r, "process_name");
    REQUIRE(name != nullptr);
    CHECK((*name)["args"]["name"] == fmt::format("rank {} on {}", r, host));
  }

  // Per rank and step: the compute phases, the backward spans of the layers, the buckets.
  struct Span {
    double t0, t1;
    json args;
  };
  std::map<int, std::map<int64_t, std::multimap<std::string, Span>>> by;  // rank -> step -> name -> spans
  std::set<int64_t> steps;
  for (const json& e : events) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    CHECK(dur >= 0);
    const int64_t step = e["args"]["step"].get<int64_t>();
    steps.insert(step);
    by[e["pid"].get<int>()][step].insert({e["name"].get<std::string>(), Span{ts, ts + dur, e["args"]}});
    // Every allreduce is on the communication thread (tid 2), every phase of the step on the compute one.
    if (e["name"] == "allreduce" || e["name"] == "pack") CHECK(e["tid"] == 2);
    if (e["name"] == "forward" || e["name"] == "optimizer") CHECK(e["tid"] == 1);
  }
  CHECK(steps == std::set<int64_t>{3, 4, 5, 6, 7, 8, 9, 10});  // the window, and nothing else
  REQUIRE(static_cast<int>(by.size()) == p);

  for (int r = 0; r < p; ++r) {
    int overlapping_steps = 0;
    for (int64_t s = 3; s <= 10; ++s) {
      INFO("rank " << r << " step " << s);
      const auto& ev = by[r][s];
      for (const char* phase : {"step", "input", "forward", "loss", "backward", "wait for gradients", "optimizer",
                                "metrics", "backward fc1", "backward fc2", "backward fc3", "backward fc4"})
        CHECK(ev.count(phase) == 1);
      // Epoch 1 ends with step 8: the evaluation and the checkpoint are in the window.
      CHECK(ev.count("evaluation") == (s == 8 ? 1u : 0u));
      CHECK(ev.count("checkpoint write") == (s == 8 ? 1u : 0u));
      const Span& backward = ev.find("backward")->second;
      const Span& step = ev.find("step")->second;
      CHECK(ev.find("input")->second.t1 <= step.t0 + 0.001);
      CHECK(step.t0 <= backward.t0);
      CHECK(backward.t1 <= step.t1);
      if (p == 1) {
        CHECK(ev.count("allreduce") == 0);  // one rank sends nothing
        continue;
      }
      // Buckets of >= 32 KB in reverse registration order: {fc4.*, fc3.bias, fc3.weight},
      // {fc2.*}, {fc1.*}. Each allreduce starts after the backward of its bucket's last layer.
      REQUIRE(ev.count("allreduce") == 3);
      auto [lo, hi] = ev.equal_range("allreduce");
      bool overlapped = false;
      for (auto it = lo; it != hi; ++it) {
        const Span& a = it->second;
        CHECK(a.args["bytes"].get<int64_t>() > 0);
        const std::string tensors = a.args["tensors"];
        const size_t last = tensors.rfind(", ");
        const std::string tail = last == std::string::npos ? tensors : tensors.substr(last + 2);
        const std::string layer = tail.substr(0, tail.find('.'));
        const Span& layer_span = ev.find("backward " + layer)->second;
        INFO("bucket of " << tensors);
        // Timestamps are printed to 1 ns; the same clock in one process.
        CHECK(a.t0 >= layer_span.t1 - 0.001);
        if (a.t0 < backward.t1) overlapped = true;
      }
      overlapping_steps += overlapped;
    }
    // fc4's and fc3's buckets are ready while fc2's and fc1's backward still run (ms each):
    // the allreduce overlaps backward in (nearly) every step, checked loosely for a busy machine.
    if (p > 1) CHECK(overlapping_steps >= 4);
  }
  // The ranks of this job run on one machine and read one steady clock: the recorder must
  // see that and move nothing. (Its broadcast samples were off by the smallest latency they
  // saw: over 0.4 ms on a loaded machine, which failed the check below 1 run in 4.)
  REQUIRE(trace["otherData"]["clock_offsets_ns"].size() == static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) CHECK(trace["otherData"]["clock_offsets_ns"][r].get<int64_t>() == 0);
  // One clock: an allreduce needs every rank, so each bucket's allreduce intervals of all
  // ranks share a moment. Misaligned clocks (off by more than an allreduce lasts) would
  // separate them. With one clock and no offset, 1 us of slack is for printing only.
  for (int64_t s = 3; p > 1 && s <= 10; ++s) {
    std::map<int64_t, std::pair<double, double>> common;  // bucket -> latest start, earliest end
    for (int r = 0; r < p; ++r) {
      auto [lo, hi] = by[r][s].equal_range("allreduce");
      for (auto it = lo; it != hi; ++it) {
        const int64_t b = it->second.args["bucket"].get<int64_t>();
        auto [c, fresh] = common.try_emplace(b, it->second.t0, it->second.t1);
        if (!fresh) c->second = {std::max(c->second.first, it->second.t0), std::min(c->second.second, it->second.t1)};
      }
    }
    for (const auto& [b, c] : common) {
      INFO("step " << s << " bucket " << b << ": latest start " << c.first << " us, earliest end " << c.second);
      CHECK(c.first <= c.second + 1.0);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("timeline: bad windows and paths fail on every rank") {
  CHECK_THROWS_AS(tnt::parse_step_window("0-3", "TNT_TIMELINE_STEPS"), tnt::InputError);
  CHECK_THROWS_AS(tnt::parse_step_window("5-2", "TNT_TIMELINE_STEPS"), tnt::InputError);
  CHECK_THROWS_WITH(tnt::parse_step_window("x", "TNT_TIMELINE_STEPS"), Catch::Contains("TNT_TIMELINE_STEPS='x'"));
  CHECK(tnt::parse_step_window("4", "w") == std::pair<int64_t, int64_t>{4, 4});
  CHECK(tnt::parse_step_window("2-30", "w") == std::pair<int64_t, int64_t>{2, 30});
  CHECK_THROWS_AS(tnt::start_timeline("/tmp/x.json", 0, 3), tnt::InputError);
  CHECK_THROWS_WITH(tnt::start_timeline("/nonexistent-dir-tnt/trace.json", 1, 2),
                    Catch::Contains("/nonexistent-dir-tnt/trace.json"));
  // The merge's rename would replace the device (as root, /dev/null itself).
  CHECK_THROWS_WITH(tnt::start_timeline("/dev/null", 1, 2),
                    Catch::Contains("'/dev/null' is not a regular file (a device, FIFO or socket)"));
  CHECK(fs::is_character_file("/dev/null"));
  tnt::stop_timeline();  // none: nothing to do
}
