// The callbacks of a fit or an evaluation that run on this rank (Callback::Ranks), each
// called inside a SomeRanksRegion when it does not run on every rank.
#pragma once

#include "comm/collective_scope.hpp"
#include "core/clock.hpp"
#include "tarantella/callbacks.hpp"
#include "tarantella/config.hpp"
#include "tarantella/log.hpp"
#include "tarantella/model.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace tnt {

namespace detail {

// For "metric 'x' is not logged": what is, so that a misspelled name shows.
inline std::string logged_names(const Logs& logs) {
  std::string names;
  for (const auto& [name, value] : logs) names += (names.empty() ? "" : ", ") + name;
  return names.empty() ? std::string("none") : names;
}

inline bool runs_on_this_rank(Callback::Ranks ranks) {
  switch (ranks) {
    case Callback::Ranks::master:
      return is_master_rank() || config().output_on_all_devices;
    case Callback::Ranks::master_only:
      return is_master_rank();
    case Callback::Ranks::all:
      return true;
  }
  return true;
}

}  // namespace detail

// The logs of on_epoch_begin for a callback that takes over in the middle of an epoch:
// this rank's steps of the epoch so far, and its seconds since the epoch began.
namespace detail {
inline constexpr const char* kTakeoverStepsKey = "takeover_epoch_steps";
inline constexpr const char* kTakeoverSecondsKey = "takeover_epoch_seconds";
inline constexpr const char* kTakeoverFirstStepKey = "takeover_epoch_first_step";  // steps it did not run
// The logs of on_epoch_begin for an epoch resumed inside (FitOptions::initial_step): where it
// goes on. Only the callbacks of fit see it; it is taken out before any other callback runs.
inline constexpr const char* kResumedStepKey = "resumed_epoch_first_step";
}  // namespace detail

// Calls each callback that runs on this rank.
class detail::CallbackList {
 public:
  CallbackList(std::vector<CallbackPtr> callbacks, Model* model, const TrainParams& params) : model_(model) {
    for (auto& cb : callbacks) {
      if (!cb) continue;
      cb->set_model(model);
      cb->set_params(params);
      const Callback& named = *cb;
      std::string name = fmt::format("callback '{}'", detail::readable_type_name(typeid(named).name()));
      if (!detail::runs_on_this_rank(cb->ranks())) {
        dormant_.emplace_back(std::move(cb), std::move(name));
        continue;
      }
      names_.push_back(std::move(name));
      list_.push_back(std::move(cb));
    }
  }
  // fit: on_train_begin has run, and epoch `epoch` (0-based) is under way. A callback that
  // did not run on this rank then and does now (parameter-server training went on without
  // its first worker, the master) starts here with on_train_takeover.
  void at_epoch(int epoch) {
    began_ = true;
    epoch_ = epoch;
    epoch_begun_ = false;
  }
  void epoch_begun() {  // on_epoch_begin has run for epoch_
    epoch_begun_ = true;
    epoch_began_at_ = detail::now_s();
    epoch_steps_ = 0;
    epoch_first_step_ = -1;
  }
  // The epoch's steps done (0-based index + 1); the first call of an epoch gives the steps
  // this process did not run (a resumed epoch's), so that a taker-over's rate counts its own.
  void step_ended(int64_t steps_in_epoch) {
    if (epoch_first_step_ < 0) epoch_first_step_ = steps_in_epoch;
    epoch_steps_ = steps_in_epoch;
  }
  template <typename F>
  void each(F&& f) {
    if (began_ && !dormant_.empty()) adopt();
    for (size_t i = 0; i < list_.size(); ++i) {
      Callback& cb = *list_[i];
      // One that does not run on every rank runs inside a SomeRanksRegion: a collective it
      // starts fails at once, naming it, instead of leaving the other ranks waiting for it.
      std::optional<detail::SomeRanksRegion> region;
      if (cb.ranks() == Callback::Ranks::master) {
        region.emplace(names_[i], "the master only (Ranks::master; every rank only when TNT_OUTPUT_ON_ALL_DEVICES=1)");
      } else if (cb.ranks() == Callback::Ranks::master_only) {
        region.emplace(names_[i], "the master only (Ranks::master_only)");
      }
      const bool stopping = model_ && model_->stop_requested();
      f(cb);
      if (region && model_ && !stopping && model_->stop_requested()) some_ranks_stop_ = true;
    }
  }
  // A callback that does not run on every rank called Model::stop_training() since the last
  // call: the other ranks do not know (cleared by the call).
  bool take_some_ranks_stop() { return std::exchange(some_ranks_stop_, false); }

 private:
  void adopt() {
    for (size_t i = 0; i < dormant_.size();) {
      auto& [cb, name] = dormant_[i];
      if (!detail::runs_on_this_rank(cb->ranks())) {
        ++i;
        continue;
      }
      {
        const detail::SomeRanksRegion region(name, "the master only (it took over as the master)");
        cb->on_train_takeover(epoch_, Logs{});
        // Where this rank's epoch is (a progress bar shows its steps and time so far).
        if (epoch_begun_) {
          cb->on_epoch_begin(epoch_, Logs{{detail::kTakeoverStepsKey, static_cast<double>(epoch_steps_)},
                                         {detail::kTakeoverSecondsKey, detail::now_s() - epoch_began_at_},
                                         {detail::kTakeoverFirstStepKey, static_cast<double>(std::max<int64_t>(
                                                                             epoch_first_step_, 0))}});
        }
      }
      names_.push_back(std::move(name));
      list_.push_back(std::move(cb));
      dormant_.erase(dormant_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  std::vector<std::string> names_;  // for messages, beside list_
  std::vector<CallbackPtr> list_;
  std::vector<std::pair<CallbackPtr, std::string>> dormant_;  // not for this rank (yet), and their names
  Model* model_;
  bool some_ranks_stop_ = false;
  bool began_ = false, epoch_begun_ = false;
  double epoch_began_at_ = 0;
  int64_t epoch_steps_ = 0;
  int64_t epoch_first_step_ = -1;
  int epoch_ = 0;
};

}  // namespace tnt
