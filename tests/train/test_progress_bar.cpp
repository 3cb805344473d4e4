// The ProgressBar driven directly, hook by hook, with a clock the test moves: the line fits
// the terminal's width, nothing is redrawn when stdout is not a terminal, the bar counts the
// steps that run, the epoch's time per step is training alone (evaluation reported apart),
// an evaluation is announced, and a stop signal ends the bar's line and then does what it
// did before the bar (a handler of the program's, or the default: the process ends).
#include <catch2/catch.hpp>

#include "tarantella/callbacks.hpp"
#include "train/callback_list.hpp"

#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// Sets an environment variable for one scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    had_ = std::getenv(name) != nullptr;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A ProgressBar writing to a temporary file, on a clock that moves only when told.
struct Harness {
  std::FILE* file = std::tmpfile();
  double clock = 100.0;
  tnt::ProgressBar bar;

  explicit Harness(tnt::TrainParams params)
      : bar(tnt::ProgressBarOptions{file, [this] { return clock; }}) {
    REQUIRE(file != nullptr);
    bar.set_params(params);
  }
  ~Harness() { std::fclose(file); }
  std::string output() const {
    std::fflush(file);
    std::string text;
    std::rewind(file);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) text.append(buf, n);
    std::fseek(file, 0, SEEK_END);  // the bar writes on at the end
    return text;
  }
};

tnt::TrainParams params(int64_t steps, int verbose = 1) {
  tnt::TrainParams p;
  p.epochs = 1;
  p.steps = steps;
  p.verbose = verbose;
  return p;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : text) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

// What a terminal would show of each redraw: the text between carriage returns, without
// the erase-to-end-of-line sequence.
std::vector<std::string> redraws(const std::string& text) {
  std::vector<std::string> out;
  for (std::string part : split(text, '\r')) {
    for (size_t at; (at = part.find("\033[K")) != std::string::npos;) part.erase(at, 3);
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

const tnt::Logs kLongLogs{{"loss", 0.5}, {"accuracy", 0.25}, {"top5_accuracy", 0.75}, {"loss_scale", 65536.0}};

int g_program_handler_calls = 0;
void program_handler(int) { ++g_program_handler_calls; }

}  // namespace

TEST_CASE("on a terminal the bar is redrawn in place and never wider than the terminal") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  for (int columns : {40, 60, 200}) {
    ScopedEnv cols("COLUMNS", std::to_string(columns).c_str());
    Harness h(params(200));
    h.bar.on_train_begin({});
    CHECK(h.bar.redraws());
    CHECK(h.bar.width() == columns);
    h.bar.on_epoch_begin(0, {});
    for (int64_t b = 0; b < 200; ++b) {
      h.clock += 1.0;
      h.bar.on_train_batch_end(b, kLongLogs);
    }
    h.bar.on_epoch_end(0, kLongLogs);
    h.bar.on_train_end({});
    const std::string out = h.output();
    std::vector<std::string> drawn = redraws(out);
    REQUIRE(drawn.size() >= 200);  // "Epoch 1/1\n", then one redraw per step (a second apart)
    size_t bars = 0;
    for (size_t i = 1; i + 1 < drawn.size(); ++i) {
      INFO("COLUMNS=" << columns << ", redraw " << i << ": '" << drawn[i] << "'");
      CHECK(static_cast<int>(drawn[i].size()) <= columns - 1);
      if (drawn[i].find(" [") != std::string::npos) ++bars;
    }
    // The bar proper (30 characters) appears when there is room for it, with the counts.
    if (columns == 200) {
      CHECK(bars == drawn.size() - 2);
      CHECK(out.find("100/200 [===============>..............] - ETA: 1:40 - loss: 0.5000 - accuracy: 0.2500") !=
            std::string::npos);
    }
    // 40 columns: a bar of 17, the metrics cut at the edge.
    if (columns == 40) CHECK(out.find("\r100/200 [========>........] - ETA: 1:40\033[K") != std::string::npos);
    // The epoch's line replaces the bar and ends with a newline.
    CHECK(out.substr(out.size() - 1) == "\n");
    CHECK(drawn.back().rfind("200/200 - 3:20 1000ms/step - loss: 0.5000 - accuracy: 0.2500", 0) == 0);
  }
}

