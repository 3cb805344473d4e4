// Which rank the others wait for (train/rank_balance.hpp): the verdict and its text from
// chosen numbers; one rank's accounting from chosen host times and from a fake GPU's events;
// and, on several ranks, a real fit with one rank slowed down in its input (also with a loss
// over tokens), its callbacks, its forward or its update: the master names that rank and
// that part, and a fit with every rank slowed alike names none, nor communication.
#include <catch2/catch.hpp>

#include "capture_stderr.hpp"
#include "fake_device_events.hpp"
#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"
#include "train/rank_balance.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace tnt;
using tnt::detail::LagCause;
using tnt::detail::RankBalance;
using tnt::detail::RankWork;

namespace {

// Sums of a few such values in binary: far below the microseconds that matter.
constexpr double kEps = 1e-9;

RankWork work(double input, double other, double compute, double period = 0.050, int64_t steps = 10) {
  return {.own_s = input + other + compute, .input_s = input, .other_s = other, .compute_s = compute,
          .queue_s = compute, .period_s = period, .steps = steps};
}

void pause_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Passes its input on; on rank `rank` its forward first sleeps `ms` (a slower device).
class Pause : public Layer {
 public:
  Pause(int rank, int ms) : Layer("pause"), rank_(rank), ms_(ms) {}
  std::string type() const override { return "Pause"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0)}; }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState&) override {
    if (tnt::rank() == rank_) pause_ms(ms_);
    return {in.at(0)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState&) override {
    return {g.at(0)};
  }

 private:
  int rank_, ms_;
};

// Sleeps `ms` before each step on the ranks it is made for (every rank: -1).
class SlowCallback : public Callback {
 public:
  SlowCallback(int rank, int ms) : Callback(Ranks::all), rank_(rank), ms_(ms) {}
  void on_train_batch_begin(int64_t, const Logs&) override {
    if (rank_ < 0 || tnt::rank() == rank_) pause_ms(ms_);
  }

 private:
  int rank_, ms_;
};

// SGD whose update sleeps 8 ms a parameter (32 ms a step for the MLP's 4) on rank `rank`.
class SlowSGD : public SGD {
 public:
  SlowSGD(double lr, int rank) : SGD(lr), rank_(rank) {}

 protected:
  void update(Parameter& param, ParamState& state, double lr, bool decay) override {
    if (tnt::rank() == rank_) pause_ms(8);
    SGD::update(param, state, lr, decay);
  }

 private:
  int rank_;
};

struct Slowed {
  int input_rank = -1, callback_rank = -1, compute_rank = -1, update_rank = -1, all_ranks_ms = 0;
  // A loss averaged over tokens: its count's allreduce inside forward, where the others wait
  // for the slowed rank (that wait must not count as their own work).
  bool tokens = false;
};

// threshold_data's 64 samples as sequences of 3 tokens of 4 features, a label each.
Dataset token_data() {
  Tensor x = Tensor::empty({64, 3, 4});
  Tensor y = Tensor::empty({64, 3}, DType::i64);
  CounterRng rng(5, "balance tokens");
  for (int64_t i = 0; i < 64 * 3 * 4; ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t n = 0; n < 64 * 3; ++n) y.data<int64_t>()[n] = x.data<float>()[n * 4] > 0.5f ? 1 : 0;
  return Dataset::from_tensors({x, y});
}

// Two epochs of the small MLP (batch 2 a rank: 10 steps or more an epoch on 1-3 ranks),
// quiet; returns the master's stderr and the last epoch's timing.
std::pair<std::string, EpochTiming> fit_slowed(const Slowed& s) {
  auto net = std::make_shared<Sequential>("balance");
  net->add(std::make_shared<Dense>(8, "fc1"));
  net->add(std::make_shared<Pause>(s.compute_rank, 30));
  net->add(std::make_shared<ReLU>("relu"));
  net->add(std::make_shared<Dense>(2, "fc2"));
  net->build(s.tokens ? Shape{3, 4} : Shape{4});
  Model model(net, 3);
  model.compile(std::make_shared<SlowSGD>(0.01, s.update_rank), std::make_shared<SoftmaxCrossEntropy>());
  // 30 ms a sample on the slowed rank's input, made by one worker without prefetch: about
  // 60 ms of a step there.
  const int input_rank = s.input_rank;
  Dataset data = (s.tokens ? token_data() : test::threshold_data("balance")).map(
      [input_rank](Element e) {
        if (tnt::rank() == input_rank) pause_ms(30);
        return e;
      },
      1);
  FitOptions fit;
  fit.batch_size = 2 * size();
  fit.epochs = 2;
  fit.max_steps = 24;
  fit.verbose = 0;
  fit.prefetch = 0;
  if (s.callback_rank >= 0) fit.callbacks.push_back(std::make_shared<SlowCallback>(s.callback_rank, 30));
  if (s.all_ranks_ms > 0) fit.callbacks.push_back(std::make_shared<SlowCallback>(-1, s.all_ranks_ms));
  std::string err = test::captured_stderr([&] { model.fit(data, fit); });
  return {err, model.last_epoch_timing()};
}

}  // namespace

