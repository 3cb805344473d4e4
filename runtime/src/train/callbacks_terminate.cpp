// TerminateOnNaN (callbacks.hpp): the loss after each step, the parameters after each epoch.
#include "tarantella/callbacks.hpp"
#include "tarantella/check.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/model.hpp"
#include "tarantella/runtime.hpp"
#include "train/non_finite.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace tnt {

// ---- TerminateOnNaN ---------------------------------------------------------------------

// The logged loss is the allreduced global mean, equal on every rank, and a sum is non-finite
// whatever the order of its terms once one of them is (doubles do not overflow on losses),
// so every rank takes this decision at the same step without a collective of its own.
void TerminateOnNaN::on_train_batch_end(int64_t batch, const Logs& logs) {
  auto it = logs.find("loss");
  if (it == logs.end() || std::isfinite(it->second)) return;
  TNT_CHECK(model_, "TerminateOnNaN used outside Model::fit");
  // With dynamic loss scaling (fp16) an overflowing step is expected: it is skipped, the
  // scale halves, and a run that really diverged ends with the LossScaler's own error once
  // the scale underflows. Its infinite loss is not a reason to stop here.
  if (model_->loss_scaler().enabled()) return;
  stopped_step_ = model_->global_step();
  const std::string of_steps = params_.steps > 0 ? fmt::format(" of {}", params_.steps) : "";
  const std::string where = fmt::format("the loss is {} at step {} (epoch {}, batch {}{})", it->second, stopped_step_,
                                        epoch_ + 1, batch + 1, of_steps);
  if (action_ == Action::raise) {
    throw Error(fmt::format("{}: the training diverged; stopped before the end of the epoch, so nothing was saved for "
                            "it (TerminateOnNaN; a smaller learning rate may help)",
                            where));
  }
  log_error("TerminateOnNaN: {}; stopping", where);
  model_->stop_training();
}

// A NaN or an infinity in the input data can leave the loss finite: ReLU maps NaN to 0, so
// the forward hides it, while the first layer's weight gradient (input x upstream gradient)
// carries it into the weights; the model then predicts a constant, and the loss stays finite
// forever. Parameters are equal on every rank (synchronous training), so every rank decides
// alike without a collective. One fused check per device (as the checkpoint savers'), once an
// epoch.
void TerminateOnNaN::on_epoch_end(int epoch, const Logs& logs) {
  TNT_CHECK(model_, "TerminateOnNaN used outside Model::fit");
  std::vector<NamedTensor> params, buffers;
  for (const auto& p : model_->network().named_parameters()) params.push_back({p.name, p.param->value});
  for (const auto& b : model_->network().named_buffers()) buffers.push_back({b.name, b.param->value});
  const std::string name = detail::first_non_finite(params);
  // Statistics that diverged (BatchNorm's running variance on micro-batches of a sample or
  // two) leave training's loss finite and make every evaluation NaN. They are each rank's
  // own, so this rank says it (the master's are the ones saved).
  // They are each rank's own: the ranks agree (one small allreduce an epoch).
  const std::string buffer = name.empty() && !buffers.empty() ? detail::first_non_finite(buffers) : std::string();
  const bool any_buffer = name.empty() && !buffers.empty() &&
                          communicator().allreduce_max(buffer.empty() ? 0.0 : 1.0) > 0;
  if (any_buffer) {
    stopped_step_ = model_->global_step();
    const std::string which = buffer.empty() ? std::string("a running statistic of another rank")
                                             : fmt::format("the running statistic '{}' of rank {}", buffer, rank());
    const std::string where = fmt::format(
        "{} holds a NaN or an infinity after epoch {} (step {}), though the parameters are finite: evaluation with it "
        "gives NaN; BatchNorm's statistics of very small micro-batches (a sample or two a rank) are unstable: give "
        "each rank more samples a step",
        which, epoch + 1, stopped_step_);
    if (action_ == Action::raise) throw Error(fmt::format("{} (TerminateOnNaN)", where));
    log_error("TerminateOnNaN: {}; stopping", where);
    model_->stop_training();
    return;
  }
  if (name.empty()) {
    // Finite weights and statistics and a non-finite validation loss: the validation data,
    // or outputs that overflow on them. Said; the weights are fine to go on with.
    const auto val = logs.find("val_loss");
    if (val != logs.end() && !std::isfinite(val->second) && is_master_rank()) {
      log_warning("TerminateOnNaN: val_loss is {} after epoch {} though the weights and statistics are finite: the "
                  "validation data hold a NaN or an infinity, or the model's outputs overflow on them",
                  val->second, epoch + 1);
    }
    return;
  }
  stopped_step_ = model_->global_step();
  const std::string where = fmt::format(
      "parameter '{}' holds a NaN or an infinity after epoch {} (step {}), though the loss is finite: an update "
      "that overflowed (learning rate {:g}: a smaller one may help), or a NaN or an infinity in the input data "
      "(ReLU maps NaN to 0, which hides it from the loss, while the gradients carry it into the weights; check the "
      "data, e.g. with a map() that tests each sample)",
      name, epoch + 1, stopped_step_, model_->learning_rate());
  if (action_ == Action::raise) throw Error(fmt::format("{} (TerminateOnNaN)", where));
  log_error("TerminateOnNaN: {}; stopping", where);
  model_->stop_training();
}

}  // namespace tnt
