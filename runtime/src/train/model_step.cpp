// One training step and one evaluation step on this rank's micro-batch (see model.hpp for
// the semantics they keep): inputs to the device, forward, the loss of the global batch,
// backward with the Reducer, the step's one readback, the update. The loops around them:
// model.cpp.
#include "tarantella/model.hpp"

#include "core/clock.hpp"
#include "io/timeline.hpp"
#include "step/step_scalars.hpp"
#include "tarantella/log.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/reducer.hpp"
#include "train/batch_sources.hpp"
#include "train/layer_spans.hpp"
#include "train/pass_totals.hpp"
#include "train/ps_worker.hpp"
#include "train/rank_balance.hpp"
#include "train/scaling_profiler.hpp"
#include "train/staging.hpp"
#include "tarantella/runtime.hpp"

#include <memory>
#include <utility>

namespace tnt {

namespace {

using detail::now_s;
using detail::on_device;
using detail::rows;
using detail::step_units;
using timeline::Lane;
using Span = timeline::Span;

// --profile-scaling: where the step's phases begin (events on a GPU).
void mark(const std::unique_ptr<detail::ScalingProfiler>& profiler, detail::ScalingProfiler::Point point) {
  if (profiler) profiler->mark(point);
}

}  // namespace

Model::StepInputs Model::step_inputs(const Batch& batch, const char* what, detail::InputStager* staging) const {
  const size_t n_in = network_->inputs().size();
  TNT_INPUT_CHECK(batch.columns.size() == n_in + 1,
                  "{}: each element must have {} input column(s), a target and optionally a sample weight; it has {} "
                  "column(s)",
                  what, n_in, batch.columns.size());
  const Device device = network_->device();
  // Staged: copies already queued on the copy stream, which the compute stream now waits for.
  std::vector<Tensor> columns = staging ? staging->take(batch) : batch.columns;
  if (!staging) columns.push_back(batch.sample_weights);
  StepInputs in;
  for (size_t i = 0; i < n_in; ++i) in.inputs.push_back(on_device(columns[i], device));
  in.target = on_device(columns[n_in], device);
  if (columns[n_in + 1].defined()) in.weights = on_device(rows(columns[n_in + 1], batch.real_samples), device);
  return in;
}

namespace {

// Whether the network's outputs stay in the compute dtype for the loss
// (RunContext::half_outputs): mixed precision, a loss that reads them as they are on this
// device, and no metric (the metrics' engines take f32 predictions).
bool half_outputs(const Precision& precision, const Network& net, const Loss& loss, bool metrics) {
  return precision.mixed() && !metrics && loss.reads_half_predictions(net.device());
}

}  // namespace

// One training step on this rank's micro-batch: forward, the loss of the GLOBAL batch (each
// rank divides by the global count, so the SUM of the ranks' gradients is the serial
// gradient), backward with the Reducer summing each gradient as soon as it is final, then
// the same update on every rank.
// Parameter-server workers meet in no collective during an epoch (a lost one is dropped,
// max_staleness lets them drift): a loss averaged over a sequence's labels, whose count is
// the global batch's (an allreduce at every step), cannot train there.
void Model::check_ps_loss(const Tensor& target) const {
  TNT_INPUT_CHECK(!loss_->normalizes_by_tokens() || loss_->one_unit_per_sample(target.shape()),
                  "fit: strategy=parameter_server with {}, a loss averaged over the labels of a sample's sequence "
                  "(targets {}): its count over the global batch would make the workers wait for each other at "
                  "every step; train synchronously, or with one label a sample",
                  loss_->name(), target.str());
}

void Model::train_step(const Batch& batch, RunContext& rc, detail::PassTotals& totals) {
  const double t_start = now_s();
  mark(profiler_, detail::ScalingProfiler::start);
  StepInputs in = step_inputs(batch, "fit", totals.staging());
  detail::StepScalars::Scope readback(totals.scalars());  // the losses' and metrics' results
  rc.step = global_step_;
  rc.sample_offset = batch.sample_offset;
  rc.half_outputs = half_outputs(precision_, *network_, *loss_, !metrics_.empty());
  network_->zero_grad();
  if (ps_) {
    // Refused before the step's pull on every worker alike: a worker that had pulled first
    // could wait for a server that the others' refusal has already ended.
    check_ps_loss(in.target);
    const double t_pull = now_s();
    ps_->pull();  // the servers' current variables
    timing_.parameter_server = true;
    timing_.pull_seconds += now_s() - t_pull;
  }
  Tensor pred;
  {
    Span span(Lane::compute, "forward", timeline::on_device);
    pred = network_->forward(in.inputs, rc).at(0);
  }
  const Tensor grad_pred = loss_gradient(batch, in, std::move(pred), totals);
  // The results are final after the loss and metrics: their copy is queued now, and the
  // readback waits for it alone, not for the backward (the device never idles between
  // steps). The loss scaler's overflow flag needs the whole backward: it waits for all.
  std::unique_ptr<timeline::Readback> anchor;
  if (!scaler_.enabled() && config().cuda_early_readback) {
    anchor = std::make_unique<timeline::Readback>();
    totals.scalars().start_copy();
  }
  const double t_bwd = now_s();  // the profile's forward includes the loss
  mark(profiler_, detail::ScalingProfiler::backward);
  const auto [backward_s, exposed_comm_s] = backward_and_reduce(grad_pred, rc);
  if (balance_ && !ps_) balance_->update_begin(now_s());  // the gradients are there
  if (!anchor) anchor = std::make_unique<timeline::Readback>();
  anchor->waiting();
  const bool overflow = read_step_results(totals);
  anchor.reset();
  const double t_opt = now_s();
  mark(profiler_, detail::ScalingProfiler::optimizer);
  apply_update(overflow);
  mark(profiler_, detail::ScalingProfiler::end);
  if (balance_ && !ps_) balance_->update_done();
  if (profiler_) {
    profiler_->phases = {.forward_s = t_bwd - t_start, .backward_s = backward_s, .exposed_s = exposed_comm_s,
                         .optimizer_s = now_s() - t_opt, .samples = batch.micro_batch_size};
  }

  timing_.steps++;
  timing_.backward_seconds += backward_s;
  timing_.exposed_comm_seconds += exposed_comm_s;
  if (ps_) timing_.push_seconds += exposed_comm_s;  // the push is all the step's communication after backward
  if (!reducer_) return;  // parameter-server workers have none
  timing_.comm_seconds += reducer_->last_step().comm_s();
  timing_.hidden_comm_seconds += reducer_->last_step().hidden_s();
}

// The loss of the step's real rows, added to the pass's totals, and its gradient (b, ...):
// padding rows get a zero gradient (they are computed but never counted). The predictions
// are let go before the loss's backward, which may then write the gradient over them.
Tensor Model::loss_gradient(const Batch& batch, const StepInputs& in, Tensor pred, detail::PassTotals& totals) {
  const int64_t real = batch.real_samples;
  const Shape shape = pred.shape();
  const DType dtype = pred.dtype();
  const void* predictions = pred.raw();
  Tensor grad_pred;
  if (real == 0) grad_pred = Tensor::zeros(shape, dtype, pred.device());
  // A token-level loss is averaged over the global number of real tokens (loss.hpp).
  const bool by_tokens = loss_->normalizes_by_tokens();
  const int64_t units = step_units(*loss_, batch.columns.at(network_->inputs().size()), in.target, real);
  int64_t global_units = batch.global_real_samples;
  if (by_tokens && !loss_->one_unit_per_sample(in.target.shape())) {
    const double t_count = now_s();
    if (balance_ && !ps_) balance_->wait_begin(t_count);  // the others' wait is not this rank's work
    global_units = communicator().allreduce_sum(units);
    if (profiler_) profiler_->collective(now_s() - t_count, sizeof(int64_t), /*in_forward=*/true);
    if (balance_ && !ps_) balance_->wait_end(now_s());
  }
  if (real > 0) {
    Span span(Lane::compute, "loss", timeline::on_device);
    SavedState ls;
    const int64_t global_real = std::max<int64_t>(global_units, 1);
    Tensor loss = loss_->forward_weighted(rows(pred, real), rows(in.target, real), in.weights, global_real, ls);
    totals.add(pred, in.target, real, loss, static_cast<double>(global_real), units);
    pred = Tensor();
    Tensor g = loss_->backward(ls, scaler_.scale());
    grad_pred = real == batch.micro_batch_size ? g : detail::padded_gradient(g, shape, dtype, predictions);
  }
  return grad_pred;
}

// Backward, each gradient handed to the Reducer as soon as it is final, then the wait for the
// last buckets. Returns the seconds of backward and of the wait after it.
std::pair<double, double> Model::backward_and_reduce(const Tensor& grad_pred, RunContext& rc) {
  const double t_bwd = now_s();
  double t_bwd_end = 0;
  try {
    {
      Span span(Lane::compute, "backward", timeline::on_device);
      timeline::LayerSpans layers(&trainable_);
      network_->backward({grad_pred}, rc, [&](size_t index, Parameter&) {
        layers.gradient_ready(index);
        if (profiler_) profiler_->gradient_ready(index);
        if (reducer_) reducer_->mark_ready(index);
      });
    }
    t_bwd_end = now_s();
    mark(profiler_, detail::ScalingProfiler::backward_end);
    if (balance_ && !ps_) balance_->backward_end(t_bwd_end);
    if (ps_) {
      ps_->push();  // the servers apply it; this step's optimizer is theirs
    } else {
      Span span(Lane::compute, "wait for gradients");
      reducer_->finalize(1.0 / scaler_.scale());  // the loss scale is divided out here
    }
  } catch (...) {
    // The Reducer may be left mid-step, its thread still reducing this step's buckets.
    // Destroying it cancels them; the next fit() builds a fresh one (on every rank,
    // since the peers fail this step too, on their collective timeout at the latest).
    reducer_.reset();
    throw;
  }
  const double t_comm_end = now_s();
  mark(profiler_, detail::ScalingProfiler::reduced);
  return {t_bwd_end - t_bwd, t_comm_end - t_bwd_end};
}

// The step's one readback: the loss, the metrics' counts and checks, the overflow flag
// (returned). A bad label found there does not stop the update: every rank applies it alike
// (replicas stay equal), and the logs' allreduce right after raises the error on every rank.
// train_step holds the GPU lanes' clock (timeline::Readback) around this.
bool Model::read_step_results(detail::PassTotals& totals) {
  bool overflow = false;
  if (scaler_.enabled()) {
    detail::defer_has_non_finite(totals.scalars(), trainable_grads_, [&overflow](bool found) { overflow = found; });
  }
  Span span(Lane::compute, "step results");
  totals.finish_step();
  return overflow;
}

// The summed gradients are bitwise equal on every rank, so every rank decides alike.
void Model::apply_update(bool overflow) {
  Span span(Lane::compute, "optimizer", timeline::on_device);
  if (ps_) {
    // Nothing here: the servers apply the pushed gradients with their shard's optimizer.
  } else if (!scaler_.enabled() || scaler_.update(overflow)) {
    optimizer_->step(trainable_);
  } else {
    // A skipped step still moves the schedule on (as Keras' LossScaleOptimizer and a
    // PyTorch scheduler stepped every batch), so warmup and decay stay on their batches.
    optimizer_->set_step_count(optimizer_->step_count() + 1);
  }
  ++global_step_;
}

void Model::test_step(const Batch& batch, const RunContext& rc, detail::PassTotals& totals) {
  StepInputs in = step_inputs(batch, "evaluate", totals.staging());
  detail::StepScalars::Scope readback(totals.scalars());
  const int64_t real = batch.real_samples;
  Span span(Lane::compute, "evaluation step", timeline::on_device);
  RunContext erc = rc;
  erc.half_outputs = half_outputs(precision_, *network_, *loss_, !metrics_.empty());
  const Tensor pred = network_->forward(in.inputs, erc, false).at(0);
  if (real == 0) return;
  SavedState ls;
  // Divided by 1: this rank's plain sum of per-sample losses.
  const Tensor loss = loss_->forward_weighted(rows(pred, real), rows(in.target, real), in.weights, 1, ls);
  const int64_t units = step_units(*loss_, batch.columns.at(network_->inputs().size()), in.target, real);
  totals.add(pred, in.target, real, loss, 1.0, units);
  totals.finish_step();  // one readback a step
}

}  // namespace tnt