TEST_CASE("rank balance: the slowest rank is named with the part that makes the difference", "[train][balance]") {
  // Four ranks, 19-21 ms of compute each; rank 2 waits 15 ms more for its input.
  std::vector<RankWork> ranks{work(0.001, 0.001, 0.020), work(0.001, 0.001, 0.021), work(0.016, 0.001, 0.020),
                              work(0.001, 0.001, 0.019)};
  const std::vector<std::string> hosts{"h1", "h2", "h3", "h4"}, one_host(4, "");
  auto s = detail::find_straggler(ranks);
  REQUIRE(s);
  CHECK(s->rank == 2);
  CHECK(s->ranks == std::vector<int>{2});
  CHECK(s->cause == LagCause::input);
  CHECK(s->typical.own_s == Approx(0.022).margin(kEps));  // the median of 22, 23 and 21 ms
  CHECK(s->lag_s == Approx(0.015).margin(kEps));
  CHECK(s->share == Approx(0.3).margin(kEps));
  CHECK(detail::describe_straggler(3, *s, hosts, 4) ==
        "epoch 3: rank 2 (host h3) held the other 3 ranks back: its own work took 37.0 ms a step, against 22.0 ms "
        "typical of the other ranks (their median), which waited about 15.0 ms a step for it (30% of the step). Most "
        "of it is its input: it waited 16.0 ms a step for its batch, the others 1.0 ms (reading or decoding its data "
        "is slower there)");
  // The epoch line of --verbose=2 with these numbers.
  EpochTiming t;
  t.steps = 10;
  t.step_seconds = 0.05;
  t.slowest_rank = s->rank;
  t.slowest_own_seconds = s->slow.own_s;
  detail::slowest_ratio(ranks, nullptr, &t.typical_own_seconds);
  CHECK_THAT(describe_epoch_timing(3, t, 4),
             Catch::EndsWith("; the slowest rank's own work: rank 2, 37.0 ms against the waiting ranks' median "
                             "22.0 ms (1.68x)"));
  CHECK_THAT(describe_epoch_timing(3, t, 2), Catch::Contains("37.0 ms against the other rank's 22.0 ms"));

  SECTION("compute, on a CPU and on a GPU") {
    ranks[2] = work(0.001, 0.001, 0.040);
    s = detail::find_straggler(ranks);
    REQUIRE(s);
    CHECK(s->cause == LagCause::compute);
    CHECK_THAT(detail::describe_straggler(1, *s, one_host, 4),
               Catch::StartsWith("epoch 1: rank 2 held the other 3 ranks back") &&
                   Catch::Contains("Most of it is its forward, backward and update: 40.0 ms a step, the others 20.0 "
                                   "ms") &&
                   !Catch::Contains("GPU"));
    // Worded by the straggler's own kind of rank.
    detail::Straggler g = *s;
    g.slow.gpu = true;
    CHECK_THAT(detail::describe_straggler(1, g, one_host, 4),
               Catch::Contains("ms a step (GPU time), against") &&
                   Catch::Contains("Most of it is its forward, backward and update on the GPU: 40.0 ms a step there, "
                                   "the others 20.0 ms; its host queued them in 40.0 ms a step, the others in 20.0 "
                                   "ms"));
  }
  SECTION("rank 0's callbacks") {
    ranks[2] = work(0.001, 0.001, 0.020);
    ranks[0] = work(0.001, 0.020, 0.020);
    s = detail::find_straggler(ranks);
    REQUIRE(s);
    CHECK(s->rank == 0);
    CHECK(s->cause == LagCause::other);
    CHECK_THAT(detail::describe_straggler(1, *s, one_host, 4), Catch::Contains("rank 0 alone runs the progress bar"));
  }
  SECTION("no part explains half of it") {
    ranks[2] = work(0.007, 0.006, 0.028);
    s = detail::find_straggler(ranks);
    REQUIRE(s);
    CHECK(s->cause == LagCause::spread);
    CHECK_THAT(detail::describe_straggler(1, *s, one_host, 4), Catch::Contains(". No one part explains most of it: "
                                                                               "input 7.0 ms against 1.0"));
  }
  SECTION("two ranks: the other rank is the measure") {
    ranks = {work(0.001, 0.001, 0.020), work(0.001, 0.001, 0.030)};
    s = detail::find_straggler(ranks);
    REQUIRE(s);
    CHECK(s->rank == 1);
    CHECK_THAT(detail::describe_straggler(1, *s, {"", ""}, 2),
               Catch::Contains("held the other rank back") &&
                   Catch::Contains("against 22.0 ms on the other rank, which waited about 10.0 ms a step for it") &&
                   Catch::Contains("update: 30.0 ms a step, the other rank 20.0 ms"));
  }
  SECTION("two slow ranks of three are named together, against the fast one") {
    // Ranks 1 and 2 share a core: 17.6 and 18.3 ms against rank 0's 10.4.
    ranks = {work(0.001, 0.001, 0.0084), work(0.001, 0.001, 0.0156), work(0.001, 0.001, 0.0163)};
    s = detail::find_straggler(ranks);
    REQUIRE(s);
    CHECK(s->rank == 2);
    CHECK(s->ranks == std::vector<int>{1, 2});
    CHECK(s->typical.own_s == Approx(0.0104).margin(kEps));
    CHECK(detail::describe_straggler(1, *s, {"", "", ""}, 3) ==
          "epoch 1: ranks 1 and 2 held the other rank back: rank 2, the slowest, took 18.3 ms a step for its own "
          "work, against 10.4 ms on the other rank, which waited about 7.9 ms a step for it (16% of the step). In "
          "rank 2, most of it is its forward, backward and update: 16.3 ms a step, the other rank 8.4 ms (a slower or "
          "busier CPU, or fewer cores for this rank)");
    CHECK_THAT(detail::describe_straggler(1, *s, {"h1", "h2", "h3"}, 3),
               Catch::StartsWith("epoch 1: ranks 1 (host h2) and 2 (host h3) held the other rank back"));
    CHECK_THAT(detail::describe_straggler(1, *s, {"h1", "h2", "h2"}, 3),
               Catch::StartsWith("epoch 1: ranks 1 and 2 (host h2) held the other rank back"));
    CHECK_THAT(detail::describe_straggler(1, *s, {"", "", ""}, 3), !Catch::Contains("No one part"));
    // Which of the two is the slower one changes from epoch to epoch: not a new warning.
    RankBalance b(std::unique_ptr<timeline::DeviceEvents>{});
    detail::EpochBalance e;
    e.straggler = s;
    e.judged = true;
    CHECK(b.worth_warning(e));
    std::swap(ranks[1], ranks[2]);
    e.straggler = detail::find_straggler(ranks);
    REQUIRE(e.straggler);
    CHECK(e.straggler->rank == 1);
    CHECK_FALSE(b.worth_warning(e));
  }
  SECTION("one fast rank of four: three named, against it") {
    // Three of four ranks on one busy host; the fastest waits 20 ms a step.
    ranks = {work(0.001, 0.001, 0.008), work(0.001, 0.001, 0.023), work(0.001, 0.001, 0.028),
             work(0.001, 0.001, 0.028)};
    s = detail::find_straggler(ranks);
    REQUIRE(s);
    CHECK(s->ranks == std::vector<int>{1, 2, 3});
    CHECK(s->typical.own_s == Approx(0.010).margin(kEps));
    CHECK_THAT(detail::describe_straggler(2, *s, {"", "", "", ""}, 4),
               Catch::StartsWith("epoch 2: ranks 1, 2 and 3 held the other rank back: rank 2, the slowest, took 30.0 "
                                 "ms a step for its own work, against 10.0 ms on the other rank, which waited about "
                                 "20.0 ms a step for it (40% of the step)"));
    CHECK_THAT(detail::describe_straggler(2, *s, {"h1", "h2", "h2", "h3"}, 4),
               Catch::StartsWith("epoch 2: ranks 1 (host h2), 2 (host h2) and 3 (host h3) held the other rank back"));
  }
  SECTION("a second slow host is news") {
    auto named = [](int slowest, std::vector<int> set) {
      detail::Straggler x;
      x.rank = slowest;
      x.ranks = std::move(set);
      return x;
    };
    const std::vector<std::string> h8{"h1", "h1", "h3", "h3", "h4", "h4", "h4", "h4"};
    const std::vector<std::string> one8(8, "");
    // The same ranks; the slower of two; a rank near the threshold on a named host.
    CHECK(detail::same_stragglers(named(2, {2}), named(2, {2}), h8));
    CHECK(detail::same_stragglers(named(2, {2, 3}), named(3, {2, 3}), h8));
    CHECK(detail::same_stragglers(named(2, {2}), named(2, {2, 3}), h8));
    // Host h4 joins h3: news, with four ranks or one.
    CHECK_FALSE(detail::same_stragglers(named(2, {2}), named(2, {2, 4, 5, 6, 7}), h8));
    CHECK_FALSE(detail::same_stragglers(named(2, {2, 3}), named(2, {2, 3, 6}), h8));
    // One rank fewer, alone on its host (one rank a host): its host was named, no news; two
    // fewer are news.
    const std::vector<std::string> h4{"h1", "h2", "h3", "h4"};
    CHECK(detail::same_stragglers(named(2, {2, 3}), named(2, {2}), h4));
    CHECK_FALSE(detail::same_stragglers(named(2, {2, 3}), named(2, {2, 3, 1}), h4));  // h2 joins
    CHECK_FALSE(detail::same_stragglers(named(2, {2, 3, 6}), named(2, {2}), h8));
    // On one host, one rank more or less is not; two are.
    CHECK(detail::same_stragglers(named(1, {1, 2}), named(2, {1, 2, 6}), one8));
    CHECK_FALSE(detail::same_stragglers(named(1, {1}), named(1, {1, 5, 6}), one8));
    // Another slowest, not named before: news.
    CHECK_FALSE(detail::same_stragglers(named(2, {2}), named(5, {5}), one8));
  }
  SECTION("a rank near the threshold named in one epoch and not the next: no news") {
    RankBalance b(std::unique_ptr<timeline::DeviceEvents>{});
    detail::EpochBalance e;
    e.judged = true;
    ranks = {work(0.001, 0.001, 0.020), work(0.001, 0.001, 0.020), work(0.001, 0.001, 0.040),
             work(0.001, 0.001, 0.020)};
    e.straggler = detail::find_straggler(ranks);
    REQUIRE(e.straggler);
    CHECK(b.worth_warning(e));
    ranks[1] = work(0.001, 0.001, 0.0265);  // 28.5 ms: 1.30x the others, named too
    e.straggler = detail::find_straggler(ranks);
    REQUIRE(e.straggler);
    CHECK(e.straggler->ranks == std::vector<int>{1, 2});
    CHECK_FALSE(b.worth_warning(e));
    ranks[1] = work(0.001, 0.001, 0.020);
    e.straggler = detail::find_straggler(ranks);
    CHECK_FALSE(b.worth_warning(e));
    // Rank 1 alone, rank 2 back among the others: news.
    ranks[1] = work(0.001, 0.001, 0.040);
    ranks[2] = work(0.001, 0.001, 0.020);
    e.straggler = detail::find_straggler(ranks);
    REQUIRE(e.straggler);
    CHECK(e.straggler->ranks == std::vector<int>{1});
    CHECK(b.worth_warning(e));
  }
}

