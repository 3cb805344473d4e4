// The data-parallel training loop (see model.hpp for the semantics it keeps): compile, fit
// and the loop around the steps (train_step and test_step: model_step.cpp; what fit sets up:
// model_prepare.cpp). Evaluate, predict, checkpoints: model_evaluate.cpp,
// model_predict.cpp, model_checkpoint.cpp.
#include "tarantella/model.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "comm/agreement.hpp"
#include "comm/collective_scope.hpp"
#include "core/clock.hpp"
#include "core/context.hpp"
#include "io/timeline.hpp"
#include "train/layer_spans.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"
#include "train/batch_sources.hpp"
#include "train/callback_list.hpp"
#include "train/cuda_profile_window.hpp"
#include "train/pass_totals.hpp"
#include "train/rank_balance.hpp"
#include "train/ps_worker.hpp"
#include "train/same_network.hpp"
#include "train/scaling_profiler.hpp"
#include "train/staging.hpp"
#include "step/step_scalars.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <typeinfo>
#include <utility>

namespace tnt {

namespace {

using detail::distributed_source;
using detail::global_batch_of;
using detail::NextBatch;
using detail::now_s;
using detail::on_device;
using detail::rows;
using detail::stager_for;
using detail::step_units;
using detail::user_source;
using detail::with_sample_weights;
using detail::with_staging;
using timeline::Lane;
using Span = timeline::Span;

}  // namespace


Model::Model(std::shared_ptr<Network> network, uint64_t seed) : network_(std::move(network)), seed_(seed) {
  TNT_INPUT_CHECK(network_, "Model needs a network (got a null pointer)");
  if (network_->trained() && is_master_rank()) {
    log_warning("Model: network '{}' was trained by another Model; this one draws its weights again (seed {}), and "
                "the trained weights are gone. To go on from them, keep using that Model, or save_weights there and "
                "load_weights here",
                network_->name(), seed_);
  }
  network_->to(default_device());
  network_->initialize(seed_);
  network_->set_input_gradients(false);
}

Model::~Model() = default;

void Model::compile(std::shared_ptr<Optimizer> optimizer, LossPtr loss, std::vector<MetricPtr> metrics,
                    Precision precision) {
  TNT_INPUT_CHECK(optimizer != nullptr, "Model::compile: no optimizer given");
  const DType cdt = precision.compute_dtype;
  TNT_INPUT_CHECK(cdt == DType::f32 || is_half(cdt),
                  "Model::compile: precision with compute dtype {}: expected f32, bf16 or f16", dtype_name(cdt));
  LossScaler scaler(precision);  // validates the scaling options
  TNT_INPUT_CHECK(loss != nullptr, "Model::compile: no loss given");
  for (const auto& m : metrics) TNT_INPUT_CHECK(m != nullptr, "Model::compile: a metric is null");
  detail::check_metric_names(metrics);
  // predictions, the loss and the metrics take the first output only: the others would be
  // computed and never trained.
  const size_t outputs = network_->outputs().size();
  TNT_INPUT_CHECK(outputs == 1,
                  "Model::compile: network '{}' has {} outputs, but a Model trains one output with one loss (Keras' "
                  "loss per output is not supported): give the network one output (e.g. concatenate them) and a loss "
                  "over it",
                  network_->name(), outputs);
  optimizer_ = std::move(optimizer);
  loss_ = std::move(loss);
  metrics_ = std::move(metrics);
  optimizer_->init_state(network_->trainable_parameters());
  reducer_.reset();
  precision_ = precision;
  scaler_ = scaler;
  network_->set_compute_dtype(cdt);
  if (precision_.mixed() && network_->device().is_cpu()) {
    const std::string why = cpu::emulation_reason(cdt);
    if (why.empty()) {
      log_info("mixed precision bf16 on the CPU: the network's Conv2D and Dense layers multiply in bf16 (oneDNN, "
               "instruction set {}, f32 sums); the other layers, those inside them (attention's projections) "
               "included, compute in f32 between bf16 activations", cpu::isa_name());
    } else {
      log_warning("mixed precision {} on the CPU is emulated: activations are stored in {}, but the CPU engines "
                  "compute in f32, so it is no faster than fp32 ({})", precision_.name(), dtype_name(cdt), why);
    }
  }
}

void Model::check_compiled(const char* what) const {
  TNT_INPUT_CHECK(compiled(), "Model::{} called before Model::compile", what);
}

int64_t Model::class_count() const {
  const std::vector<SymTensor>& outputs = network_->outputs();
  return outputs.size() == 1 && loss_ ? loss_->class_count(outputs.front().shape()) : -1;
}

std::string Model::summary() {
  std::string out = network_->summary();
  if (!compiled()) return out + "Not compiled\n";
  std::string metrics;
  for (const auto& m : metrics_) metrics += (metrics.empty() ? "" : ", ") + m->name();
  out += fmt::format("Optimizer: {}\nLoss: {}\nMetrics: {}\nPrecision: {}\nRanks: {} (data parallel)\n",
                     optimizer_->describe(), loss_->name(), metrics.empty() ? "none" : metrics, precision_.name(),
                     size());
  return out;
}

Optimizer& Model::optimizer() {
  check_compiled("optimizer");
  return *optimizer_;
}

double Model::learning_rate() const {
  check_compiled("learning_rate");
  return optimizer_->learning_rate();
}

void Model::set_learning_rate(double lr) {
  check_compiled("set_learning_rate");
  detail::refuse_replica_change_here("Model::set_learning_rate");
  optimizer_->set_learning_rate(lr);
}

void Model::broadcast_weights() {
  Communicator& comm = communicator();
  // Tensor by tensor below: ranks with other networks would pair other sizes.
  detail::require_same_network(comm, *network_, "Model: sharing the master's weights");
  for (auto& p : network_->named_parameters()) detail::broadcast_via_host(comm, p.param->value, master_rank());
  for (auto& b : network_->named_buffers()) detail::broadcast_via_host(comm, b.param->value, master_rank());
  weights_synced_ = true;
}

// ---------------------------------------------------------------------------------------
// fit

std::optional<DistributedDataset> Model::validation_set(const FitOptions& options) const {
  TNT_INPUT_CHECK(!(options.validation_data && options.distributed_validation_data),
                  "fit: both validation_data and distributed_validation_data are given; pass one of them");
  // An empty validation set would log val_loss 0, which EarlyStopping and save_best_only take
  // for a perfect model.
  if (options.distributed_validation_data) {
    TNT_INPUT_CHECK(options.distributed_validation_data->steps() != 0,
                    "fit: distributed_validation_data gives no step (no sample to validate)");
    return *options.distributed_validation_data;
  }
  if (!options.validation_data) return std::nullopt;
  TNT_INPUT_CHECK(options.validation_data->cardinality() != 0,
                  "fit: validation_data is empty (no sample to validate; val_loss would read 0)");
  const int p = size();
  int64_t vb = 0;
  if (options.validation_batch_size != 0 || options.validation_micro_batch_size != 0) {
    vb = global_batch_of("fit", "validation_batch_size", options.validation_batch_size,
                         "validation_micro_batch_size", options.validation_micro_batch_size);
  } else {
    vb = options.batch_size;
    TNT_INPUT_CHECK(vb >= p, "fit: the validation batch size {} is smaller than the number of ranks {}", vb, p);
  }
  vb = detail::batch_within_data("fit", "validation_batch_size", vb, options.validation_data->cardinality(), false);
  return options.validation_data->distribute(vb, rank(), p, Remainder::pad);
}

namespace {

// A bad label or target names its row of a rank's micro-batch (the same error on every rank,
// "on rank(s) q"): which samples of the global batch those rows are. Every rank's slice is
// known when fit distributed the data; otherwise only this rank's.
std::string batch_layout(const Batch& b, bool distributed, int me, int p) {
  auto slice = [](int64_t first, int64_t count, int q) {
    return fmt::format("samples {} to {} on rank {}", first, first + count - 1, q);
  };
  std::string out = fmt::format("the global batch of {}: ", b.global_batch_size);
  if (!distributed || p > 8 || b.global_batch_size < p) return out + slice(b.sample_offset, b.micro_batch_size, me);
  for (int q = 0; q < p; ++q) {
    out += (q ? ", " : "") + slice(micro_batch_offset(b.global_batch_size, q, p),
                                   micro_batch_size(b.global_batch_size, q, p), q);
  }
  return out;
}

// FitOptions::validation_split: the first floor(n * (1 - split)) elements train, the rest
// become options.validation_data (Keras' rounding).
Dataset split_off_validation(const Dataset& data, FitOptions& options) {
  const double split = options.validation_split;
  TNT_INPUT_CHECK(split > 0 && split < 1, "fit: validation_split={} must be in (0, 1)", split);
  TNT_INPUT_CHECK(!options.validation_data && !options.distributed_validation_data,
                  "fit: validation_split={} and validation data are both given; pass one of them", split);
  TNT_INPUT_CHECK(options.distribute_dataset,
                  "fit: validation_split={} needs distribute_dataset=true (the split is of the global data set)", split);
  const int64_t n = data.cardinality();
  TNT_INPUT_CHECK(n >= 0, "fit: validation_split={} needs a dataset of known size; this one's is unknown", split);
  // Split after a per-epoch shuffle, the held-out samples would change every epoch and be
  // trained on in the others. Keras splits before shuffling; here the user's pipeline
  // decides the order, so the user splits.
  TNT_INPUT_CHECK(!data.reshuffles_each_epoch(),
                  "fit: validation_split={} on a dataset that is shuffled every epoch would validate on samples "
                  "trained on in other epochs; split before shuffling: train on data.take(k).shuffle(...) and pass "
                  "data.skip(k) as validation_data",
                  split);
  const auto n_train = static_cast<int64_t>(std::floor(static_cast<double>(n) * (1.0 - split)));
  TNT_INPUT_CHECK(n_train > 0 && n_train < n,
                  "fit: validation_split={} of {} samples leaves {} for training and {} for validation; both need "
                  "at least one",
                  split, n, n_train, n - n_train);
  options.validation_data = data.skip(n_train);
  return data.take(n_train);
}

}  // namespace

History Model::fit(const Dataset& all_data, FitOptions options) {
  check_compiled("fit");
  const detail::CollectiveLabel label("fit");  // messages say "... in fit"
  if (options.strategy == Strategy::parameter_server) return detail::fit_parameter_server(*this, all_data, options);
  const Dataset data = options.validation_split != 0 ? split_off_validation(all_data, options) : all_data;
  const int p = size();
  if (!options.distribute_dataset) {
    // The data are already this rank's micro-batches.
    const int64_t micro = options.micro_batch_size;
    return run_fit([data, micro](int64_t epoch, int64_t first) { return user_source(data, epoch, micro, first); },
                   data.cardinality(),
                   validation_set(options), options);
  }
  // The global batch is also what callbacks and the validation default see.
  const char* batch_name = options.batch_size > 0 ? "batch_size" : "micro_batch_size x ranks";
  options.batch_size =
      global_batch_of("fit", "batch_size", options.batch_size, "micro_batch_size", options.micro_batch_size);
  // With its remainder dropped, such a batch gives no step: refused below.
  if (options.remainder == Remainder::pad) {
    options.batch_size = detail::batch_within_data("fit", batch_name, options.batch_size, data.cardinality(), true);
  }
  DistributedDataset train = data.distribute(options.batch_size, rank(), p, options.remainder);
  if (options.prefetch > 0) train = train.prefetch(options.prefetch);
  if (ps_) {
    // A parameter-server worker trains its own part, then what the ledger gives it of lost
    // workers' parts: their batches, cut as they would have cut them.
    const int64_t batch = options.batch_size, prefetch = options.prefetch;
    const Remainder remainder = options.remainder;
    detail::PsWorker* ps = ps_;
    return run_fit(
        [=](int64_t epoch, int64_t) {  // no initial_step (run_fit refuses one)
          auto part = [=](int owner) {
            DistributedDataset theirs = data.distribute(batch, owner, p, remainder);
            if (prefetch > 0) theirs = theirs.prefetch(prefetch);
            return distributed_source(theirs, epoch);
          };
          return ps->epoch_batches(distributed_source(train, epoch), train.steps(), part);
        },
        train.steps(), validation_set(options), options);
  }
  // Keras refuses it too: a fit that trains nothing is a mistake (an empty file, a skip or a
  // split past the end, a batch larger than the data with its remainder dropped).
  TNT_INPUT_CHECK(train.steps() != 0,
                  "fit: the training data give no step ({} samples, global batch {}{}); give more samples or a "
                  "smaller batch",
                  data.cardinality(), options.batch_size,
                  options.remainder == Remainder::drop ? ", the last partial batch dropped" : "");
  return run_fit([train](int64_t epoch, int64_t first) { return distributed_source(train, epoch, first); },
                 train.steps(),
                 validation_set(options), options);
}

History Model::fit(const DistributedDataset& data, FitOptions options) {
  check_compiled("fit");
  const detail::CollectiveLabel label("fit");
  TNT_INPUT_CHECK(options.strategy == Strategy::synchronous,
                  "fit: strategy=parameter_server needs the unbatched dataset (the workers split it among "
                  "themselves), not one already distributed over every rank");
  TNT_INPUT_CHECK(options.validation_split == 0,
                  "fit: validation_split={} needs the unbatched dataset, not one already distributed",
                  options.validation_split);
  TNT_INPUT_CHECK(options.batch_size <= 0 || options.batch_size == data.global_batch_size(),
                  "fit: batch_size={} but the distributed dataset was cut into global batches of {}",
                  options.batch_size, data.global_batch_size());
  TNT_INPUT_CHECK(options.micro_batch_size <= 0 || options.micro_batch_size == data.micro_batch_size(),
                  "fit: micro_batch_size={} but the distributed dataset gives rank {} {} samples",
                  options.micro_batch_size, rank(), data.micro_batch_size());
  options.batch_size = data.global_batch_size();
  return run_fit([data](int64_t epoch, int64_t first) { return distributed_source(data, epoch, first); },
                 data.steps(),
                 validation_set(options), options);
}

History Model::run_fit(const std::function<NextBatch(int64_t, int64_t)>& source, int64_t steps,
                       const std::optional<DistributedDataset>& validation, const FitOptions& options) {
  TNT_INPUT_CHECK(options.epochs >= options.initial_epoch, "fit: epochs={} is smaller than initial_epoch={}",
                  options.epochs, options.initial_epoch);
  TNT_INPUT_CHECK(options.validation_freq > 0, "fit: validation_freq must be positive");
  detail::check_class_weight_for("fit", options.class_weight, class_count());  // before any callback acts
  // A checkpoint may hold all of an epoch's steps but not its end (a stop on request at its
  // last step leaves the validation out): the resume runs that end.
  const bool at_end_of_steps = options.initial_step == steps && steps == checkpoint_epoch_step_;
  TNT_INPUT_CHECK(options.initial_step >= 0 && (steps < 0 || options.initial_step < steps || at_end_of_steps),
                  "fit: initial_step={} is not a step of initial_epoch={} (epoch {} of the logs; {} steps an epoch{})",
                  options.initial_step, options.initial_epoch, options.initial_epoch + 1, steps,
                  options.initial_step == checkpoint_epoch_step_ && checkpoint_epoch_step_ > 0
                      ? "; the checkpoint's position inside its epoch: resume with its data and batch size"
                      : "");
  // A checkpoint's steps into its epoch count global batches of its size: with another
  // size they would skip other samples (some trained twice in the epoch, some never).
  // With the ranks' own micro-batches (distribute_dataset=false) the global batch is known
  // at the first step: checked there.
  const int64_t batch = options.distribute_dataset ? options.batch_size : 0;
  const bool at_checkpoint = options.initial_step > 0 && options.initial_step == checkpoint_epoch_step_ &&
                             checkpoint_epoch_batch_ > 0;
  auto check_checkpoint_batch = [&](int64_t global) {
    TNT_INPUT_CHECK(!at_checkpoint || global == checkpoint_epoch_batch_,
                    "fit: initial_step={} is the checkpoint's position, {} steps of a global batch of {} into its "
                    "epoch, but this fit's global batch is {}: resume with the checkpoint's global batch of {} "
                    "samples, or from a checkpoint at an epoch's end",
                    options.initial_step, checkpoint_epoch_step_, checkpoint_epoch_batch_, global,
                    checkpoint_epoch_batch_);
  };
  if (batch > 0) check_checkpoint_batch(batch);
  fit_global_batch_ = batch;
  TNT_INPUT_CHECK(options.initial_step == 0 || ps_ == nullptr,
                  "fit: initial_step={} (a checkpoint inside an epoch) is not supported with strategy=parameter_server",
                  options.initial_step);
  TNT_INPUT_CHECK(options.total_epochs == 0 || options.total_epochs >= options.epochs,
                  "fit: total_epochs={} is smaller than epochs={}", options.total_epochs, options.epochs);
  // Ranks with parameter-server roles (tarantella --parameter-servers: a server rank gets no
  // GPU) that train synchronously: allowed (a program may fit both ways in one job), but a
  // program that forgot its strategy would otherwise train unbalanced without a word.
  static bool told_sync_under_ps = false;  // once a process
  if (ps_ == nullptr && !config().ps_servers.empty() && is_master_rank() && !std::exchange(told_sync_under_ps, true)) {
    log_warning("TNT_PS_SERVERS={} (tarantella --parameter-servers) gives ranks parameter-server roles, but this fit "
                "trains synchronously on every rank, the server ranks included (on GPU nodes they have no GPU); "
                "for parameter-server training give fit the parameter_server strategy (fashion_mnist: "
                "--strategy=parameter_server), else leave out --parameter-servers",
                config().ps_servers);
  }
  prepare_training();
  network_->mark_trained();
  if (!ps_) {
    // A rank with more samples (or another batch size or epochs) would go on to steps the
    // others never take: refused on every rank at once, naming what differs.
    std::vector<std::string> facts{fmt::format("epochs {} to {}", options.initial_epoch, options.epochs),
                                   fmt::format("max_steps {}", options.max_steps)};
    if (options.distribute_dataset) {
      facts.push_back(fmt::format("global batch {}", options.batch_size));
      facts.push_back(fmt::format("{} steps an epoch", steps));
    } else if (options.max_steps <= 0 || steps < 0 || options.max_steps - global_step_ > steps) {
      // The ranks' own micro-batches: a rank with more would find out only when the others
      // ran out, at the end of the first epoch (unless max_steps ends training before this
      // rank's run out). Unknown counts are checked step by step.
      facts.push_back(steps >= 0 ? fmt::format("{} micro-batches an epoch (distribute_dataset=false)", steps)
                                 : std::string("micro-batches an epoch: not known ahead"));
    }
    facts.push_back(fmt::format("initial step {}", options.initial_step));
    // Validation data of other sizes would average other samples on each rank, or hang.
    if (options.validation_data) facts.push_back(fmt::format("{} validation samples", options.validation_data->cardinality()));
    if (validation) {
      facts.push_back(fmt::format("validation: global batch {}, {} steps", validation->global_batch_size(),
                                  validation->steps()));
    }
    detail::require_same_pass(communicator(), "fit", facts);
  }
  // Parameter servers: after a lost worker, the workers left split the validation set again.
  const int validation_ranks = size();
  std::optional<DistributedDataset> regrouped;

  History history;
  TrainParams params;
  params.epochs = options.epochs;
  params.total_epochs = options.total_epochs;
  params.initial_epoch = options.initial_epoch;
  params.steps = steps;
  params.max_steps = options.max_steps;
  params.batch_size = options.distribute_dataset ? options.batch_size : 0;
  params.verbose = options.verbose;
  params.metrics.push_back("loss");
  for (auto& m : metrics_) params.metrics.push_back(m->name());
  params.validates = validation.has_value();
  std::vector<CallbackPtr> cbs = options.callbacks;
  cbs.insert(cbs.begin(), std::shared_ptr<Callback>(&history, [](Callback*) {}));
  if (options.verbose > 0) cbs.push_back(std::make_shared<ProgressBar>());
  detail::CallbackList callbacks(cbs, this, params);

  // A run resumed at or past max_steps trains no further.
  stop_requested_ = options.max_steps > 0 && global_step_ >= options.max_steps;
  partial_epoch_steps_ = 0;
  epoch_sums_.clear();
  stopped_on_request_ = false;
  RunContext rc;
  rc.training = true;
  rc.seed = seed_;
  rc.device = network_->device();
  // Kept for the whole fit: its page-locked buffers are allocated once.
  const std::shared_ptr<detail::InputStager> stager = stager_for(rc.device);
  detail::CudaProfileWindow cuda_profile(rc.device);  // TNT_CUDA_PROFILE_STEPS

  Logs logs;
  callbacks.each([&](Callback& c) { c.on_train_begin(logs); });
  // A stop_training() there by a callback on the master alone is every rank's.
  if (!ps_ && size() > 1) stop_requested_ = communicator().allreduce_max(stop_requested_ ? 1.0 : 0.0) > 0;
  for (int epoch = options.initial_epoch; epoch < options.epochs && !stop_requested_; ++epoch) {
    const double epoch_start = now_s();
    logs.clear();
    callbacks.at_epoch(epoch);
    if (epoch == options.initial_epoch && options.initial_step > 0) {
      logs[detail::kResumedStepKey] = static_cast<double>(options.initial_step);
    }
    callbacks.each([&](Callback& c) { c.on_epoch_begin(epoch, logs); });
    logs.erase(detail::kResumedStepKey);
    callbacks.epoch_begun();
    detail::PassTotals totals(metrics_, /*restore=*/false, rc.device, stager.get());
    // A stop_training() by a callback on some ranks only (the master's) would end this rank's
    // epoch alone, the others waiting at its next step: it travels with the next step's
    // metrics instead, and every rank stops after that step.
    auto defer_some_ranks_stop = [&] {
      if (!callbacks.take_some_ranks_stop() || ps_ || size() == 1) return;
      stop_requested_ = false;
      totals.request_stop_training();
    };
    defer_some_ranks_stop();
    timing_ = EpochTiming{};
    detail::RankBalance* balance = ps_ ? nullptr : balance_.get();
    if (balance) balance->epoch_begin();
    double lr_used = optimizer_->learning_rate();

    const int64_t first_step = epoch == options.initial_epoch ? options.initial_step : 0;
    callbacks.step_ended(first_step);  // a resumed epoch: the steps before this process's
    // Resumed at a checkpoint inside this epoch: its logs cover the steps before it too.
    const bool carried = first_step > 0 && first_step == checkpoint_epoch_step_ && totals.carry(checkpoint_epoch_sums_);
    // ... and its seconds, so that the row's time covers the steps its loss does.
    const double carried_s = carried ? checkpoint_epoch_seconds_ : 0.0;
    NextBatch next = with_staging(with_sample_weights(source(epoch, first_step), network_->inputs().size(), loss_,
                                                      options.class_weight, class_count(), "fit"),
                                  stager);
    bool ran_out = false;  // the epoch's data ended (else a stop cut it, unless it was its last step)
    int64_t step = first_step;
    for (; !stop_requested_; ++step) {
      const double t_input = now_s();
      if (balance) balance->step_begin(t_input);
      std::optional<Batch> batch = next();
      if (!batch) {
        ran_out = true;
        break;
      }
      timing_.input_seconds += now_s() - t_input;
      if (balance) balance->input_done(now_s());
      if (fit_global_batch_ == 0 && batch->global_batch_size > 0) {  // the ranks' own micro-batches
        check_checkpoint_batch(batch->global_batch_size);             // alike on every rank (user_source)
        fit_global_batch_ = batch->global_batch_size;
      }
      // Opens/closes the window; the input wait; on a GPU the step's reference event.
      timeline::step_begin(global_step_ + 1, epoch, t_input, network_->device());
      cuda_profile.step_begin(global_step_ + 1);
      Span step_span(Lane::compute, "step", timeline::on_device, [&] { return fmt::format(R"("epoch":{},"batch":{})", epoch, step); });
      callbacks.each([&](Callback& c) { c.on_train_batch_begin(step, logs); });
      defer_some_ranks_stop();
      lr_used = optimizer_->learning_rate();
      const double t0 = now_s();
      if (balance) balance->compute_begin(t0);
      try {
        train_step(*batch, rc, totals);
        Span span(Lane::compute, "metrics");
        const double t_metrics = now_s();
        if (balance) balance->step_end(t_metrics);
        logs = ps_ ? totals.local() : totals.global();
        if (balance) balance->met(now_s());
        if (profiler_) profiler_->collective(now_s() - t_metrics, totals.global_bytes(), /*in_forward=*/false);
        if (!ps_ && totals.stop_agreed()) {  // the same step on every rank: the allreduce's value
          stop_requested_ = stopped_on_request_ = true;
          clear_stop_request();
          tell_launcher_stop_requested();
        }
        if (!ps_ && totals.stop_training_agreed()) stop_requested_ = true;
      } catch (const InputError& e) {
        throw InputError(fmt::format("{} (training: epoch {}, step {} of the epoch; {})", e.what(), epoch + 1,
                                     step + 1, batch_layout(*batch, options.distribute_dataset, rank(), size())));
      }
      timing_.step_seconds += now_s() - t0;  // the step and its metrics' allreduce
      timing_.samples += static_cast<double>(batch->real_samples);
      if (profiler_) {
        profiler_->phases.input_s = t0 - t_input;
        profiler_->phases.step_s = now_s() - t0;
        profiler_->step_done(*reducer_, communicator(), rc.device);
      }
      cuda_profile.step_end(global_step_);
      if (scaler_.enabled()) logs["loss_scale"] = scaler_.scale();
      callbacks.step_ended(step + 1);
      callbacks.each([&](Callback& c) { c.on_train_batch_end(step, logs); });
      defer_some_ranks_stop();
      if (options.max_steps > 0 && global_step_ >= options.max_steps) stop_requested_ = true;
    }
    if (carried && step == first_step) {  // no step of it was left
      logs = totals.global();
      if (!ps_ && totals.stop_training_agreed()) stop_requested_ = true;
    }
    // A stop on request skips a validation due now: the epoch is then saved as unfinished
    // (all its steps, not its end), and a resume runs the validation.
    const bool validation_due = validation && ((epoch + 1) % options.validation_freq == 0 || epoch + 1 == options.epochs);
    partial_epoch_steps_ = !ran_out && (steps < 0 || step < steps || (stopped_on_request_ && validation_due)) ? step : 0;
    epoch_sums_ = partial_epoch_steps_ > 0 ? totals.last_global() : std::vector<double>{};
    epoch_seconds_ = partial_epoch_steps_ > 0 ? now_s() - epoch_start + carried_s : 0.0;
    if (stager) stager->end_pass();
    if (ps_) ps_->pause();
    timing_.global_batch = fit_global_batch_;
    timing_.finish();
    // Every rank's own work a step (collective): who the others waited for.
    detail::EpochBalance verdict;
    if (balance) verdict = detail::epoch_balance(*balance, communicator(), timing_);
    // The epoch's step events on disk before its history row: here, before the validation's
    // collectives, so that every rank has written its part before the master can finish the
    // epoch and write the row.
    timeline::epoch_end();
    const Logs step_logs = logs;
    // A parameter-server worker runs it again if a worker is lost in it (PsWorker::end_epoch).
    auto end_work = [&] {
      logs = step_logs;
      if (ps_ && !logs.empty()) logs = totals.global();  // the epoch's row: every worker's samples
      if (ps_) {
        ps_->epoch_end(logs);  // the servers' variables and optimizer state, for validation, checkpoints
        const double own_s = timing_.step_seconds * static_cast<double>(timing_.steps);  // means by now
        timing_.job_samples_per_second = ps_->job_rate(own_s > 0 ? timing_.samples / own_s : 0.0);
      }
      // A resume at an epoch's end of steps ran them before (its sums may not have come).
      const bool ran_steps = !logs.empty() || (first_step > 0 && first_step == steps);
      // A stop on request (a batch system's warning: time is short) leaves out the validation.
      if (validation && !stopped_on_request_ &&
          ((ran_steps && (epoch + 1) % options.validation_freq == 0) || epoch + 1 == options.epochs)) {
        Span span(Lane::compute, "evaluation");
        if (ps_ && options.validation_data && size() != validation_ranks) regrouped = validation_set(options);
        const DistributedDataset& vset = regrouped ? *regrouped : *validation;
        EvalParams eval;
        eval.steps = vset.steps();
        eval.batch_size = vset.global_batch_size();
        if (options.validation_data) eval.samples = options.validation_data->cardinality();
        eval.verbose = options.verbose;
        Logs evaluated;
        try {
          evaluated = run_evaluate(distributed_source(vset, 0), {}, eval, &callbacks);
        } catch (const InputError& e) {
          throw InputError(fmt::format("in the validation data, after epoch {}: {}", epoch + 1, e.what()));
        }
        for (auto& [k, v] : evaluated) logs["val_" + k] = v;
      }
    };
    if (ps_) ps_->end_epoch(end_work); else end_work();
    logs["learning_rate"] = lr_used;
    logs["seconds"] = now_s() - epoch_start + carried_s;
    if (options.verbose >= 2 || log_enabled(LogLevel::info)) print("{}", describe_epoch_timing(epoch + 1, timing_, size()));
    Span span(Lane::compute, "epoch end callbacks");
    callbacks.each([&](Callback& c) { c.on_epoch_end(epoch, logs); });
    if (balance && reducer_) {  // after the progress bar's line
      balance->warn(epoch + 1, verdict, reducer_->threshold_bytes(), config().fusion_threshold_kb.automatic);
    }
    // A stop asked for on some ranks only (a callback on the master calling stop_training)
    // is every rank's: the others would otherwise wait at the next step's collectives.
    const bool stop_here = stop_requested_ || totals.stop_training_pending();
    if (!ps_) stop_requested_ = communicator().allreduce_max(stop_here ? 1.0 : 0.0) > 0;
  }
  callbacks.each([&](Callback& c) { c.on_train_end(logs); });
  if (profiler_) profiler_->fit_end(*reducer_, communicator(), rc.device);
  timeline::fit_end(communicator());  // collective: the master writes the timeline file
  return history;
}

}  // namespace tnt