TEST_CASE("on a terminal, a bar left by an exception out of fit ends its line, so the error starts on its own") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  ScopedEnv cols("COLUMNS", "80");
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  double clock = 100.0;
  {
    tnt::ProgressBar bar(tnt::ProgressBarOptions{file, [&] { return clock; }});
    bar.set_params(params(10));
    bar.on_train_begin({});
    bar.on_epoch_begin(0, {});
    clock += 1.0;
    bar.on_train_batch_end(0, {{"loss", 1.0}});
  }  // no on_epoch_end, no on_train_end: unwound
  std::fflush(file);
  std::rewind(file);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) out.append(buf, n);
  std::fclose(file);
  REQUIRE(out.find("\r 1/10 [") != std::string::npos);
  CHECK(out.substr(out.size() - 4) == "\033[K\n");
}

TEST_CASE("not on a terminal: no carriage returns, a line at each tenth of the epoch and one at its end") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "0");
  ScopedEnv cols("COLUMNS", nullptr);
  Harness h(params(100));
  h.bar.on_train_begin({});
  CHECK_FALSE(h.bar.redraws());
  CHECK(h.bar.width() == 80);
  h.bar.on_epoch_begin(0, {});
  for (int64_t b = 0; b < 100; ++b) {
    h.clock += 0.5;
    h.bar.on_train_batch_end(b, {{"loss", 1.0}});
  }
  h.bar.on_epoch_end(0, {{"loss", 1.0}});
  h.bar.on_train_end({});
  const std::string out = h.output();
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find('\033') == std::string::npos);
  std::vector<std::string> lines = split(out, '\n');
  REQUIRE(lines.size() == 12);  // Epoch 1/1, 9 progress lines, the epoch's line, "" after the last \n
  CHECK(lines[0] == "Epoch 1/1");
  for (int i = 1; i <= 9; ++i) {
    const std::string count = fmt::format("{:>3}/100 [", 10 * i);
    INFO(lines[static_cast<size_t>(i)]);
    CHECK(lines[static_cast<size_t>(i)].rfind(count, 0) == 0);
  }
  CHECK(lines[5] == " 50/100 [===============>..............] - ETA: 25s - loss: 1.0000");
  CHECK(lines[10] == "100/100 - 50s 500ms/step - loss: 1.0000");
  CHECK(lines[11].empty());
}

TEST_CASE("a resumed epoch: time per step and ETA over the steps this run took, not the epoch's earlier ones") {
  // Resumed at step 75 of 100: 25 steps of 2 s. Before, the epoch line said 50 s / 100 =
  // 500ms/step and the ETA counted the 75 earlier steps as run in no time.
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "0");
  ScopedEnv cols("COLUMNS", nullptr);
  Harness h(params(100));
  h.bar.on_train_begin({});
  h.bar.on_epoch_begin(0, {});
  for (int64_t b = 75; b < 100; ++b) {
    h.clock += 2.0;
    h.bar.on_train_batch_end(b, {{"loss", 1.0}});
  }
  h.bar.on_epoch_end(0, {{"loss", 1.0}});
  h.bar.on_train_end({});
  std::vector<std::string> lines = split(h.output(), '\n');
  REQUIRE(lines.size() >= 5);
  CHECK(lines[1].rfind(" 76/100 [", 0) == 0);  // the first step after the resume is past a tenth
  // The line at step 80: 5 steps in 10 s, 20 left.
  CHECK(lines[2] == " 80/100 [========================>.....] - ETA: 40s - loss: 1.0000");
  CHECK(lines[lines.size() - 2] == "100/100 - 50s 2000ms/step - loss: 1.0000");
}

TEST_CASE("verbose 2: the epoch's line alone") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  Harness h(params(50, 2));
  h.bar.on_train_begin({});
  h.bar.on_epoch_begin(0, {});
  for (int64_t b = 0; b < 50; ++b) {
    h.clock += 0.02;
    h.bar.on_train_batch_end(b, {{"loss", 2.0}});
  }
  h.bar.on_epoch_end(0, {{"loss", 2.0}});
  h.bar.on_train_end({});
  CHECK(h.output() == "Epoch 1/1\n50/50 - 1s 20ms/step - loss: 2.0000\n");
}