TEST_CASE("rank balance: nothing is named below the thresholds", "[train][balance]") {
  std::vector<RankWork> ranks{work(0.001, 0.001, 0.020), work(0.001, 0.001, 0.020), work(0.001, 0.001, 0.020)};
  CHECK_FALSE(detail::find_straggler(ranks));
  CHECK(detail::slowest_ratio(ranks) == Approx(1.0));
  // 1.24x the others: under kStragglerRatio, although 24% of the step.
  ranks[1] = work(0.001, 0.001, 0.02528);
  CHECK_FALSE(detail::find_straggler(ranks));
  ranks[1] = work(0.001, 0.001, 0.0256);  // 1.2545x, 5.6 ms: 11% of a 50 ms step
  CHECK(detail::find_straggler(ranks));
  // The same gap in a 100 ms step: 5.6%, under kStragglerShare.
  for (RankWork& w : ranks) w.period_s = 0.100;
  CHECK_FALSE(detail::find_straggler(ranks));
  // Twice the others, but under kStragglerMinGapS (a tiny model's steps).
  ranks = {work(0, 0, 0.0004, 0.001), work(0, 0, 0.0008, 0.001)};
  CHECK_FALSE(detail::find_straggler(ranks));
  // Too few steps to judge.
  ranks = {work(0.001, 0.001, 0.020, 0.05, 4), work(0.001, 0.001, 0.040, 0.05, 4)};
  CHECK_FALSE(detail::find_straggler(ranks));
  ranks[0].steps = ranks[1].steps = detail::kStragglerMinSteps;
  CHECK(detail::find_straggler(ranks));
  // One rank: nobody to wait for.
  CHECK_FALSE(detail::find_straggler({work(0.001, 0.001, 0.040)}));
  // Equals: the lowest rank is the slowest.
  int slowest = -1;
  detail::slowest_ratio({work(0, 0, 0.02), work(0, 0, 0.03), work(0, 0, 0.03)}, &slowest);
  CHECK(slowest == 1);
}

