// Callbacks with the Keras hooks. The logs a callback sees are GLOBAL: the training loop
// allreduces each rank's sums before calling any hook, so every rank sees the same values.
// A callback runs on the master (default: progress output, which goes to every rank with
// TNT_OUTPUT_ON_ALL_DEVICES), on the master alone whatever that setting (files: ranks
// writing one path would race, and append twice), or on all ranks (anything that changes
// what training does next: EarlyStopping, LearningRateScheduler, TerminateOnNaN — otherwise
// ranks would disagree and the job would hang).
#pragma once

#include "tarantella/tensor.hpp"

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tnt {

class Model;

// Metric name -> value, e.g. {"loss", 0.31}, {"accuracy", 0.89}, {"val_loss", ...}.
using Logs = std::map<std::string, double>;

// What fit() tells callbacks before training starts.
struct TrainParams {
  int epochs = 0;           // last epoch index + 1
  int total_epochs = 0;     // FitOptions::total_epochs: the whole run's, when fit runs in pieces; 0: epochs
  int initial_epoch = 0;
  int64_t steps = 0;        // steps per epoch
  int64_t max_steps = 0;    // FitOptions::max_steps: training ends at this global step; 0 = none
  int64_t batch_size = 0;   // GLOBAL batch size; 0 when the ranks' own micro-batches are used
  int verbose = 1;
  std::vector<std::string> metrics;  // names in display order
  bool validates = false;            // fit has validation data (some epochs may skip it: validation_freq)
};

// What fit() (before a validation pass) or evaluate() tells callbacks before on_test_begin.
struct EvalParams {
  int64_t steps = -1;       // global batches; -1 unknown
  int64_t batch_size = 0;   // GLOBAL batch size; 0 unknown (the ranks' own micro-batches)
  int64_t samples = -1;     // samples evaluated; -1 unknown
  int verbose = 0;          // evaluate()'s verbose (fit's validation: fit's)
};

class Callback {
 public:
  // master: rank 0, or every rank with TNT_OUTPUT_ON_ALL_DEVICES (console output).
  // master_only: rank 0 and no other, whatever the output setting (files). all: every rank.
  enum class Ranks { master, master_only, all };
  explicit Callback(Ranks ranks = Ranks::master) : ranks_(ranks) {}
  virtual ~Callback() = default;

  Ranks ranks() const { return ranks_; }
  void set_model(Model* model) { model_ = model; }
  void set_params(const TrainParams& params) { params_ = params; }
  void set_eval_params(const EvalParams& params) { eval_params_ = params; }

  virtual void on_train_begin(const Logs&) {}
  // Parameter-server training that lost its first worker goes on with the next one as its
  // master: a callback that runs on the master starts there in the middle of the fit, at
  // epoch `epoch` (0-based; the epochs before it are done), where its on_train_begin never
  // ran. Default: on_train_begin. CSVLogger appends to the rows the lost master wrote.
  virtual void on_train_takeover(int /*epoch*/, const Logs& logs) { on_train_begin(logs); }
  virtual void on_train_end(const Logs&) {}
  virtual void on_epoch_begin(int /*epoch*/, const Logs&) {}
  virtual void on_epoch_end(int /*epoch*/, const Logs&) {}
  virtual void on_train_batch_begin(int64_t /*batch*/, const Logs&) {}
  virtual void on_train_batch_end(int64_t /*batch*/, const Logs&) {}
  // An evaluation: fit's validation pass, or evaluate(). Batch logs are empty (metrics are
  // summed over the ranks once, at the end); on_test_end gets the global results.
  virtual void on_test_begin(const Logs&) {}
  virtual void on_test_batch_end(int64_t /*batch*/, const Logs&) {}
  virtual void on_test_end(const Logs&) {}

 protected:
  Ranks ranks_;
  Model* model_ = nullptr;
  TrainParams params_;
  EvalParams eval_params_;
};

using CallbackPtr = std::shared_ptr<Callback>;

// Epoch-end logs of a fit, returned by Model::fit.
class History : public Callback {
 public:
  History() : Callback(Ranks::all) {}
  void on_train_begin(const Logs&) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  std::vector<int> epochs;
  std::map<std::string, std::vector<double>> history;
  // Last value of a metric; throws if it was never logged.
  double last(const std::string& name) const;
};

// Keras-style progress: "12/469 [=>....] - ETA: 8s - loss: 0.5120 - accuracy: 0.8210",
// redrawn in place on a terminal and cut to its width (the terminal's, else COLUMNS, else
// 80; on a dumb terminal, TERM=dumb, cleared with spaces rather than ESC[K). When stdout is
// not a terminal nothing is redrawn: a line at each tenth of the epoch and one at its end.
// verbose 0: nothing, 1: bar, 2: a line per epoch. The bar counts the steps that will run
// (fewer with FitOptions::max_steps). An evaluation is announced ("Evaluating on 10000
// samples (157 steps, global batch 64)") and has a bar of its own; the epoch line gives the
// training time per step ("23ms/step", "350us/step" under a millisecond), evaluation apart. On SIGINT or SIGTERM
// the bar stops drawing and its line is ended, then the signal does what it did before (by
// default: the program ends). With output on all ranks (TNT_OUTPUT_ON_ALL_DEVICES=1, several
// ranks) each line starts with the rank's tag ("[rank 1] ", output_tag()) and nothing is
// redrawn even on a terminal: several ranks' bars on one line would overwrite each other.
//
// A long phase is never silent: where nothing is redrawn (verbose 2, or not a terminal), a
// line with the count, the time so far and the ETA comes at least every quiet_seconds of
// training or evaluation, however slow the steps (a CPU rank of ResNet-50 at 224x224 takes
// seconds a step). The epoch line counts the epochs the run will do: with a step limit
// (FitOptions::max_steps) the last is the one where the limit falls ("Epoch 1/1 (20 of 5004
// steps: the run stops at step 20)"), and a program that calls fit in pieces gives the
// whole run's epochs (FitOptions::total_epochs), so the count goes on from piece to piece.
struct ProgressBarOptions {
  std::FILE* out = stdout;
  std::function<double()> clock;  // seconds; empty: a steady clock (tests pass their own)
  // The longest a phase goes without a line where nothing is redrawn; 0: no such lines.
  // 15 s: a person watching a log sees the run moving, and a log of a day's run at one
  // line per 15 s stays readable (about 6,000 lines).
  double quiet_seconds = 15.0;
};

class ProgressBar : public Callback {
 public:
  explicit ProgressBar(ProgressBarOptions options = {});
  ~ProgressBar() override;
  void on_train_begin(const Logs&) override;
  void on_train_end(const Logs&) override;
  void on_epoch_begin(int epoch, const Logs&) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_test_begin(const Logs&) override;
  void on_test_batch_end(int64_t batch, const Logs& logs) override;
  void on_test_end(const Logs& logs) override;
  // What the bar decided about its output (after on_train_begin or on_test_begin).
  bool redraws() const { return tty_; }
  int width() const { return width_; }

 private:
  double now() const;
  void detect_output();
  void catch_signals(bool on);
  // timed_only: verbose 2, a line only when quiet_seconds passed without one.
  // skipped: of `done`, steps run before this process (a resumed epoch's): not in the rate.
  void draw(int64_t done, int64_t total, double start, const std::string& metrics, bool timed_only = false,
            int64_t skipped = 0);
  void end_line();
  void write(const std::string& text);
  std::string metrics_text(const Logs& logs, bool include_val) const;

  ProgressBarOptions options_;
  bool tty_ = false;
  bool ansi_ = true;            // the terminal clears a line's end (ESC[K); not TERM=dumb
  size_t drawn_ = 0;            // the length of the bar's line drawn in place
  int width_ = 80;
  std::string tag_;             // output_tag(), before each line
  bool in_fit_ = false;
  bool catching_ = false;
  bool owns_handler_ = false;   // this bar installed the signal handler (not another bar)
  int64_t steps_done_ = 0;
  int64_t steps_skipped_ = -1;  // a resumed epoch's steps run before (its first batch); -1: none yet
  int64_t epoch_steps_ = 0;     // the steps this epoch will run
  double epoch_start_ = 0;
  double train_seconds_ = 0;    // the epoch's training steps (evaluation apart)
  double last_draw_ = 0;
  int64_t next_line_ = 0;       // not a terminal: the step of the next progress line
  double eval_start_ = 0;
  double eval_seconds_ = -1;    // the epoch's evaluation; -1: none
  int64_t eval_steps_done_ = 0;
  double last_line_ = 0;        // when the last line was written
  int last_epoch_ = 0;          // the epoch count shown ("Epoch k/last_epoch_")
};

// Appends one row per epoch to a CSV file: epoch, then the logged metrics (sorted, each as its shortest exact text).
// The header is written when the file is created (append=false, or the file is new). Only
// the master writes it, even with TNT_OUTPUT_ON_ALL_DEVICES. append=true continues the file
// of a run resumed at fit's initial_epoch: rows of later epochs (written before the crash,
// about to be redone) and a line cut short are removed first, the file replaced atomically;
// a file that does not begin with the header this logger writes, or whose columns are not
// the ones set with set_columns, is refused; a missing one is a warning (the history then
// starts at the resumed epoch). The file is made when the first epoch ends (a run that ends
// sooner leaves none); fit checks at its start that it can be written, and refuses a
// dangling symbolic link (the rows would create a file where it points) and a path that is
// not a regular file. A row that cannot be written (a full disk) throws tnt::Error.
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::string path, bool append = false);
  ~CSVLogger() override;
  void on_train_begin(const Logs&) override;
  void on_train_takeover(int epoch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs&) override;
  // Columns fixed up front (else: taken from the first epoch's logs).
  void set_columns(std::vector<std::string> columns) { columns_ = std::move(columns); }

 private:
  std::string path_;
  bool append_;
  std::vector<std::string> columns_;
  std::FILE* file_ = nullptr;  // opened at the first row
  bool header_written_ = false;
  bool open_ = false;      // inside fit
  bool truncate_ = false;  // the first row replaces the file (append == false)
  bool created_ = false;   // this run made (or emptied) the file: a failed first row removes it
  bool wrote_row_ = false;
  // An epoch that a stop on request cut short: its row waits for the end of training (the
  // run that resumes its checkpoint writes it, for all its steps).
  int held_epoch_ = -1;
  Logs held_logs_;
  void write_row(int epoch, const Logs& logs);
};

