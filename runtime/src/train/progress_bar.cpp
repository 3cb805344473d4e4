// The progress bar (tarantella/callbacks.hpp: ProgressBar): Keras' bar on the master's
// terminal, redrawn in place, or lines at each tenth of an epoch when the output is a file or
// pipe; its line is ended by a stop signal before the signal does what it did without a bar.
#include "tarantella/callbacks.hpp"

#include "core/clock.hpp"
#include "train/callback_list.hpp"
#include "tarantella/check.hpp"
#include "tarantella/config.hpp"
#include "tarantella/log.hpp"
#include "tarantella/model.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>

namespace tnt {

namespace {

using detail::now_s;

// A step's time as Keras gives it: "12ms/step", and "350us/step" below a millisecond.
std::string per_step_text(double ms) {
  if (ms > 0 && ms < 0.9995) return fmt::format("{:.0f}us/step", ms * 1000);
  return fmt::format("{:.0f}ms/step", ms);
}

std::string format_duration(double s) {
  // Whole seconds in 64 bits: an ETA of a huge evaluation (10^11 samples) overflowed int.
  if (!(s < 1e15)) return s > 0 ? std::string("a very long time") : std::string("?");
  const auto t = static_cast<int64_t>(s);
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
  if (s >= 60) return fmt::format("{}:{:02d}", t / 60, t % 60);
  return fmt::format("{:.0f}s", s);
}

}  // namespace


namespace {

// The bar's line on a terminal, for the signal handler: the one process-wide state here,
// as a handler can reach nothing else. Set while a ProgressBar redraws in place.
volatile std::sig_atomic_t g_bar_fd = -1;
volatile std::sig_atomic_t g_bar_line_open = 0;   // a bar drawn, its line not ended
volatile std::sig_atomic_t g_bar_interrupted = 0; // a stop signal came: draw no more
const void* g_bar_line_owner = nullptr;           // the bar that drew the open line (not for the handler)
struct sigaction g_old_sigint, g_old_sigterm;

// Ends the bar's line (async-signal-safe: write only), then gives the signal to what
// handled it before the bar: by default that ends the process, as without a bar.
void on_stop_signal(int sig, siginfo_t* info, void* context) {
  g_bar_interrupted = 1;
  if (g_bar_line_open && g_bar_fd >= 0) {
    const ssize_t n = ::write(g_bar_fd, "\n", 1);
    (void)n;
    g_bar_line_open = 0;
  }
  const struct sigaction& old = sig == SIGINT ? g_old_sigint : g_old_sigterm;
  ::sigaction(sig, &old, nullptr);
  if (old.sa_flags & SA_SIGINFO) {
    old.sa_sigaction(sig, info, context);
  } else if (old.sa_handler == SIG_DFL) {
    ::raise(sig);  // blocked in this handler: delivered, with the default action, on return
  } else if (old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
  }
}

// The width of the terminal behind fd; 0 when it is none or does not say.
int terminal_columns(int fd) {
  struct winsize ws {};
  if (fd >= 0 && ::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 0;
}

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions options) : Callback(Ranks::master), options_(std::move(options)) {
  if (!options_.out) options_.out = stdout;
}

ProgressBar::~ProgressBar() {
  // Its line still open: an exception left fit (a collective's timeout, a bad batch), and
  // its message is about to be printed. On a terminal it would follow the bar on its line.
  if (g_bar_line_owner == this && g_bar_line_open) {
    g_bar_line_open = 0;
    std::fputs("\n", options_.out);
    std::fflush(options_.out);
  }
  if (g_bar_line_owner == this) g_bar_line_owner = nullptr;
  catch_signals(false);
}

double ProgressBar::now() const { return options_.clock ? options_.clock() : now_s(); }

void ProgressBar::detect_output() {
  // Under mpirun a rank's stdout is a pseudo-terminal even when the user's is a file or a
  // pipe, so the launcher tells the ranks what the user's stdout is.
  const int fd = ::fileno(options_.out);
  if (const char* v = std::getenv(env::stdout_is_tty)) {
    tty_ = std::string(v) == "1";
  } else {
    tty_ = fd >= 0 && isatty(fd) == 1;
  }
  // A rank's pseudo-terminal has no size; COLUMNS (which the launcher passes on) has it.
  width_ = terminal_columns(fd);
  if (width_ == 0) {
    const char* c = std::getenv("COLUMNS");
    width_ = c ? std::atoi(c) : 0;
  }
  if (width_ <= 0) width_ = 80;
  // A dumb terminal (TERM=dumb: an editor's shell buffer, some CI logs) shows ESC[K as
  // text: the bar's line is cleared with spaces instead.
  const char* term = std::getenv("TERM");
  ansi_ = term == nullptr || std::strcmp(term, "dumb") != 0;
  tag_ = output_tag();
  if (!tag_.empty()) tty_ = false;
}

void ProgressBar::catch_signals(bool on) {
  if (on == catching_) return;
  if (on) {
    auto ours = [](int sig) {
      struct sigaction current {};
      return ::sigaction(sig, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
             current.sa_sigaction == on_stop_signal;
    };
    if (ours(SIGINT) || ours(SIGTERM)) {
      // Another bar (a user's, beside fit's own) has the handler: one is enough, and a
      // second would save the first as "what was there before" and call itself.
      catching_ = true;
      owns_handler_ = false;
      return;
    }
    owns_handler_ = true;
    g_bar_interrupted = 0;
    g_bar_line_open = 0;
    g_bar_fd = ::fileno(options_.out);
    struct sigaction sa {};
    sa.sa_sigaction = on_stop_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &g_old_sigint);
    ::sigaction(SIGTERM, &sa, &g_old_sigterm);
    // A program that ignores them keeps ignoring them.
    if (g_old_sigint.sa_handler == SIG_IGN) ::sigaction(SIGINT, &g_old_sigint, nullptr);
    if (g_old_sigterm.sa_handler == SIG_IGN) ::sigaction(SIGTERM, &g_old_sigterm, nullptr);
  } else if (owns_handler_) {
    struct sigaction current {};
    // Give back what was there, unless the handler already did (the signal came).
    if (::sigaction(SIGINT, nullptr, &current) == 0 && current.sa_sigaction == on_stop_signal) {
      ::sigaction(SIGINT, &g_old_sigint, nullptr);
    }
    if (::sigaction(SIGTERM, nullptr, &current) == 0 && current.sa_sigaction == on_stop_signal) {
      ::sigaction(SIGTERM, &g_old_sigterm, nullptr);
    }
    g_bar_fd = -1;
    g_bar_line_open = 0;
  }
  catching_ = on;
}

void ProgressBar::write(const std::string& text) {
  // Without redrawing, each write is one whole line.
  std::fputs((tag_ + text).c_str(), options_.out);
  std::fflush(options_.out);
  last_line_ = now();
}

void ProgressBar::end_line() {
  if (!g_bar_line_open || !tty_) return;
  g_bar_line_open = 0;
  // The finished line replaces the bar.
  std::string clear = "\r";
  if (ansi_) {
    clear += "\033[K";
  } else {
    clear.append(drawn_, ' ');
    clear += '\r';
  }
  write(clear);
  drawn_ = 0;
}

void ProgressBar::on_train_begin(const Logs&) {
  detect_output();
  in_fit_ = true;
  catch_signals(tty_ && params_.verbose == 1);
}

void ProgressBar::on_train_end(const Logs&) {
  end_line();
  in_fit_ = false;
  catch_signals(false);
}

void ProgressBar::on_epoch_begin(int epoch, const Logs& logs) {
  epoch_start_ = now();
  last_draw_ = 0;
  steps_done_ = 0;
  // Taking over in the middle of an epoch (parameter-server training lost its first worker):
  // this rank's steps and time so far, not a fresh epoch's 0.
  double took_steps = 0, took_seconds = 0, took_first = 0;
  if (auto it = logs.find(detail::kTakeoverStepsKey); it != logs.end()) took_steps = it->second;
  if (auto it = logs.find(detail::kTakeoverSecondsKey); it != logs.end()) took_seconds = it->second;
  if (auto it = logs.find(detail::kTakeoverFirstStepKey); it != logs.end()) took_first = it->second;
  // An epoch resumed inside goes on at this step (its bar counts from there).
  int64_t resumed = 0;
  if (auto it = logs.find(detail::kResumedStepKey); it != logs.end()) resumed = static_cast<int64_t>(it->second);
  // A resumed epoch's earlier steps count as done (an epoch resumed at its last step, to run
  // its validation, ends "10/10", not "0/10"), not as run here (the rate).
  steps_done_ = resumed;
  steps_skipped_ = resumed > 0 ? resumed : -1;
  train_seconds_ = 0;
  eval_seconds_ = -1;
  epoch_steps_ = params_.steps;
  if (params_.max_steps > 0 && model_) {
    // Training ends at global step max_steps: this epoch runs at most what is left of it.
    const int64_t left = std::max<int64_t>(params_.max_steps - model_->global_step(), 0);
    epoch_steps_ = epoch_steps_ > 0 ? std::min(epoch_steps_, resumed + left) : resumed + left;
  }
  if (took_steps > 0) {
    steps_done_ = static_cast<int64_t>(took_steps);
    steps_skipped_ = static_cast<int64_t>(took_first);  // the rate: this process's steps over its time
    epoch_start_ -= took_seconds;
    train_seconds_ = took_seconds;
  }
  next_line_ = 0;
  if (params_.verbose == 0) return;
  if (epoch == params_.initial_epoch || last_epoch_ == 0) {
    // The epochs this run will do: up to the whole run's last (fit in pieces), or to the
    // one where the step limit falls, when the epoch's steps are known.
    last_epoch_ = std::max(params_.total_epochs, params_.epochs);
    if (params_.max_steps > 0 && params_.steps > 0 && model_) {
      const int64_t left = std::max<int64_t>(params_.max_steps - model_->global_step(), 0);
      // This epoch (what a resume left of it), then whole epochs.
      const int64_t after = std::max<int64_t>(left - std::max<int64_t>(params_.steps - resumed, 0), 0);
      const int64_t epochs_left = 1 + (after + params_.steps - 1) / params_.steps;
      last_epoch_ = static_cast<int>(std::min<int64_t>(last_epoch_, epoch + epochs_left));
    }
  }
  std::string limit;
  if (params_.steps > 0 && epoch_steps_ < params_.steps) {
    limit = fmt::format(" ({} of {} steps: the run stops at step {})", epoch_steps_, params_.steps, params_.max_steps);
  }
  write(fmt::format("Epoch {}/{}{}\n", epoch + 1, std::max(last_epoch_, epoch + 1), limit));
}

std::string ProgressBar::metrics_text(const Logs& logs, bool include_val) const {
  // Keras' order: the loss, then the metrics; then the validation's loss and metrics.
  // (Logs is sorted by name, so the metrics come alphabetically.)
  std::string out;
  auto part = [&](bool val) {
    const std::string loss = val ? "val_loss" : "loss";
    if (auto it = logs.find(loss); it != logs.end()) out += fmt::format(" - {}: {:.4f}", loss, it->second);
    for (const auto& [k, v] : logs) {
      if ((k.rfind("val_", 0) == 0) != val || k == loss) continue;
      if (k == "learning_rate" || k == "seconds" || k.rfind("staleness_", 0) == 0) continue;
      out += fmt::format(" - {}: {:.4f}", k, v);
    }
  };
  part(false);
  // Parameter-server training: how many updates the workers' pulls were ahead of the
  // slowest worker (ps/parameter_server.cpp), in updates, not to 4 decimals.
  if (auto mean = logs.find("staleness_mean"), max = logs.find("staleness_max"); mean != logs.end() && max != logs.end()) {
    out += fmt::format(" - staleness: mean {:.1f}, max {:.0f}", mean->second, max->second);
  }
  if (include_val) part(true);
  return out;
}

// "done/total [====>.....] - ETA: 8s<metrics>". On a terminal: redrawn in place, at most 10
// times a second, never wider than the terminal (a wrapped line could not be redrawn).
// Otherwise: a line of its own at each tenth of the total (none for fewer than 10 steps,
// whose end line comes soon enough), and whenever quiet_seconds passed without a line (the
// only lines at verbose 2, timed_only). total 0: not known (a dataset of unknown size).
void ProgressBar::draw(int64_t done, int64_t total, double start, const std::string& metrics, bool timed_only,
                       int64_t skipped) {
  if (g_bar_interrupted && catching_) return;
  const double t = now();
  const bool lines = !tty_ || timed_only;
  const bool known = total > 0;
  if (!known) total = done;  // as many as have run
  if (!lines) {
    if (done != total && t - last_draw_ < 0.1) return;
  } else {
    if (known && done >= total) return;  // the end line comes next
    bool tenth = false;
    if (!timed_only && known && total >= 10) {
      if (next_line_ == 0) next_line_ = (total + 9) / 10;
      tenth = done >= next_line_;
      while (next_line_ <= done) next_line_ += (total + 9) / 10;
    }
    const bool quiet = options_.quiet_seconds > 0 && t - last_line_ >= options_.quiet_seconds;
    if (!tenth && !quiet) return;
  }
  last_draw_ = t;
  const double elapsed = t - start;
  if (lines && !known) {
    write(fmt::format("{} - {}{}\n", done == 1 ? std::string("1 step") : fmt::format("{} steps", done),
                      format_duration(elapsed), metrics));
    return;
  }
  const int64_t ran = done - skipped;
  const double eta = ran > 0 ? elapsed / static_cast<double>(ran) * static_cast<double>(total - done) : 0;
  const std::string count = fmt::format("{:>{}}/{}", done, std::to_string(total).size(), total);
  const std::string eta_text = " - ETA: " + format_duration(eta);
  // The bar takes what the counts and the ETA leave, up to 30 characters; the metrics are
  // cut at the terminal's edge. The last column stays empty: some terminals wrap there.
  const int room = width_ - 1 - static_cast<int>(count.size() + 3 + eta_text.size());
  const int bar_width = std::clamp(room, 0, 30);
  std::string line = count;
  if (bar_width >= 5) {
    const int filled = static_cast<int>(bar_width * done / std::max<int64_t>(total, 1));
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < bar_width) bar += '>';
    bar.resize(static_cast<size_t>(bar_width), '.');
    line += " [" + bar + "]";
  }
  line += eta_text + metrics;
  if (lines) {
    write(line + "\n");
    return;
  }
  if (static_cast<int>(line.size()) > width_ - 1) line.resize(static_cast<size_t>(std::max(width_ - 1, 1)));
  // What a longer previous line left is cleared: by ESC[K, or spaces on a dumb terminal.
  if (ansi_) {
    write("\r" + line + "\033[K");
  } else {
    std::string text = "\r" + line;
    if (drawn_ > line.size()) text.append(drawn_ - line.size(), ' ');
    write(text);
  }
  drawn_ = line.size();
  g_bar_line_open = 1;
  g_bar_line_owner = this;
}

void ProgressBar::on_train_batch_end(int64_t batch, const Logs& logs) {
  if (steps_skipped_ < 0) steps_skipped_ = batch;  // 0, or where a resumed epoch goes on
  steps_done_ = batch + 1;
  train_seconds_ = now() - epoch_start_;
  if (params_.verbose == 0) return;
  const int64_t total = epoch_steps_ > 0 ? std::max(epoch_steps_, steps_done_) : 0;  // 0: unknown
  draw(steps_done_, total, epoch_start_, metrics_text(logs, false), params_.verbose >= 2, steps_skipped_);
}

void ProgressBar::on_epoch_end(int, const Logs& logs) {
  if (params_.verbose == 0) return;
  // Steps actually run: fewer than planned when training was stopped mid-epoch. The time
  // per step is that of training alone; an evaluation is reported after it.
  const int64_t total = epoch_steps_ > 0 ? std::max(epoch_steps_, steps_done_) : steps_done_;
  // Over the steps this process ran: a resumed epoch's earlier steps took no time here.
  const int64_t ran = steps_done_ - std::max<int64_t>(steps_skipped_, 0);
  const double per_step_ms = ran > 0 ? train_seconds_ * 1000.0 / static_cast<double>(ran) : 0;
  // An epoch resumed at its end ran no step here: no rate to give.
  std::string line = fmt::format("{}/{} - {} {}{}", steps_done_, total, format_duration(train_seconds_),
                                 ran > 0 ? per_step_text(per_step_ms) : std::string("(no step run: resumed at its end)"),
                                 metrics_text(logs, true));
  if (eval_seconds_ >= 0) line += fmt::format(" - evaluation: {}", format_duration(eval_seconds_));
  end_line();
  write(line + "\n");
}

void ProgressBar::on_test_begin(const Logs&) {
  if (!in_fit_) {
    detect_output();
    params_.verbose = eval_params_.verbose;
    catch_signals(tty_ && params_.verbose == 1);
  }
  eval_start_ = now();
  eval_steps_done_ = 0;
  last_draw_ = 0;
  next_line_ = 0;
  if (params_.verbose == 0) return;
  end_line();
  const EvalParams& e = eval_params_;
  std::string what = e.samples >= 0 ? fmt::format("Evaluating on {} samples", e.samples) : std::string("Evaluating");
  std::vector<std::string> details;
  if (e.steps >= 0) details.push_back(fmt::format("{} step{}", e.steps, e.steps == 1 ? "" : "s"));
  if (e.batch_size > 0) details.push_back(fmt::format("global batch {}", e.batch_size));
  if (!details.empty()) what += fmt::format(" ({})", fmt::join(details, ", "));
  write(what + "\n");
}

void ProgressBar::on_test_batch_end(int64_t batch, const Logs&) {
  eval_steps_done_ = batch + 1;
  if (params_.verbose == 0) return;
  const int64_t total = eval_params_.steps > 0 ? std::max(eval_params_.steps, eval_steps_done_) : 0;  // 0: unknown
  draw(eval_steps_done_, total, eval_start_, "", params_.verbose >= 2);
}

void ProgressBar::on_test_end(const Logs& logs) {
  eval_seconds_ = now() - eval_start_;
  if (params_.verbose == 0) {
    if (!in_fit_) catch_signals(false);
    return;
  }
  end_line();
  if (!in_fit_) {
    // evaluate(): its results here; fit's validation: in the epoch line.
    const double per_step_ms =
        eval_steps_done_ > 0 ? eval_seconds_ * 1000.0 / static_cast<double>(eval_steps_done_) : 0;
    write(fmt::format("{}/{} - {} {}{}\n", eval_steps_done_, eval_steps_done_, format_duration(eval_seconds_),
                      per_step_text(per_step_ms), metrics_text(logs, true)));
    catch_signals(false);
  }
}

}  // namespace tnt