TEST_CASE("rank balance: communication that backward does not hide is named", "[train][balance]") {
  auto ranks = [](double period = 0.010, int64_t steps = 10) {
    return std::vector<RankWork>{work(0.001, 0.001, 0.005, period, steps), work(0.001, 0.001, 0.005, period, steps)};
  };
  // The steps' least wait: 2 ms of a 10 ms step.
  auto c = detail::find_comm_bound(0.002, ranks(), false);
  REQUIRE(c);
  CHECK(c->exposed_s == Approx(0.002).margin(kEps));
  CHECK(c->share == Approx(0.2).margin(kEps));
  CHECK(detail::describe_comm_bound(4, *c, 32 << 10, false) ==
        "epoch 4: after its backward every rank waited at least 2.0 ms a step for the gradients' allreduce to finish "
        "(20% of the step): communication that backward does not hide limits this job. The fusion threshold is 32 KB "
        "(--fusion-threshold auto, TNT_FUSION_THRESHOLD=auto, chooses one from a measurement of this job). "
        "`tarantella predict` (docs/scaling.md) tells what a faster network, fewer ranks or a larger batch a rank "
        "would give");
  CHECK_THAT(detail::describe_comm_bound(4, *c, 1000, true),
             Catch::Contains("The fusion threshold was chosen from a measurement (1000 bytes). `tarantella predict`"));
  // On one host there is no network to blame.
  CHECK_THAT(detail::describe_comm_bound(4, *detail::find_comm_bound(0.002, ranks(), true), 32 << 10, false),
             Catch::Contains("The ranks share one host: their allreduce goes through its memory and competes with "
                             "training for its cores, so fewer ranks, or more cores a rank, may train faster; the "
                             "fusion threshold is 32 KB") &&
                 !Catch::Contains("faster network"));
  std::vector<RankWork> gpu = ranks();
  gpu[1].gpu = true;
  CHECK_THAT(detail::describe_comm_bound(4, *detail::find_comm_bound(0.002, gpu, false), 0, false),
             Catch::Contains("2.0 ms a step (GPU time) for"));
  CHECK_THAT(detail::describe_comm_bound(4, *detail::find_comm_bound(0.002, gpu, true), 0, false),
             Catch::Contains("over its GPUs' links (NVLink or PCIe)") && !Catch::Contains("cores"));
  // Under 20% of the step; under 1 ms; too few steps; one rank.
  CHECK_FALSE(detail::find_comm_bound(0.0019, ranks(), false));
  CHECK_FALSE(detail::find_comm_bound(0.0009, ranks(0.002), false));
  CHECK_FALSE(detail::find_comm_bound(0.003, ranks(0.01, 4), false));
  CHECK_FALSE(detail::find_comm_bound(0.009, {work(0.001, 0.001, 0.005)}, false));

  // Said once; again when its share grew by half or shrank by a third; forgotten after a
  // judged epoch under 10%, not after one too short to judge.
  RankBalance b(std::unique_ptr<timeline::DeviceEvents>{});
  auto verdict = [&](double least, bool judged = true) {
    detail::EpochBalance e;
    e.comm = detail::find_comm_bound(least, ranks(), false);
    e.exposed_share = least / 0.010;
    e.judged = judged;
    return e;
  };
  CHECK(b.worth_comm_warning(verdict(0.002)));
  CHECK_FALSE(b.worth_comm_warning(verdict(0.002)));
  CHECK_FALSE(b.worth_comm_warning(verdict(0.0029)));  // 29%: not by half
  CHECK(b.worth_comm_warning(verdict(0.0031)));        // 31%
  CHECK_FALSE(b.worth_comm_warning(verdict(0.0015)));  // under 20%, over 10%: kept
  CHECK_FALSE(b.worth_comm_warning(verdict(0.0031)));
  CHECK_FALSE(b.worth_comm_warning(verdict(0.0005, false)));  // too short to judge: kept
  CHECK_FALSE(b.worth_comm_warning(verdict(0.0031)));
  CHECK_FALSE(b.worth_comm_warning(verdict(0.0005)));  // forgotten
  CHECK(b.worth_comm_warning(verdict(0.0031)));
}

