// The TimeHistory callback driven hook by hook on a clock the test sets: each interval's
// rate is its units over its seconds, exactly (times and units are chosen to be exact in
// binary, so the printed numbers are checked as text); a step's time runs from the end of
// the step before it in the epoch, or from the epoch's beginning, so what happens between
// epochs is not counted; the average leaves out the first interval (warm-up); units come
// from step_units when given; bad arguments are refused by name.
#include <catch2/catch.hpp>

#include "tarantella/callbacks.hpp"
#include "tarantella/check.hpp"

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

// A TimeHistory writing to a temporary file, on a clock that moves only when told.
struct Harness {
  std::FILE* file = std::tmpfile();
  double clock = 1000.0;
  tnt::TimeHistory history;

  Harness(int64_t batch_size, int64_t log_steps, tnt::TimeHistoryOptions options = {})
      : history(batch_size, log_steps, with_clock(std::move(options))) {
    REQUIRE(file != nullptr);
  }
  ~Harness() { std::fclose(file); }
  tnt::TimeHistoryOptions with_clock(tnt::TimeHistoryOptions options) {
    options.out = file;
    options.clock = [this] { return clock; };
    return options;
  }
  // One training step that ends `seconds` after the previous event.
  void step(double seconds) {
    clock += seconds;
    history.on_train_batch_end(0, {});
  }
  std::vector<std::string> lines() const {
    std::fflush(file);
    std::rewind(file);
    std::string text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) text.append(buf, n);
    std::fseek(file, 0, SEEK_END);
    std::vector<std::string> out;
    std::string cur;
    for (char c : text) {
      if (c == '\n') {
        out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
  }
};

tnt::TimeHistoryOptions options(std::string unit, std::function<double()> step_units = {}) {
  tnt::TimeHistoryOptions o;
  o.unit = std::move(unit);
  o.step_units = std::move(step_units);
  return o;
}

}  // namespace

TEST_CASE("TimeHistory: the rate of each interval and the average without the first, exactly") {
  // Global batch 32, a line every 2 steps; two epochs of 3 steps with 10 s between them
  // (an evaluation) that must not count.
  Harness h(32, 2, options("images"));
  h.history.on_train_begin({});
  h.history.on_epoch_begin(0, {});
  h.step(0.5);   // step 1
  h.step(0.5);   // step 2: interval 1 = 1 s, 64 images -> 64/s
  h.step(0.25);  // step 3
  h.history.on_epoch_end(0, {});
  h.clock += 10.0;  // validation, checkpoints: not training
  h.history.on_epoch_begin(1, {});
  h.step(0.25);  // step 4: interval 2 = steps 3-4, 0.5 s, 64 images -> 128/s
  h.step(0.125);
  h.step(0.125);  // step 6: interval 3 = steps 5-6, 0.25 s -> 256/s
  h.history.on_epoch_end(1, {});
  h.history.on_train_end({});

  const std::vector<std::string> want{
      "TimeHistory: steps 1-2: 64.0 images/s (64 images in 1.000 s)",
      "TimeHistory: steps 3-4: 128.0 images/s (64 images in 0.500 s)",
      "TimeHistory: steps 5-6: 256.0 images/s (64 images in 0.250 s)",
      // Steps 3-6: 128 images in 0.75 s = 170.666... images/s.
      "TimeHistory: 170.7 images/s on average over steps 3-6 (128 images in 0.750 s; steps 1-2 left out as warm-up)"};
  CHECK(h.lines() == want);
  const auto& iv = h.history.intervals();
  REQUIRE(iv.size() == 3);
  CHECK(iv[0].first_step == 1);
  CHECK(iv[0].last_step == 2);
  CHECK(iv[0].seconds == 1.0);
  CHECK(iv[0].rate() == 64.0);
  CHECK(iv[1].rate() == 128.0);
  CHECK(iv[2].rate() == 256.0);
  const tnt::TimeHistory::Interval a = h.history.after_warmup();
  CHECK(a.first_step == 3);
  CHECK(a.last_step == 6);
  CHECK(a.units == 128.0);
  CHECK(a.seconds == 0.75);
}

TEST_CASE("TimeHistory: step_units counts each step's own units; an unfinished interval counts in the average") {
  // Real tokens, not the batch: 100, 60, 40, 20 tokens in steps of 0.25 s, a line per step.
  std::vector<double> tokens{100, 60, 40, 20};
  size_t next = 0;
  Harness h(999, 1, options("tokens", [&] { return tokens.at(next++); }));
  h.history.on_train_begin({});
  h.history.on_epoch_begin(0, {});
  for (int i = 0; i < 4; ++i) h.step(0.25);
  h.history.on_train_end({});
  const std::vector<std::string> lines = h.lines();
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == "TimeHistory: steps 1-1: 400.0 tokens/s (100 tokens in 0.250 s)");
  CHECK(lines[1] == "TimeHistory: steps 2-2: 240.0 tokens/s (60 tokens in 0.250 s)");
  CHECK(lines[3] == "TimeHistory: steps 4-4: 80.0 tokens/s (20 tokens in 0.250 s)");
  // Steps 2-4: 120 tokens in 0.75 s.
  CHECK(lines[4] == "TimeHistory: 160.0 tokens/s on average over steps 2-4 (120 tokens in 0.750 s; steps 1-1 left "
                    "out as warm-up)");

  // log_steps 4 over 6 steps: the average takes steps 5-6, though no line was printed for them.
  Harness g(8, 4);
  g.history.on_train_begin({});
  g.history.on_epoch_begin(0, {});
  for (int i = 0; i < 6; ++i) g.step(0.5);
  g.history.on_train_end({});
  const std::vector<std::string> glines = g.lines();
  REQUIRE(glines.size() == 2);
  CHECK(glines[0] == "TimeHistory: steps 1-4: 16.0 examples/s (32 examples in 2.000 s)");
  CHECK(glines[1] == "TimeHistory: 16.0 examples/s on average over steps 5-6 (16 examples in 1.000 s; steps 1-4 "
                     "left out as warm-up)");
}

TEST_CASE("TimeHistory: steps go on over fit() calls; a run within the warm-up has no average") {
  Harness h(4, 3);
  for (int fit = 0; fit < 2; ++fit) {
    h.history.on_train_begin({});
    h.history.on_epoch_begin(fit, {});
    h.step(1.0);
    h.step(1.0);
    h.history.on_train_end({});
  }
  const std::vector<std::string> lines = h.lines();
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "TimeHistory: no average yet: the 2 steps trained so far are the first interval of 3 (warm-up, "
                    "left out); train more steps than log_steps");
  // The second fit's first step completes the interval begun in the first.
  CHECK(lines[1] == "TimeHistory: steps 1-3: 4.0 examples/s (12 examples in 3.000 s)");
  CHECK(lines[2] == "TimeHistory: 4.0 examples/s on average over steps 4-4 (4 examples in 1.000 s; steps 1-3 left "
                    "out as warm-up)");
}

TEST_CASE("TimeHistory: bad arguments are refused by name") {
  CHECK_THROWS_WITH(tnt::TimeHistory(32, 0), Catch::Contains("log_steps=0"));
  CHECK_THROWS_WITH(tnt::TimeHistory(0, 10), Catch::Contains("batch_size=0"));
  CHECK_THROWS_AS(tnt::TimeHistory(32, 10, options("")), tnt::InputError);
  // With step_units the batch size is not needed.
  CHECK_NOTHROW(tnt::TimeHistory(0, 10, options("examples", [] { return 1.0; })));
}