TEST_CASE("steps under a millisecond: their time in microseconds, not 0ms/step") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  Harness h(params(50, 2));
  h.bar.on_train_begin({});
  h.bar.on_epoch_begin(0, {});
  for (int64_t b = 0; b < 50; ++b) {
    h.clock += 0.00025;
    h.bar.on_train_batch_end(b, {{"loss", 2.0}});
  }
  h.bar.on_epoch_end(0, {{"loss", 2.0}});
  h.bar.on_train_end({});
  CHECK(h.output() == "Epoch 1/1\n50/50 - 0s 250us/step - loss: 2.0000\n");
}

TEST_CASE("a dumb terminal (TERM=dumb): the bar's line is cleared with spaces, never ESC[K") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  ScopedEnv cols("COLUMNS", "100");
  ScopedEnv term("TERM", "dumb");
  Harness h(params(3));
  h.bar.on_train_begin({});
  h.bar.on_epoch_begin(0, {});
  h.clock += 1.0;
  h.bar.on_train_batch_end(0, {{"loss", 12345.5}});  // a longer line first
  h.clock += 1.0;
  h.bar.on_train_batch_end(1, {{"loss", 0.5}});
  h.clock += 1.0;
  h.bar.on_train_batch_end(2, {{"loss", 0.5}});
  h.bar.on_epoch_end(0, {{"loss", 0.5}});
  h.bar.on_train_end({});
  const std::string out = h.output();
  CHECK(out.find('\033') == std::string::npos);
  const std::vector<std::string> draws = split(out, '\r');
  REQUIRE(draws.size() >= 4);
  // Every redraw covers the text of the one before it (its padding is spaces already): no
  // character of a longer line is left.
  for (size_t i = 2; i + 1 < draws.size(); ++i) {
    INFO(i << ": '" << draws[i] << "' after '" << draws[i - 1] << "'");
    const size_t text = draws[i - 1].find_last_not_of(' ') + 1;
    CHECK(draws[i].size() >= text);
  }
  CHECK(draws[2].size() == draws[1].size());  // the shorter second line, padded to the first's
  const std::string end = "3/3 - 3s 1000ms/step - loss: 0.5000\n";
  REQUIRE(out.size() > end.size());
  CHECK(out.substr(out.size() - end.size()) == end);
}

TEST_CASE("parameter-server training: the staleness seen, in updates, before the validation's results") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  Harness h(params(50, 2));
  h.bar.on_train_begin({});
  h.bar.on_epoch_begin(0, {});
  for (int64_t b = 0; b < 50; ++b) {
    h.clock += 0.02;
    h.bar.on_train_batch_end(b, {{"loss", 2.0}});
  }
  h.bar.on_epoch_end(0, {{"loss", 2.0}, {"staleness_mean", 1.5}, {"staleness_max", 4.0}, {"val_loss", 3.0}});
  h.bar.on_train_end({});
  CHECK(h.output() ==
        "Epoch 1/1\n50/50 - 1s 20ms/step - loss: 2.0000 - staleness: mean 1.5, max 4 - val_loss: 3.0000\n");
}

TEST_CASE("the time per step is the training steps'; an evaluation is announced and timed apart") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "0");
  Harness h(params(4));
  h.bar.on_train_begin({});
  h.bar.on_epoch_begin(0, {});
  for (int64_t b = 0; b < 4; ++b) {
    h.clock += 0.25;
    h.bar.on_train_batch_end(b, {{"loss", 0.5}});
  }
  tnt::EvalParams eval;
  eval.steps = 40;
  eval.batch_size = 250;
  eval.samples = 10000;
  eval.verbose = 1;
  h.bar.set_eval_params(eval);
  h.clock += 1.0;  // between the last step and the evaluation: neither
  h.bar.on_test_begin({});
  for (int64_t b = 0; b < 40; ++b) {
    h.clock += 0.5;
    h.bar.on_test_batch_end(b, {});
  }
  h.bar.on_test_end({{"loss", 0.75}});
  h.clock += 3.0;  // other epoch-end work
  h.bar.on_epoch_end(0, {{"accuracy", 0.25},
                         {"loss", 0.5},
                         {"top5_accuracy", 0.875},
                         {"val_accuracy", 0.375},
                         {"val_loss", 0.75},
                         {"learning_rate", 0.001},
                         {"seconds", 4.5}});
  h.bar.on_train_end({});
  std::vector<std::string> lines = split(h.output(), '\n');
  REQUIRE(lines.size() == 13);
  CHECK(lines[1] == "Evaluating on 10000 samples (40 steps, global batch 250)");
  CHECK(lines[2] == " 4/40 [===>..........................] - ETA: 18s");  // the evaluation's own bar
  CHECK(lines[10] == "36/40 [===========================>..] - ETA: 2s");
  // 4 steps in 1 s: 250 ms/step, not (1 + 1 + 20 + 3) s / 4.
  // Keras' order: the loss first, then the metrics, then the same for the validation.
  CHECK(lines[11] == "4/4 - 1s 250ms/step - loss: 0.5000 - accuracy: 0.2500 - top5_accuracy: 0.8750 - val_loss: 0.7500 "
                     "- val_accuracy: 0.3750 - evaluation: 20s");
}