enum class MonitorMode { automatic, min, max };

// Saves a checkpoint (weights, optimizer state, epoch, step) after each epoch (an epoch that
// max_steps cut short as unfinished: see Model::partial_epoch_steps), written by
// the master atomically. path may hold Keras' fields: {epoch} (1-based; two digits when
// plain), {epoch:03d}, and any value fit logs, {loss:.4f}, {val_accuracy:.3f} (a validation
// value of an epoch without validation: "none", with a warning); "{{" and "}}" are braces.
// fit refuses, before its first epoch, a field it will not log, a format that does not fit
// it, and a directory that does not exist or cannot be written. With
// save_best_only, only when the monitored global metric improved. It runs on every rank
// (the save is collective, so a failed write stops every rank, not only the master). Weights
// or optimizer state holding a NaN or an infinity are never written (Model::save_checkpoint
// throws on every rank instead), so the last good checkpoint survives a diverged epoch.
class ModelCheckpoint : public Callback {
 public:
  ModelCheckpoint(std::string path, std::string monitor = "val_loss", bool save_best_only = false,
                  MonitorMode mode = MonitorMode::automatic);
  void on_train_begin(const Logs&) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  // The file for epoch `epoch` (0-based): path's fields filled in.
  std::string path_for(int epoch, const Logs& logs) const;
  const std::string& last_path() const { return last_path_; }

