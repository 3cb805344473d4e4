// The TensorBoard callback (callbacks.hpp): event files through io/tensorboard, written by
// the master; the profile through the timeline recorder.
#include "io/tensorboard.hpp"
#include "tarantella/callbacks.hpp"
#include "tarantella/check.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/model.hpp"
#include "tarantella/runtime.hpp"
#include "tarantella/timeline.hpp"

#include <algorithm>

namespace tnt {

struct TensorBoard::Writers {
  io::EventFileWriter train, validation;
  Writers(const std::string& dir) : train(dir + "/train"), validation(dir + "/validation") {}
};

TensorBoard::TensorBoard(std::string log_dir, int64_t update_freq, std::string profile_batch)
    : Callback(Ranks::all), log_dir_(std::move(log_dir)), update_freq_(update_freq), profile_batch_(std::move(profile_batch)) {
  TNT_INPUT_CHECK(!log_dir_.empty(), "TensorBoard: log_dir is empty");
  TNT_INPUT_CHECK(update_freq_ >= 0, "TensorBoard: update_freq={} must be 0 (per epoch) or a number of steps",
                  update_freq_);
}

TensorBoard::~TensorBoard() = default;

std::string TensorBoard::train_file() const { return writers_ ? writers_->train.path() : std::string(); }
std::string TensorBoard::validation_file() const { return writers_ ? writers_->validation.path() : std::string(); }

void TensorBoard::on_train_begin(const Logs&) {
  // The master makes the files; every rank learns whether it could (and fails alike).
  std::string error;
  if (is_master_rank() && !writers_) {
    try {
      writers_ = std::make_unique<Writers>(log_dir_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  communicator().broadcast(error, master_rank());
  if (!error.empty()) TNT_INPUT_ERROR("{}", error);

  std::string window = profile_batch_;
  std::replace(window.begin(), window.end(), ',', '-');
  if (!window.empty() && window != "0" && window != "0-0") {
    auto [first, last] = parse_step_window(window, "TensorBoard profile_batch");
    own_timeline_ = start_timeline(log_dir_ + "/train/timeline.json", first, last);
  }
}

void TensorBoard::on_train_batch_end(int64_t, const Logs& logs) {
  if (!writers_ || update_freq_ <= 0) return;
  const int64_t step = model_->global_step();
  if (step % update_freq_ != 0) return;
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [name, value] : logs) values.emplace_back("batch_" + name, value);
  writers_->train.scalars(step, values);
}

void TensorBoard::on_epoch_end(int epoch, const Logs& logs) {
  if (!writers_) return;
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
    if (params_.batch_size > 0 && t.step_seconds > 0)
      train.emplace_back("epoch_samples_per_second", static_cast<double>(params_.batch_size) / t.step_seconds);
    if (size() > 1) train.emplace_back("epoch_hidden_communication", t.hidden_fraction());
  }
  writers_->train.scalars(epoch, train);
  if (!validation.empty()) writers_->validation.scalars(epoch, validation);
  writers_->train.flush();
  writers_->validation.flush();
}

void TensorBoard::on_train_end(const Logs&) {
  if (writers_) {
    writers_->train.flush();
    writers_->validation.flush();
  }
  if (own_timeline_) {
    stop_timeline();  // collective: every rank started it
    own_timeline_ = false;
  }
}

}  // namespace tnt