TEST_CASE("evaluate() alone: the announcement, a bar on a terminal, and a line with its results") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  ScopedEnv cols("COLUMNS", "100");
  Harness h(tnt::TrainParams{});
  tnt::EvalParams eval;
  eval.steps = 3;
  eval.batch_size = 0;
  eval.samples = -1;
  eval.verbose = 1;
  h.bar.set_eval_params(eval);
  h.bar.on_test_begin({});
  CHECK(h.bar.redraws());
  for (int64_t b = 0; b < 3; ++b) {
    h.clock += 2.0;
    h.bar.on_test_batch_end(b, {});
  }
  h.bar.on_test_end({{"loss", 0.125}, {"accuracy", 0.875}});
  const std::string out = h.output();
  CHECK(out.rfind("Evaluating (3 steps)\n\r1/3 [", 0) == 0);
  CHECK(out.find("\r3/3 [==============================] - ETA: 0s\033[K") != std::string::npos);
  const std::string end = "\r\033[K3/3 - 6s 2000ms/step - loss: 0.1250 - accuracy: 0.8750\n";
  REQUIRE(out.size() > end.size());
  CHECK(out.substr(out.size() - end.size()) == end);
}

TEST_CASE("verbose 0 prints nothing, evaluation included") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  Harness h(params(5, 0));
  h.bar.on_train_begin({});
  h.bar.on_epoch_begin(0, {});
  h.bar.on_train_batch_end(0, {{"loss", 1.0}});
  tnt::EvalParams eval;
  eval.steps = 2;
  h.bar.set_eval_params(eval);
  h.bar.on_test_begin({});
  h.bar.on_test_batch_end(0, {});
  h.bar.on_test_end({{"loss", 1.0}});
  h.bar.on_epoch_end(0, {{"loss", 1.0}});
  h.bar.on_train_end({});
  CHECK(h.output().empty());
}

TEST_CASE("a stop signal ends the bar's line, stops the drawing, and reaches the program's own handler") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  ScopedEnv cols("COLUMNS", "80");
  struct sigaction mine {}, before {};
  mine.sa_handler = program_handler;
  sigemptyset(&mine.sa_mask);
  REQUIRE(::sigaction(SIGINT, &mine, &before) == 0);
  g_program_handler_calls = 0;
  {
    Harness h(params(10));
    h.bar.on_train_begin({});
    h.bar.on_epoch_begin(0, {});
    h.clock += 1.0;
    h.bar.on_train_batch_end(0, {{"loss", 1.0}});
    REQUIRE(std::raise(SIGINT) == 0);
    CHECK(g_program_handler_calls == 1);
    const std::string at_signal = h.output();
    CHECK(at_signal.substr(at_signal.size() - 4) == "\033[K\n");  // the bar's line, ended
    for (int64_t b = 1; b < 5; ++b) {
      h.clock += 1.0;
      h.bar.on_train_batch_end(b, {{"loss", 1.0}});
    }
    CHECK(h.output() == at_signal);  // no more drawing
    h.bar.on_train_end({});
  }
  struct sigaction now {};
  REQUIRE(::sigaction(SIGINT, nullptr, &now) == 0);
  CHECK(now.sa_handler == program_handler);  // the program's handler is back
  ::sigaction(SIGINT, &before, nullptr);
}