 private:
  std::string path_, monitor_, last_path_;
  bool save_best_only_;
  MonitorMode mode_;
  double best_;
  bool have_best_ = false;
};

// Stops training when the monitored metric has not improved by min_delta for patience
// epochs. Runs on every rank (the metric is global, so all ranks stop together).
// restore_best_weights: the weights (parameters and buffers) at the end of the best epoch
// are kept, and put back at the end of training, whether it stopped early or ran all its
// epochs (Keras restores only when it stopped; a run that ended on a worse epoch wants the
// best one just as much). Every rank keeps its own copy, so every rank restores the same
// parameters (BatchNorm's statistics, local to each rank, come back as that rank had them).
class EarlyStopping : public Callback {
 public:
  EarlyStopping(std::string monitor = "val_loss", double min_delta = 0.0, int patience = 0,
                MonitorMode mode = MonitorMode::automatic, bool restore_best_weights = false);
  void on_train_begin(const Logs&) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs&) override;
  int stopped_epoch() const { return stopped_epoch_; }
  int best_epoch() const { return best_epoch_; }  // 0-based; -1 before the metric was seen

 private:
  std::string monitor_;
  double min_delta_;
  int patience_;
  MonitorMode mode_;
  bool restore_best_weights_;
  double best_ = 0;
  bool have_best_ = false;
  int best_epoch_ = -1;
  int wait_ = 0;
  int stopped_epoch_ = -1;
  std::vector<Tensor> best_weights_;  // named_parameters() then named_buffers(), on their devices
};

