// The TensorBoard callback (callbacks.hpp): event files through io/tensorboard, written by
// the master; the profile through the timeline recorder, started when training starts and
// merged into its file as soon as its window has passed, so that a long run's profile can be
// looked at while it trains on.
#include "core/clock.hpp"
#include "io/tensorboard.hpp"
#include "io/timeline.hpp"
#include "tarantella/log.hpp"
#include "tarantella/callbacks.hpp"
#include "tarantella/check.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/model.hpp"
#include "tarantella/runtime.hpp"
#include "tarantella/timeline.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <limits>

namespace tnt {

struct TensorBoard::Writers {
  io::EventFileWriter train, validation;
  Writers(const std::string& dir) : train(dir + "/train"), validation(dir + "/validation") {}
};

namespace {

// The name of a profile's run directory, as Keras' profiler names it: the local time.
std::string profile_run_name() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y_%m_%d_%H_%M_%S", &tm);
  return buf;
}

std::string steps_text(int64_t first, int64_t last) {
  return first == last ? fmt::format("step {}", first) : fmt::format("steps {}-{}", first, last);
}

}  // namespace

TensorBoard::TensorBoard(std::string log_dir, int64_t update_freq, std::string profile_batch)
    : Callback(Ranks::all), log_dir_(std::move(log_dir)), update_freq_(update_freq) {
  TNT_INPUT_CHECK(!log_dir_.empty(), "TensorBoard: log_dir is empty");
  TNT_INPUT_CHECK(update_freq_ >= 0, "TensorBoard: update_freq={} must be 0 (per epoch) or a number of steps",
                  update_freq_);
  std::string window = profile_batch;
  window.erase(std::remove_if(window.begin(), window.end(), [](unsigned char c) { return std::isspace(c); }),
               window.end());
  std::replace(window.begin(), window.end(), ',', '-');
  if (!window.empty() && window != "0" && window != "0-0") {
    std::tie(profile_first_, profile_last_) =
        parse_step_window(window, fmt::format("TensorBoard profile_batch '{}'", profile_batch));
  } else {
    profile_ = Profile::done;
  }
}

TensorBoard::~TensorBoard() = default;

std::string TensorBoard::train_file() const { return writers_ ? writers_->train.path() : std::string(); }
std::string TensorBoard::validation_file() const { return writers_ ? writers_->validation.path() : std::string(); }

// A resumed run (initial_epoch > 0) redoes the epochs after its checkpoint: the points the
// run before it wrote there go from the earlier event files (TensorBoard would otherwise
// draw both runs' points at each such epoch, as history.csv's rows are cut back too).
// Epoch points at steps >= initial_epoch and batch points after the global step go.
void TensorBoard::prune_resumed_events() {
  std::vector<std::string> skipped;
  int64_t removed = 0;
  // Epoch points from initial_epoch on; batch points only after a training position the
  // model has (a checkpoint's step: weights loaded alone start at step 0, and the earlier
  // run's batch points are not redone then).
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  // Inside an epoch (a checkpoint's position there), that epoch's point is redone as well.
  const bool inside = model_->checkpoint_epoch_step() > 0;
  const int64_t first_epoch = params_.initial_epoch > 0 || inside ? params_.initial_epoch : kNone;
  const int64_t last_step = model_->global_step() > 0 ? model_->global_step() : kNone;
  for (const char* sub : {"/train", "/validation"}) {
    removed += io::prune_events_after(log_dir_ + sub, first_epoch, last_step, &skipped);
  }
  if (removed > 0) {
    log_info("TensorBoard: removed {} point(s) after epoch {}{} from the event files in '{}' (training resumes "
             "there)",
             removed, params_.initial_epoch,
             last_step != kNone ? fmt::format(" and step {}", last_step) : std::string(), log_dir_);
  }
  for (const std::string& s : skipped) log_warning("TensorBoard: event file {}", s);
}