TEST_CASE("rank balance: each step's wait after backward is kept, thinned alike on every rank", "[train][balance]") {
  RankBalance b(std::unique_ptr<timeline::DeviceEvents>{});
  b.epoch_begin();
  // 10,001 steps; step i waits i microseconds after its backward (the first is not counted).
  for (int i = -1; i < 10000; ++i) {
    const double t = 1.0 + 0.02 * (i + 1), wait = 1e-6 * std::max(i, 0);
    b.step_begin(t);
    b.input_done(t);
    b.compute_begin(t);
    b.backward_end(t + 0.001);
    b.update_begin(t + 0.001 + wait);
    b.update_done();
    b.step_end(t + 0.002 + wait);
    b.met(t + 0.003 + wait);
  }
  // Kept every step up to 4096, every second then, every fourth after step 8192.
  const std::vector<double>& kept = b.exposed_samples();
  REQUIRE(kept.size() == 2049 + (10000 - 8196) / 4);
  for (size_t i : {size_t{0}, size_t{1}, size_t{1000}, kept.size() - 1}) {
    INFO("sample " << i);
    CHECK(kept[i] == Approx(4e-6 * static_cast<double>(i)).margin(1e-9));
  }
  CHECK(b.local().exposed_s == Approx(1e-6 * 9999 / 2).margin(1e-9));  // the mean is of every step
  (void)b.gather(communicator());
  // Every rank kept the same waits here: the least over them is the mean of the kept ones.
  CHECK(b.least_exposed(communicator()) == Approx(4e-6 * static_cast<double>(kept.size() - 1) / 2).margin(1e-9));
}