// Keras' ReduceLROnPlateau: once the monitored metric has not improved by min_delta for
// patience epochs, the learning rate is multiplied by factor (in (0, 1)), never below min_lr;
// then cooldown epochs pass before epochs without improvement count again. It composes with
// the optimizer's schedule as a factor on top of it (Optimizer::set_lr_factor): a warmup or
// a decay keeps its shape, scaled by factor^k after k reductions, floored at min_lr; a
// reduction is made only while the current rate is above min_lr. The history's
// "learning_rate" is the rate each epoch trained with (Keras' "lr"), so a reduction at the
// end of epoch k shows in the row of epoch k + 1. Runs on every rank: the metric is global
// (allreduced, equal on every rank), so every rank reduces at the same epoch. The factor
// is in the model's checkpoints, so a resumed run keeps the reduced rate (the callback's own
// patience and best value start afresh, as in Keras).
// Bad arguments are an InputError naming the argument.
class ReduceLROnPlateau : public Callback {
 public:
  ReduceLROnPlateau(std::string monitor = "val_loss", double factor = 0.1, int patience = 10, double min_delta = 1e-4,
                    int cooldown = 0, double min_lr = 0.0, MonitorMode mode = MonitorMode::automatic);
  void on_train_begin(const Logs&) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  int reductions() const { return reductions_; }  // made in this fit

 private:
  std::string monitor_;
  double factor_;
  int patience_;
  double min_delta_;
  int cooldown_;
  double min_lr_;
  MonitorMode mode_;
  double best_ = 0;
  bool have_best_ = false;
  int wait_ = 0;
  int cooldown_left_ = 0;
  int reductions_ = 0;
};

// Sets the optimizer's learning rate at the start of every epoch from fn(epoch, current lr).
class LearningRateScheduler : public Callback {
 public:
  explicit LearningRateScheduler(std::function<double(int, double)> fn);
  void on_epoch_begin(int epoch, const Logs&) override;

 private:
  std::function<double(int, double)> fn_;
};