void TensorBoard::on_train_begin(const Logs&) {
  held_epoch_ = -1;  // held by a fit that ended by an exception: the resume redoes that epoch
  held_train_.clear();
  // The master makes the files; every rank learns whether it could (and fails alike).
  std::string error;
  if (is_master_rank() && !writers_) {
    try {
      // A resumed run (at an epoch, or inside one: a training position).
      if (params_.initial_epoch > 0 || model_->global_step() > 0) prune_resumed_events();
      writers_ = std::make_unique<Writers>(log_dir_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  communicator().broadcast(error, master_rank());
  if (!error.empty()) TNT_INPUT_ERROR("{}", error);

  if (profile_ != Profile::pending) return;
  // The window counts the steps this callback trains (Keras' profile_batch counts the
  // batches of its fit): a resumed run profiles its own steps.
  if (profile_base_ < 0) profile_base_ = model_->global_step();
  const int64_t first = profile_base_ + profile_first_, last = profile_base_ + profile_last_;
  if (timeline::Recorder* other = timeline::current()) {
    // Every rank sees the same recorder (TNT_TIMELINE reaches every rank alike).
    if (is_master_rank())
      log_warning("TensorBoard: the profile of {} is not recorded into '{}': a timeline is already recording "
                  "(TNT_TIMELINE or tarantella --timeline, or start_timeline) into '{}', steps {}-{}, and a run "
                  "records one timeline; unset TNT_TIMELINE to have the profile in the TensorBoard directory",
                  steps_text(first, last), log_dir_ + "/train/plugins/profile/", other->path(), other->first_step(),
                  other->last_step());
    profile_ = Profile::done;
    return;
  }
  // The master names the run (hosts' clocks may differ by a second) and makes its directory
  // before any rank opens its part of the trace there.
  std::string run = is_master_rank() ? profile_run_name() : std::string();
  communicator().broadcast(run, master_rank());
  const std::string dir = log_dir_ + "/train/plugins/profile/" + run;
  error.clear();
  if (is_master_rank()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) error = fmt::format("TensorBoard: cannot create '{}' for the profile: {}", dir, ec.message());
  }
  communicator().broadcast(error, master_rank());
  if (!error.empty()) TNT_INPUT_ERROR("{}", error);
  profile_path_ = dir + "/timeline.trace.json";
  if (start_timeline(profile_path_, first, last)) profile_ = Profile::recording;
}

void TensorBoard::on_train_batch_begin(int64_t, const Logs&) {
  // The recorder stopped recording when this step began (timeline::step_begin comes before
  // the hooks), so no span of this step holds it: it can be merged and let go now.
  if (profile_ == Profile::recording && model_->global_step() >= profile_base_ + profile_last_) finish_profile();
}

void TensorBoard::finish_profile() {
  profile_ = Profile::done;
  stop_timeline();  // collective: the master writes the file
  profile_file_ = profile_path_;
  const int64_t last = std::min(profile_base_ + profile_last_, model_->global_step());
  if (is_master_rank())
    print("TensorBoard: the timeline of {} is in {} (open it in https://ui.perfetto.dev or chrome://tracing)",
          steps_text(profile_base_ + profile_first_, last), profile_file_);
}

bool TensorBoard::writers_here() {
  // Made at on_train_begin by the master; a rank that became the master since (parameter-
  // server training that lost its first worker) makes them now, in the same directory.
  if (!writers_ && !takeover_failed_ && model_ && is_master_rank()) {
    try {
      writers_ = std::make_unique<Writers>(log_dir_);
    } catch (const std::exception& e) {
      takeover_failed_ = true;
      log_warning("TensorBoard: this rank took over as the master and cannot write the event files: {}", e.what());
    }
  }
  return writers_ != nullptr;
}

void TensorBoard::on_train_batch_end(int64_t, const Logs& logs) {
  if (update_freq_ <= 0 || !writers_here()) return;
  const int64_t step = model_->global_step();
  if (step % update_freq_ == 0) {
    std::vector<std::pair<std::string, double>> values;
    for (const auto& [name, value] : logs) values.emplace_back("batch_" + name, value);
    writers_->train.scalars(step, values);
  }
  // A live TensorBoard sees the batch points within seconds (the writer keeps whole records
  // until a flush): at most every kBatchFlushSeconds, checked each step.
  if (const double now = detail::now_s(); now - last_flush_s_ >= kBatchFlushSeconds) {
    writers_->train.flush();
    last_flush_s_ = now;
  }
}

void TensorBoard::on_epoch_end(int epoch, const Logs& logs) {
  if (!writers_here()) return;
  std::vector<std::pair<std::string, double>> train, validation;
  for (const auto& [name, value] : logs) {
    if (name.rfind("val_", 0) == 0) {
      validation.emplace_back("epoch_" + name.substr(4), value);
    } else {
      train.emplace_back("epoch_" + name, value);
    }
  }
  const EpochTiming& t = model_->last_epoch_timing();
  if (t.steps > 0) {
    train.emplace_back("epoch_step_time_ms", t.step_seconds * 1e3);
    // The ranks' own micro-batches (distribute_dataset=false, as resnet50 trains): their sum.
    const int64_t batch = params_.batch_size > 0 ? params_.batch_size : t.global_batch;
    if (t.job_samples_per_second > 0) {  // parameter servers: each worker's rate, summed
      train.emplace_back("epoch_samples_per_second", t.job_samples_per_second);
    } else if (batch > 0 && t.step_seconds > 0) {
      train.emplace_back("epoch_samples_per_second", static_cast<double>(batch) / t.step_seconds);
    }
    if (size() > 1) train.emplace_back("epoch_hidden_communication", t.hidden_fraction());
    // What every other rank waited a step for the slowest (train/rank_balance.hpp).
    if (size() > 1 && t.slowest_rank >= 0) {
      train.emplace_back("epoch_rank_lag_ms", (t.slowest_own_seconds - t.typical_own_seconds) * 1e3);
    }
  }
  // An epoch that a stop on request (SIGUSR1, a batch system's warning) cut short: if a
  // checkpoint is saved there, the run that resumes it writes its point, for all its steps
  // (written here as well, TensorBoard would plot two points at that epoch). Whether one is
  // is known at the end of training (ModelCheckpoint may come after this callback).
  if (model_->stopped_on_request() && model_->partial_epoch_steps() > 0) {
    held_epoch_ = epoch;
    held_train_ = std::move(train);
    writers_->train.flush();
    return;
  }
  writers_->train.scalars(epoch, train);
  if (!validation.empty()) writers_->validation.scalars(epoch, validation);
  writers_->train.flush();
  writers_->validation.flush();
}

void TensorBoard::on_train_end(const Logs&) {
  if (held_epoch_ >= 0 && writers_ && model_->last_checkpoint_step() != model_->global_step()) {
    writers_->train.scalars(held_epoch_, held_train_);  // no checkpoint: nothing resumes it
  }
  held_epoch_ = -1;
  held_train_.clear();
  if (writers_) {
    writers_->train.flush();
    writers_->validation.flush();
  }
  if (profile_ != Profile::recording) return;
  timeline::Recorder* r = timeline::current();
  if (r && r->last_step_seen() >= r->first_step()) {
    finish_profile();  // the window, or what training reached of it
    return;
  }
  // Not reached: no empty trace is written. The next fit() with this callback (a program
  // that trains in a loop of fit() calls) starts the recorder again and may reach it.
  timeline::discard();
  profile_ = Profile::pending;
  communicator().barrier();  // every rank's part is gone: the run's directory is empty
  if (is_master_rank()) {
    // Empty directories only (remove() leaves one that holds anything).
    std::error_code ec;
    std::filesystem::path dir = std::filesystem::path(profile_path_).parent_path();
    for (int up = 0; up < 3 && std::filesystem::remove(dir, ec); ++up) dir = dir.parent_path();
  }
  if (is_master_rank())
    log_warning("TensorBoard: the profile of {} is not recorded (yet): training has run through step {}; a later "
                "fit() with this callback records it if it gets there",
                steps_text(profile_base_ + profile_first_, profile_base_ + profile_last_), model_->global_step());
}

}  // namespace tnt