TEST_CASE("two bars at once (a user's beside fit's own): the signal reaches the program's handler once") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  struct sigaction mine {}, before {}, term_before {};
  mine.sa_handler = program_handler;
  sigemptyset(&mine.sa_mask);
  REQUIRE(::sigaction(SIGINT, &mine, &before) == 0);
  REQUIRE(::sigaction(SIGTERM, nullptr, &term_before) == 0);  // the test framework's
  g_program_handler_calls = 0;
  {
    Harness first(params(10)), second(params(10));
    first.bar.on_train_begin({});
    second.bar.on_train_begin({});
    first.bar.on_epoch_begin(0, {});
    first.clock += 1.0;
    first.bar.on_train_batch_end(0, {{"loss", 1.0}});
    REQUIRE(std::raise(SIGINT) == 0);
    CHECK(g_program_handler_calls == 1);
    second.bar.on_train_end({});
    first.bar.on_train_end({});
  }
  struct sigaction now {};
  REQUIRE(::sigaction(SIGINT, nullptr, &now) == 0);
  CHECK(now.sa_handler == program_handler);
  // Without a signal: each bar's end leaves the program's handler in place.
  {
    Harness first(params(10)), second(params(10));
    first.bar.on_train_begin({});
    second.bar.on_train_begin({});
    second.bar.on_train_end({});
    first.bar.on_train_end({});
  }
  REQUIRE(::sigaction(SIGINT, nullptr, &now) == 0);
  CHECK(now.sa_handler == program_handler);
  struct sigaction term {};
  REQUIRE(::sigaction(SIGTERM, nullptr, &term) == 0);
  CHECK(term.sa_handler == term_before.sa_handler);
  ::sigaction(SIGINT, &before, nullptr);
}

TEST_CASE("without a handler of the program's, SIGINT still ends the process, its bar's line ended") {
  ScopedEnv tty("TNT_STDOUT_IS_TTY", "1");
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGINT, SIG_DFL);
    double clock = 0;
    tnt::ProgressBar bar(tnt::ProgressBarOptions{file, [&clock] { return clock; }});
    bar.set_params(params(10));
    bar.on_train_begin({});
    bar.on_epoch_begin(0, {});
    clock += 1;
    bar.on_train_batch_end(0, {{"loss", 1.0}});
    std::raise(SIGINT);
    std::_Exit(3);  // not reached: the default action ends the process
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
  std::rewind(file);
  std::string text;
  char buf[1024];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) text.append(buf, n);
  std::fclose(file);
  CHECK(text.rfind("Epoch 1/1\n\r 1/10 [", 0) == 0);
  CHECK(text.substr(text.size() - 4) == "\033[K\n");
}