// Stops training as soon as the (global) loss is NaN or infinite, as Keras' TerminateOnNaN,
// or at an epoch's end when a parameter is (which a finite loss can hide: see on_epoch_end).
// Action::stop (Keras' behaviour): fit() returns after that step; the epoch's end hooks
// still run. Action::raise: fit() throws tnt::Error right away, naming the step, the epoch
// and the loss, before any end-of-epoch hook (a checkpoint, a history row) sees the diverged
// model; a program then ends with a non-zero exit (the training programs in models/ use it).
// It runs on every rank, and every rank sees the same allreduced loss, so all stop (or
// throw) at the same step. A model with dynamic loss scaling (fp16) is left to its
// LossScaler, which skips overflowing steps and fails when the scale underflows.
class TerminateOnNaN : public Callback {
 public:
  enum class Action { stop, raise };
  explicit TerminateOnNaN(Action action = Action::stop) : Callback(Ranks::all), action_(action) {}
  void on_epoch_begin(int epoch, const Logs&) override { epoch_ = epoch; }
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  // After each epoch: a parameter holding a NaN or an infinity (with a finite loss: bad
  // input data, hidden by ReLU) stops or raises the same way, naming the parameter.
  void on_epoch_end(int epoch, const Logs& logs) override;
  // The global step (1-based, as Model::global_step() after it) that stopped training; -1
  // while none did.
  int64_t stopped_step() const { return stopped_step_; }

 private:
  Action action_;
  int epoch_ = 0;
  int64_t stopped_step_ = -1;
};

// Keras' TensorBoard callback: event files that TensorBoard reads, in log_dir/train and
// log_dir/validation (events.out.tfevents.<time>.<host>). After each epoch, at step = epoch
// (0-based, as Keras): "epoch_<name>" for every logged metric (the val_ ones in validation/,
// without the prefix), and in train/ also epoch_step_time_ms (mean training step),
// epoch_samples_per_second (global batch / step time, when the global batch is known) and,
// with more than one rank, epoch_hidden_communication (the fraction of gradient
// communication hidden behind backward, as the "x% hidden" line). update_freq = N > 0 adds
// "batch_<name>" every N training steps (at the global step). Written by the master only,
// flushed after every epoch: a crash leaves the whole records of the epochs before it. A
// resumed run (fit's initial_epoch > 0) first removes from the earlier files in the same
// directories the points it will write again (epochs from initial_epoch on, batch points
// after its global step), as CSVLogger cuts its rows back, so each epoch has one point.
//
// profile_batch "a,b" (also "a-b" or "a"; "" or "0": none), as Keras' profile_batch: a
// timeline (the recorder of tarantella/timeline.hpp, Chrome's trace format) of training steps
// a..b, counted from 1 at the first step this callback trains (a resumed run profiles its
// own second step, not the run's; later fit() calls with the same callback go on counting,
// and the window is recorded once). It goes where Keras' profiler puts its traces, so that
// a user looks for it there: log_dir/train/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/
// timeline.trace.json (open it in https://ui.perfetto.dev or chrome://tracing). The file is
// written as soon as the window closes (when the step after it begins, or training ends), and
// the master prints where it is. A timeline already recording when training starts
// (TNT_TIMELINE, tarantella --timeline, or start_timeline) wins: the run records one
// timeline, the one asked for from outside the program; the master then warns that the
// profile is not written and names the file that has the steps instead.
// Runs on every rank (the timeline and the directory check are collective).
class TensorBoard : public Callback {
 public:
  explicit TensorBoard(std::string log_dir, int64_t update_freq = 0, std::string profile_batch = "");
  ~TensorBoard() override;
  void on_train_begin(const Logs&) override;
  void on_train_batch_begin(int64_t batch, const Logs& logs) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs&) override;
  // The event files (the master's; empty elsewhere and before training).
  std::string train_file() const;
  std::string validation_file() const;
  // The profile's trace once written (every rank knows the path); empty before, or when
  // none was recorded.
  const std::string& profile_file() const { return profile_file_; }

 private:
  struct Writers;
  void finish_profile();
  std::string log_dir_;
  int64_t update_freq_;
  int64_t profile_first_ = 0, profile_last_ = 0;  // the window as given; 0: none
  int64_t profile_base_ = -1;  // global steps trained before this callback's first fit
  enum class Profile { pending, recording, done } profile_ = Profile::pending;
  std::string profile_path_, profile_file_;
  std::unique_ptr<Writers> writers_;
  bool takeover_failed_ = false;  // a new master (parameter servers) could not open the files
  // An epoch a stop on request cut short: written at on_train_end unless a checkpoint was
  // saved there (its resume writes the epoch whole). -1: none.
  int held_epoch_ = -1;
  std::vector<std::pair<std::string, double>> held_train_;
  static constexpr double kBatchFlushSeconds = 2.0;
  double last_flush_s_ = 0;  // with update_freq: the batch points' last flush
  bool writers_here();            // the master's writers, made by a new master on first use
  void prune_resumed_events();    // the master, before its writers: a resumed run's redone points
};