TEST_CASE("rank balance: a warning is repeated only when it changes", "[train][balance]") {
  RankBalance b(std::unique_ptr<timeline::DeviceEvents>{});
  auto verdict = [](const std::vector<RankWork>& ranks) {
    detail::EpochBalance e;
    e.straggler = detail::find_straggler(ranks);
    e.slowest_ratio = detail::slowest_ratio(ranks);
    e.judged = true;
    return e;
  };
  std::vector<RankWork> ranks{work(0.001, 0.001, 0.020), work(0.011, 0.001, 0.020), work(0.001, 0.001, 0.020)};
  REQUIRE(verdict(ranks).straggler);
  CHECK(b.worth_warning(verdict(ranks)));
  CHECK_FALSE(b.worth_warning(verdict(ranks)));
  ranks[1] = work(0.015, 0.001, 0.020);  // 14 ms instead of 10: not by half
  CHECK_FALSE(b.worth_warning(verdict(ranks)));
  ranks[1] = work(0.017, 0.001, 0.020);  // 16 ms: by more than half
  CHECK(b.worth_warning(verdict(ranks)));
  ranks[1] = work(0.001, 0.001, 0.037);  // the same rank, another part
  CHECK(b.worth_warning(verdict(ranks)));
  ranks[1] = work(0.001, 0.001, 0.020);
  ranks[2] = work(0.001, 0.001, 0.037);  // another rank
  CHECK(b.worth_warning(verdict(ranks)));
  // Just under the threshold (1.24x): not forgotten, so not said again after it.
  ranks[2] = work(0.001, 0.001, 0.02528);
  CHECK_FALSE(b.worth_warning(verdict(ranks)));
  ranks[2] = work(0.001, 0.001, 0.037);
  CHECK_FALSE(b.worth_warning(verdict(ranks)));
  // An epoch too short to judge forgets nothing either.
  detail::EpochBalance short_epoch;
  CHECK_FALSE(b.worth_warning(short_epoch));
  CHECK_FALSE(b.worth_warning(verdict(ranks)));
  // A balanced epoch (under kStragglerForgetRatio) starts afresh.
  ranks[2] = work(0.001, 0.001, 0.020);
  CHECK_FALSE(b.worth_warning(verdict(ranks)));
  ranks[2] = work(0.001, 0.001, 0.037);
  CHECK(b.worth_warning(verdict(ranks)));
}

