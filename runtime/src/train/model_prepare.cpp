// What fit sets up before its first step: every rank's agreement on how it trains, the
// initial weights everywhere, the Reducer over the trainable gradients, the scaling profiler.
#include "tarantella/model.hpp"

#include "comm/agreement.hpp"
#include "io/timeline.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/config.hpp"
#include "tarantella/log.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"
#include "train/rank_balance.hpp"
#include "train/scaling_profiler.hpp"

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

// Ranks that disagree on the precision or on the loss scale would sum gradients scaled
// differently and disagree on which steps to skip: their replicas would drift apart
// without any error. Refuse it up front (the scale itself too: a resumed rank may have read
// another checkpoint).
void Model::check_ranks_agree() {
  std::string mine = precision_.name();
  if (scaler_.enabled()) {
    mine += fmt::format(" with loss scale {} ({} good steps; x{} after {} good steps, x{} on overflow)",
                        scaler_.scale(), scaler_.good_steps(), precision_.growth_factor, precision_.growth_interval,
                        precision_.backoff_factor);
  } else {
    mine += " without loss scaling";
  }
  // Clipping that differs between ranks would change the update on some of them only: the
  // replicas would drift apart just as silently.
  const GradientClipping& clip = optimizer_->clipping();
  const std::string clipping = "gradient clipping: " + (clip.active() ? clip.describe() : std::string("none"));
  // So would another optimizer, learning rate or loss; other metrics would pair their sums'
  // allreduces wrongly (an MPI truncation error, or garbage).
  std::string metrics;
  for (const auto& m : metrics_) metrics += (metrics.empty() ? "" : ", ") + m->name();
  const std::vector<std::string> facts{mine, clipping, "optimizer " + optimizer_->describe(), "loss " + loss_->describe(),
                                       "metrics " + (metrics.empty() ? std::string("none") : metrics)};
  if (std::optional<detail::Disagreement> d = detail::find_disagreement(communicator(), facts)) {
    TNT_INPUT_CHECK(d->entry != 1,
                    "fit: the ranks' optimizers clip gradients differently ({}); every rank must pass the same "
                    "GradientClipping",
                    d->describe());
    TNT_INPUT_CHECK(d->entry < 2,
                    "fit: the ranks compiled the model differently ({}); every rank must compile() with the same "
                    "optimizer (and learning rate), loss and metrics, or the replicas drift apart",
                    d->describe());
    TNT_INPUT_ERROR("fit: the ranks compiled the model with different precisions ({}); every rank must pass the "
                    "same Precision to compile() and load the same checkpoint",
                    d->describe());
  }
}

// Everything a step needs that outlives it: the initial weights on every rank, one Reducer
// over the trainable gradients (in the order the graph's hook numbers them).
void Model::prepare_training() {
  timeline::start_from_config(communicator());  // TNT_TIMELINE (collective, once)
  if (!weights_synced_) broadcast_weights();
  check_ranks_agree();
  trainable_ = network_->trainable_parameters();
  trainable_grads_.clear();
  for (auto& np : trainable_) trainable_grads_.push_back(np.param->grad);
  // A parameter frozen or unfrozen since the last fit renumbers the hook's indices: the
  // Reducer must be built again over the new list (collective, as every rank changes alike;
  // its fingerprint check catches ranks that did not).
  std::vector<const Parameter*> params;
  for (auto& np : trainable_) params.push_back(np.param);
  if (reducer_ && reducer_params_ != params) reducer_.reset();
  if (!reducer_ && !ps_) {
    reducer_params_ = params;
    std::vector<std::pair<std::string, Tensor>> grads;
    for (auto& np : trainable_) grads.emplace_back(np.name, np.param->grad);
    reducer_ = std::make_unique<Reducer>(communicator(), grads);
  }
  static bool told_ps = false;  // once a process (each worker says it)
  if (!config().profile_scaling.empty() && ps_ && !std::exchange(told_ps, true)) {
    log_warning("TNT_PROFILE_SCALING: a scaling profile is of synchronous training (gradients allreduced); this job "
                "trains with parameter servers, so none is written");
  }
  // Who the others wait for: synchronous training on several ranks.
  if (!balance_ && !ps_ && size() > 1) balance_ = std::make_unique<detail::RankBalance>(network_->device());
  if (!profiler_ && !config().profile_scaling.empty() && !ps_) {
    detail::ScalingProfiler::check_writable(communicator(), config().profile_scaling);
    profiler_ = std::make_unique<detail::ScalingProfiler>(config().profile_scaling, config().profile_scaling_steps,
                                                          network_->device());
  }
}

}  // namespace tnt
