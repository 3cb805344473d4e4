// Loss and metric sums of one pass (an epoch of fit, or an evaluation) on this rank, and
// their global values: what train_step and test_step add to and the loops log.
#pragma once

#include "comm/agreement.hpp"
#include "step/step_scalars.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/loss.hpp"
#include "tarantella/metrics.hpp"
#include "tarantella/model.hpp"
#include "tarantella/runtime.hpp"
#include "train/batch_sources.hpp"  // rows

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace tnt::detail {

// The real units of a step (loss.hpp): samples, or for a token-level loss the real tokens,
// counted from the batch's host target column when it has one, so that no device read is
// needed (the count goes into an allreduce before the loss, so it cannot wait for the step's
// one readback at the end).
// batch_target: the batch's own target column; device_target: the step's copy of it.
inline int64_t step_units(const Loss& loss, const Tensor& batch_target, const Tensor& device_target, int64_t real) {
  if (!loss.normalizes_by_tokens() || loss.one_unit_per_sample(device_target.shape())) return real;
  if (real == 0) return 0;
  return loss.count_tokens(rows(batch_target.device().is_cpu() ? batch_target : device_target, real));
}

// Metric names are the keys of the logs beside the loss: one used twice, or one of the keys
// fit logs itself, would put one value under another's name (a metric named "loss" replaced
// the loss that EarlyStopping and ModelCheckpoint watch). Refused, naming it.
inline void check_metric_names(const std::vector<MetricPtr>& metrics) {
  std::vector<std::string> seen;
  for (const auto& m : metrics) {
    const std::string name = m->name();
    TNT_INPUT_CHECK(!name.empty(), "Model::compile: a metric has an empty name");
    TNT_INPUT_CHECK(name != "loss" && name != "learning_rate" && name != "seconds" && name != "loss_scale" &&
                        name.rfind("val_", 0) != 0,
                    "Model::compile: a metric is named '{}', a key the training logs use themselves (loss, "
                    "learning_rate, seconds, loss_scale, val_*); give it another name",
                    name);
    // A line break would split the history's header and progress lines.
    TNT_INPUT_CHECK(std::none_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }),
                    "Model::compile: a metric's name holds a control character (a line break, a tab): '{}'; give it "
                    "a name of printable characters",
                    name);
    TNT_INPUT_CHECK(std::find(seen.begin(), seen.end(), name) == seen.end(),
                    "Model::compile: two metrics are named '{}': their values would share one key of the logs; give "
                    "each its own name",
                    name);
    seen.push_back(name);
  }
}

// Loss and metric sums of one pass (an epoch of fit, or an evaluation) on this rank;
// global() sums them over the ranks, so every log line is the global value.
//
// A step's device results (the loss, the metrics' counts, label checks, the loss scaler's
// overflow flag) are words of scalars() (step/step_scalars.hpp), read back once when the
// step calls finish_step(). A bad label found there is kept, and global() raises it on every
// rank (its allreduce carries a flag; the message comes from the rank(s) that found it).
class PassTotals {
 public:
  // restore: give the metric objects back the totals they had before (an evaluation inside
  // fit must not disturb the epoch's training metrics). device: the model's.
  PassTotals(const std::vector<MetricPtr>& metrics, bool restore, Device device, InputStager* staging = nullptr)
      : metrics_(metrics), restore_(restore), scalars_(device), staging_(staging) {
    for (auto& m : metrics_) {
      saved_.push_back(m->sums());
      m->reset();
    }
  }
  ~PassTotals() {
    if (!restore_) return;
    for (size_t i = 0; i < metrics_.size(); ++i) metrics_[i]->set_sums(saved_[i]);
  }
  PassTotals(const PassTotals&) = delete;
  PassTotals& operator=(const PassTotals&) = delete;

  StepScalars& scalars() { return scalars_; }
  InputStager* staging() const { return staging_; }

  // pred, target: (b, ...), of which the first `real` rows count; the metrics' counts arrive
  // at finish_step(). loss: the step's loss tensor, times `factor` its rows' summed loss.
  // units: what the loss averages over (samples; tokens for a token-level loss).
  void add(const Tensor& pred, const Tensor& target, int64_t real, const Tensor& loss, double factor, int64_t units) {
    if (real == 0) return;
    if (loss.device() == scalars_.device() && loss.dtype() == DType::f32 && loss.numel() == 1) {
      scalars_.read_f32(loss, [this, factor](double v) { loss_sum_ += v * factor; });
    } else {
      loss_sum_ += Loss::value(loss) * factor;  // a loss of the user's that returns something else
    }
    for (auto& m : metrics_) m->update(rows(pred, real), rows(target, real));
    samples_ += static_cast<double>(units);
  }