TEST_CASE("rank balance: a CPU rank's own time runs from the ranks' meeting to its backward's end, and its update",
          "[train][balance]") {
  RankBalance b(std::unique_ptr<timeline::DeviceEvents>{});
  b.epoch_begin();
  // The epoch's first step: the ranks have not met in it yet, it is not counted.
  b.step_begin(0.900);
  b.input_done(0.950);
  b.compute_begin(0.950);
  b.backward_end(0.980);
  b.update_begin(0.981);
  b.update_done();
  b.step_end(0.982);
  b.met(0.990);
  CHECK(b.local().steps == 0);
  // 10 ms of loop after the meeting, 10 ms waiting for its batch, 2 ms to its forward.
  b.step_begin(1.000);
  b.input_done(1.010);
  b.compute_begin(1.012);
  b.wait_begin(1.020);  // a token count's allreduce: the others' wait, not this rank's work
  b.wait_end(1.025);
  b.backward_end(1.050);
  b.update_begin(1.052);  // the gradients' allreduce is left out too
  b.update_done();
  b.step_end(1.056);
  b.met(1.060);
  // 3 ms of callbacks and loop from the metrics' allreduce to its batch wait.
  b.step_begin(1.063);
  b.input_done(1.064);
  b.compute_begin(1.066);
  b.backward_end(1.100);
  b.update_begin(1.100);
  b.update_done();
  b.step_end(1.103);
  b.met(1.105);
  const RankWork w = b.local();
  CHECK(w.steps == 2);
  CHECK_FALSE(w.gpu);
  CHECK(w.input_s == Approx((0.010 + 0.001) / 2).margin(kEps));
  // From the meeting to its compute, less the input: 12 ms in the first, 5 ms in the second.
  CHECK(w.other_s == Approx((0.012 + 0.005) / 2).margin(kEps));
  CHECK(w.compute_s == Approx((0.037 + 0.037) / 2).margin(kEps));  // 33 + 4 ms, 34 + 3 ms
  CHECK(w.queue_s == w.compute_s);
  CHECK(w.own_s == Approx((0.059 + 0.043) / 2).margin(kEps));
  CHECK(w.period_s == Approx(0.0815).margin(kEps));  // from batch wait to batch wait: 100 and 63 ms
  CHECK(w.exposed_s == Approx((0.002 + 0.0) / 2).margin(kEps));  // backward's end to the gradients' arrival
  // A new epoch starts from nothing, and its first step is not counted again.
  b.epoch_begin();
  CHECK(b.local().steps == 0);
  CHECK(b.exposed_samples().empty());
  b.step_begin(2.000);
  b.input_done(2.000);
  b.compute_begin(2.000);
  b.backward_end(2.020);
  b.update_begin(2.020);
  b.update_done();
  b.step_end(2.022);
  CHECK(b.local().steps == 0);
}

TEST_CASE("rank balance: a GPU rank's own time is the GPU's, read when it has run", "[train][balance]") {
  auto gpu = std::make_shared<test::FakeGpu>();
  RankBalance b(std::make_unique<test::FakeEvents>(gpu));
  CHECK(b.gpu());
  // Step k: the host queues it from 10k ms. On the GPU (g = 11k ms) it idles 0.5 ms in each
  // of the step's two collectives (from g + 5 and g + 6), its backward ends at g + 9, the
  // gradients are there at g + 10, its update ends at g + 12, and the GPU passes the
  // metrics' meeting at g + 12.5 (the next step's reference). Before the step ends the GPU
  // has run up to g + 0.5: the step before is still running.
  auto step = [&](int k, bool finish = true) {
    const double t = 0.010 * k, g = 0.011 * k;
    b.step_begin(t);
    b.input_done(t + 0.001);
    b.compute_begin(t + 0.0015);
    for (double w : {0.005, 0.006}) {
      gpu->next = g + w;
      b.wait_begin(t + 0.002);
      if (!finish) return;  // the step throws in its collective
      gpu->next = g + w + 0.0005;
      b.wait_end(t + 0.00225);
    }
    gpu->next = g + 0.009;
    b.backward_end(t + 0.003);
    gpu->next = g + 0.010;
    b.update_begin(t + 0.0032);
    gpu->next = g + 0.012;
    b.update_done();
    gpu->done = g + 0.0005;
    b.step_end(t + 0.0035);
    gpu->next = g + 0.0125;
    b.met(t + 0.004);
  };
  auto epoch = [&](int first, int steps) {
    b.epoch_begin();
    for (int k = first; k < first + steps; ++k) {
      step(k);
      // Step k-1 has not run yet and step `first` has no reference: read so far, without
      // a wait, are the steps from first + 1 to k - 2.
      CHECK(b.local().steps == std::max(0, k - first - 2));
    }
  };
  epoch(0, 6);
  CHECK(gpu->waits == 0);  // nothing waits inside a step
  std::vector<RankWork> all = b.gather(communicator());  // at the epoch's end: waits once
  CHECK(gpu->waits == 1);
  const RankWork& mine = all.at(static_cast<size_t>(rank()));
  CHECK(mine.steps == 5);
  CHECK(mine.gpu);
  // (g_k + 9) - (g_{k-1} + 12.5) = 7.5 ms to the backward's end, less 1 ms idle in the
  // collectives, plus 2 ms of update: 8.5 ms every step.
  CHECK(mine.own_s == Approx(0.0085).margin(kEps));
  CHECK(mine.input_s == Approx(0.001).margin(kEps));
  // The host's loop from the ranks' meeting (4 ms into the step before) to the next step's
  // compute: 7.5 ms, less 1 ms of input.
  CHECK(mine.other_s == Approx(0.0065).margin(kEps));
  CHECK(mine.compute_s == Approx(0.001).margin(kEps));
  // The host's queuing: 1.5 ms to the backward's end less 0.5 ms in the collectives, 0.3 ms
  // of update.
  CHECK(mine.queue_s == Approx(0.0013).margin(kEps));
  CHECK(mine.exposed_s == Approx(0.001).margin(kEps));  // the GPU's, from backward's end to the gradients
  CHECK(b.exposed_samples().size() == 5);
  // A second epoch, with a step that throws in its first collective: its events go back,
  // it is not counted, and the pool does not grow.
  const int created = gpu->created;
  b.epoch_begin();
  step(10);
  step(11);
  step(12, false);
  step(13);
  step(14);
  step(15);
  (void)b.gather(communicator());
  CHECK(b.local().steps == 3);  // 11, 14 and 15: 10 is the first, 12 threw, 13 has no reference
  CHECK(gpu->created == created);
  // A pool: three steps of 8 events live at most (the step queued, the one before still
  // running, the one before that read at this one's end), however many steps run.
  CHECK(gpu->created <= 24);
}