// A phase with slow steps is never silent where nothing is redrawn: at verbose 2 (one line
// an epoch, the programs' default) and when not on a terminal, a line comes once 15 s have
// passed without one, for training and for an evaluation alike. (Before: nothing between
// "Epoch 1/1" and the epoch's end, 47 s for 20 steps of ResNet-50 on a CPU.)
TEST_CASE("slow steps: a line at least every quiet_seconds where nothing is redrawn") {
  for (const char* tty : {"1", "0"}) {
    for (int verbose : {1, 2}) {
      if (std::string(tty) == "1" && verbose == 1) continue;  // redrawn in place: never silent
      INFO("tty " << tty << ", verbose " << verbose);
      ScopedEnv env("TNT_STDOUT_IS_TTY", tty);
      Harness h(params(8, verbose));  // fewer than 10 steps: no tenth lines
      h.bar.on_train_begin({});
      h.bar.on_epoch_begin(0, {});
      for (int64_t b = 0; b < 8; ++b) {
        h.clock += 6.0;  // 48 s in all: lines at 18 s (step 3), 36 s (step 6)
        h.bar.on_train_batch_end(b, {{"loss", 1.0}});
      }
      tnt::EvalParams eval;
      eval.steps = 4;
      eval.verbose = verbose;
      h.bar.set_eval_params(eval);
      h.bar.on_test_begin({});
      for (int64_t b = 0; b < 4; ++b) {
        h.clock += 10.0;  // lines at 20 s (step 2), 40 s would be the end: its own line
        h.bar.on_test_batch_end(b, {});
      }
      h.bar.on_test_end({{"loss", 1.0}});
      h.bar.on_epoch_end(0, {{"loss", 1.0}, {"val_loss", 1.0}});
      h.bar.on_train_end({});
      const std::vector<std::string> lines = split(h.output(), '\n');
      REQUIRE(lines.size() >= 6);
      CHECK(lines[0] == "Epoch 1/1");
      CHECK(lines[1].rfind("3/8 [", 0) == 0);
      CHECK(lines[1].find("ETA: 30s - loss: 1.0000") != std::string::npos);
      CHECK(lines[2].rfind("6/8 [", 0) == 0);
      CHECK(lines[3] == "Evaluating (4 steps)");
      CHECK(lines[4].rfind("2/4 [", 0) == 0);
      CHECK(lines[5].rfind("8/8 - 48s 6000ms/step", 0) == 0);
    }
  }
  // quiet_seconds = 0: the old behaviour, nothing but the epoch's lines.
  ScopedEnv env("TNT_STDOUT_IS_TTY", "0");
  std::FILE* file = std::tmpfile();
  double clock = 0;
  {
    tnt::ProgressBar bar(tnt::ProgressBarOptions{file, [&clock] { return clock; }, 0.0});
    bar.set_params(params(8, 2));
    bar.on_train_begin({});
    bar.on_epoch_begin(0, {});
    for (int64_t b = 0; b < 8; ++b) {
      clock += 60.0;
      bar.on_train_batch_end(b, {{"loss", 1.0}});
    }
    bar.on_epoch_end(0, {{"loss", 1.0}});
    bar.on_train_end({});
  }
  std::rewind(file);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, file);
  std::fclose(file);
  CHECK(std::string(buf, n) == "Epoch 1/1\n8/8 - 8:00 60000ms/step - loss: 1.0000\n");
}

TEST_CASE("a bar that takes over in the middle of an epoch counts the steps and time already done") {
  // Parameter-server training that lost its first worker: the next one's bar starts in the
  // epoch; before, its line read "0/512 - 0s 0ms/step".
  Harness h(params(512, 2));
  h.bar.on_train_takeover(0, {});
  h.bar.on_epoch_begin(0, {{tnt::detail::kTakeoverStepsKey, 500.0},
                           {tnt::detail::kTakeoverSecondsKey, 25.0},
                           {tnt::detail::kTakeoverFirstStepKey, 0.0}});
  h.clock += 1.0;
  h.bar.on_epoch_end(0, {{"loss", 0.5}});
  h.bar.on_train_end({});
  const std::string out = h.output();
  INFO(out);
  CHECK(out.find("500/512 - 25s 50ms/step - loss: 0.5000") != std::string::npos);
  // Steps after the takeover count with those before it (not 26 s over the 2 steps after it:
  // 13000 ms/step), and so do a resumed epoch's: 100 steps this process did not run.
  for (const double first : {0.0, 100.0}) {
    Harness more(params(512, 2));
    more.bar.on_train_takeover(0, {});
    more.bar.on_epoch_begin(0, {{tnt::detail::kTakeoverStepsKey, 500.0},
                                {tnt::detail::kTakeoverSecondsKey, 25.0},
                                {tnt::detail::kTakeoverFirstStepKey, first}});
    more.clock += 1.0;
    more.bar.on_train_batch_end(500, {{"loss", 0.5}});
    more.clock += 1.0;
    more.bar.on_train_batch_end(501, {{"loss", 0.5}});
    more.bar.on_epoch_end(0, {{"loss", 0.5}});
    const std::string text = more.output();
    INFO(text);
    // 27 s over 502 steps, or over the 402 this process ran.
    CHECK(text.find(first == 0 ? "502/512 - 27s 54ms/step" : "502/512 - 27s 67ms/step") != std::string::npos);
  }
  // An epoch that begins plainly starts from nothing.
  Harness plain(params(512, 2));
  plain.bar.on_train_begin({});
  plain.bar.on_epoch_begin(0, {});
  plain.clock += 2.0;
  plain.bar.on_train_batch_end(0, {{"loss", 0.5}});
  plain.bar.on_epoch_end(0, {{"loss", 0.5}});
  CHECK(plain.output().find("1/512 - 2s 2000ms/step") != std::string::npos);
}