// The TF Model Garden's TimeHistory: the global training rate (examples, images or tokens
// per second of all ranks together), printed every log_steps training steps for the steps
// since the last line, and at the end of each fit() the average over the run so far without
// its first log_steps steps (warm-up: the first steps allocate, tune and fill pipelines).
//   TimeHistory: steps 101-200: 1234.5 examples/s (6400 examples in 5.184 s)
//   TimeHistory: 1250.2 examples/s on average over steps 101-1000 (...; steps 1-100 left out as warm-up)
// A step's time runs from the end of the step before it in the same epoch, or from the
// epoch's beginning for its first step, to its end: it includes waiting for input, but not
// what happens between epochs (validation, checkpoints), so an interval spanning an epoch's
// end is not slowed by the evaluation. Steps are counted over the fit() calls of one
// callback (a program that calls fit() in a loop keeps one) and named by Model's global step.
// The units of a step: batch_size (the GLOBAL batch), or what options.step_units returns
// (for example the real tokens of a batch without its padding; it is called on the ranks this
// callback runs on, right after the step, and must not be collective). Runs on the master
// (and every rank with TNT_OUTPUT_ON_ALL_DEVICES, each line tagged). The numbers stay in
// intervals() for a program to keep or write elsewhere. Bad arguments are an InputError.
struct TimeHistoryOptions {
  std::string unit = "examples";             // the word in the lines: examples, images, tokens
  std::function<double()> step_units;        // the units of the step just ended; empty: batch_size
  std::FILE* out = stdout;
  std::function<double()> clock;             // seconds; empty: a steady clock (tests pass their own)
};

class TimeHistory : public Callback {
 public:
  struct Interval {
    int64_t first_step = 0, last_step = 0;  // global steps, inclusive
    double seconds = 0;
    double units = 0;
    double rate() const { return seconds > 0 ? units / seconds : 0.0; }
  };
  TimeHistory(int64_t batch_size, int64_t log_steps, TimeHistoryOptions options = {});
  void on_train_begin(const Logs&) override;
  void on_epoch_begin(int epoch, const Logs&) override;
  void on_train_batch_end(int64_t batch, const Logs&) override;
  void on_train_end(const Logs&) override;
  // Every interval printed so far, in order.
  const std::vector<Interval>& intervals() const { return intervals_; }
  // The steps after the first log_steps (the warm-up), through the last step so far; its
  // seconds are 0 while there are none.
  Interval after_warmup() const { return after_warmup_; }

 private:
  double now() const;
  void write(const std::string& line);

  int64_t batch_size_, log_steps_;
  TimeHistoryOptions options_;
  int64_t steps_ = 0;       // steps seen, over all fit() calls
  int64_t step_number_ = 0; // the global step of the last one
  bool have_ref_ = false;
  double ref_ = 0;          // the end of the last step, or the epoch's beginning
  Interval open_;           // the interval being measured
  Interval warmup_;         // the first log_steps steps
  Interval after_warmup_;
  std::vector<Interval> intervals_;
};

// Whether `current` improves on `best` for metric `name` (mode automatic: "acc"/"accuracy"
// in the name means higher is better, otherwise lower).
bool metric_improved(const std::string& name, MonitorMode mode, double current, double best, double min_delta);

}  // namespace tnt