TEST_CASE("rank balance: a fit names the rank the others waited for", "[train][balance]") {
  if (size() == 1) {
    // One rank: nothing to compare, nothing gathered.
    auto [err, t] = fit_slowed({});
    CHECK(t.slowest_rank == -1);
    CHECK(err.find("held") == std::string::npos);
    return;
  }
  const int last = size() - 1;
  const char* comm = "communication that backward does not hide";
  // Tolerances: a slowed rank needs 30 ms or more a step more than a step of the small
  // MLP (under 5 ms here even with 3 ranks sharing 2 cores), so it stands out far beyond
  // kStragglerRatio; the balanced run's ranks each sleep 30 ms a step and differ by the
  // machine's noise, far under 1.25x.
  SECTION("its input") {
    auto [err, t] = fit_slowed({.input_rank = last});
    CHECK(t.slowest_rank == last);
    if (rank() == 0) {
      CHECK_THAT(err, Catch::Contains(fmt::format("epoch 1: rank {} held", last)) &&
                          Catch::Contains("Most of it is its input"));
      CHECK(err.find("epoch 2:") == std::string::npos);  // the same again: not repeated
      CHECK(err.find(comm) == std::string::npos);  // the slowest rank's own wait is short
    } else {
      CHECK(err.find("held") == std::string::npos);  // the master's warning alone
    }
  }
  SECTION("its input, with a loss over tokens") {
    auto [err, t] = fit_slowed({.input_rank = last, .tokens = true});
    CHECK(t.slowest_rank == last);
    if (rank() == 0) CHECK_THAT(err, Catch::Contains("Most of it is its input"));
  }
  SECTION("its callbacks") {
    auto [err, t] = fit_slowed({.callback_rank = 0});
    CHECK(t.slowest_rank == 0);
    if (rank() == 0) CHECK_THAT(err, Catch::Contains("rank 0 held") && Catch::Contains("outside the step"));
  }
  SECTION("its forward") {
    auto [err, t] = fit_slowed({.compute_rank = last});
    CHECK(t.slowest_rank == last);
    CHECK(t.slowest_own_seconds > t.typical_own_seconds + 0.025);
    if (rank() == 0) CHECK_THAT(err, Catch::Contains("Most of it is its forward, backward and update"));
  }
  SECTION("its update") {
    auto [err, t] = fit_slowed({.update_rank = last});
    CHECK(t.slowest_rank == last);
    if (rank() == 0) CHECK_THAT(err, Catch::Contains("Most of it is its forward, backward and update"));
  }
  SECTION("every rank alike") {
    auto [err, t] = fit_slowed({.all_ranks_ms = 30});
    CHECK(t.slowest_rank >= 0);
    CHECK(t.slowest_own_seconds < 1.25 * t.typical_own_seconds);
    CHECK(err.find("held") == std::string::npos);
    CHECK(err.find(comm) == std::string::npos);
  }
}