  // The step's one readback; its consumers add the loss and the counts.
  void finish_step() {
    const std::string problem = scalars_.flush();
    if (!problem.empty() && error_.empty()) error_ = problem;
  }

  // Collective: {"loss": global mean loss, <metric>: global value}.
  Logs global() const {
    const std::vector<double> all = communicator().allreduce_sum(sums());
    stop_agreed_ = all[3] > 0;
    stop_training_agreed_ = all[4] > 0;
    if (stop_training_agreed_) stop_training_ = false;
    last_global_ = all;
    return logs_of(all, true);
  }
  // The global sums of the last global(): what a checkpoint inside the epoch keeps, so that a
  // run resumed there logs the whole epoch (carry).
  const std::vector<double>& last_global() const { return last_global_; }
  // A run resumed inside an epoch: the epoch's global sums before the checkpoint (its
  // last_global()), counted once (by the master) in every global() of this pass. False, and
  // nothing carried, when they are not sums of these metrics (another count of values).
  bool carry(const std::vector<double>& global_sums) {
    if (global_sums.size() != sums().size()) return false;
    carried_ = global_sums;
    carried_[2] = carried_[3] = carried_[4] = 0;  // the error and stop flags are each step's own
    return true;
  }
  // After global(): some rank asked for a stop after this step (tnt::request_stop_after_step).
  bool stop_agreed() const { return stop_agreed_; }
  // Model::stop_training() from a callback on some ranks only (the master's): this rank asks
  // for it with the next global(), and every rank stops after that step.
  void request_stop_training() { stop_training_ = true; }
  bool stop_training_pending() const { return stop_training_; }
  bool stop_training_agreed() const { return stop_training_agreed_; }
  // This rank's own values: a parameter-server worker's steps, which wait for no other.
  Logs local() const { return logs_of(sums(), false); }
  // What global()'s allreduce moves.
  int64_t global_bytes() const { return static_cast<int64_t>(sizeof(double) * sums().size()); }

 private:
  // sums(): loss, samples, error flag, stop-after-step flag, stop_training flag, then the
  // metrics' sums.
  static constexpr std::ptrdiff_t kCounts = 5;
  std::vector<double> sums() const {
    std::vector<double> sums{loss_sum_, samples_, error_.empty() ? 0.0 : 1.0, stop_after_step_requested() ? 1.0 : 0.0,
                             stop_training_ ? 1.0 : 0.0};
    for (auto& m : metrics_) {
      const std::vector<double> s = m->sums();  // 2 for most metrics, a histogram for AUC
      sums.insert(sums.end(), s.begin(), s.end());
    }
    if (!carried_.empty() && carried_.size() == sums.size() && communicator().is_master()) {
      for (size_t i = 0; i < sums.size(); ++i) sums[i] += carried_[i];
    }
    return sums;
  }
  Logs logs_of(const std::vector<double>& all, bool collective) const {
    if (all[2] > 0 && !collective) TNT_INPUT_ERROR("{}", error_);
    if (all[2] > 0) raise_error();
    Logs logs;
    logs["loss"] = all[1] > 0 ? all[0] / all[1] : 0.0;
    auto at = all.begin() + kCounts;
    for (auto& m : metrics_) {
      const auto end = at + static_cast<std::ptrdiff_t>(m->sums().size());
      logs[m->name()] = m->value_of(std::vector<double>(at, end));
      at = end;
    }
    return logs;
  }

  // Collective, when some rank's step found bad input: every rank throws, with the message
  // of the rank(s) that found it (plain when all ranks found the same, as on one rank).
  [[noreturn]] void raise_error() const {
    std::optional<Disagreement> d = find_disagreement(communicator(), {error_});
    if (!d) TNT_INPUT_ERROR("{}", error_);
    for (const auto& [text, ranks] : d->groups) {
      if (!text.empty()) TNT_INPUT_ERROR("{} (on rank(s) {})", text, rank_list(ranks));
    }
    TNT_THROW("a step's input error was announced but no rank holds its message");
  }

  std::vector<MetricPtr> metrics_;
  bool restore_;
  std::vector<std::vector<double>> saved_;
  double loss_sum_ = 0;  // sum of per-sample losses so far
  double samples_ = 0;   // real samples so far
  StepScalars scalars_;
  InputStager* staging_;
  std::string error_;  // the first bad input a step's readback found on this rank
  mutable bool stop_agreed_ = false;
  mutable bool stop_training_ = false;  // request_stop_training's, until a global() carried it
  mutable bool stop_training_agreed_ = false;
  mutable std::vector<double> last_global_;
  std::vector<double> carried_;  // carry's: the master's share of every global()
};

}  // namespace tnt::detail
