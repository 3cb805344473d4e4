// The data-parallel training loop (see model.hpp for the semantics it keeps): train_step and
// test_step, the fit / evaluate / predict loops around them. Checkpoints: model_checkpoint.cpp.
#include "tarantella/model.hpp"

#include "comm/agreement.hpp"
#include "comm/collective_scope.hpp"
#include "core/clock.hpp"
#include "io/timeline.hpp"
#include "train/layer_spans.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"
#include "train/staging.hpp"
#include "step/step_scalars.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <typeinfo>

namespace tnt {

namespace {

using detail::NextBatch;
using detail::now_s;
using timeline::Lane;
using Span = timeline::Span;

bool runs_on_this_rank(Callback::Ranks ranks) {
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

}  // namespace

// Calls each callback that runs on this rank.
class detail::CallbackList {
 public:
  CallbackList(std::vector<CallbackPtr> callbacks, Model* model, const TrainParams& params) {
    for (auto& cb : callbacks) {
      if (!cb) continue;
      if (!runs_on_this_rank(cb->ranks())) continue;
      cb->set_model(model);
      cb->set_params(params);
      const Callback& named = *cb;
      names_.push_back(fmt::format("callback '{}'", detail::readable_type_name(typeid(named).name())));
      list_.push_back(std::move(cb));
    }
  }
  template <typename F>
  void each(F&& f) {
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
      f(cb);
    }
  }

 private:
  std::vector<std::string> names_;  // for messages, beside list_
  std::vector<CallbackPtr> list_;
};

namespace {

NextBatch distributed_source(const DistributedDataset& data, int64_t epoch) {
  auto it = std::make_shared<DistributedDataset::Iterator>(data.iterate(epoch));
  return [it]() { return it->next(); };
}

// The user's micro-batches: every element is {inputs..., target}, each (b, ...). All ranks
// must have the same number of steps; a mismatch is detected (not hung on) because each
// step agrees on "does every rank have a batch" first.
NextBatch user_source(const Dataset& data, int64_t epoch, int64_t expected_micro) {
  auto it = std::make_shared<Dataset::Iterator>(data.iterate(epoch));
  auto step = std::make_shared<int64_t>(0);
  return [it, step, expected_micro]() -> std::optional<Batch> {
    std::optional<Element> e = it->next();
    int64_t b = e ? (e->empty() ? 0 : e->front().dim(0)) : 0;
    // Every rank's micro-batch size (-1: none left) gives the global size and this rank's
    // offset, and shows a rank that ran out early.
    std::vector<int64_t> sizes = communicator().allgather(e ? b : int64_t{-1});
    int64_t with_data = 0, global = 0, offset = 0;
    for (int q = 0; q < static_cast<int>(sizes.size()); ++q) {
      if (sizes[q] < 0) continue;
      ++with_data;
      global += sizes[q];
      if (q < rank()) offset += sizes[q];
    }
    TNT_INPUT_CHECK(with_data == 0 || with_data == size(),
                    "distribute_dataset=false: the ranks ran out of micro-batches at different steps (step {}: {} of {} "
                    "ranks still had data); every rank must yield the same number of micro-batches",
                    *step, with_data, size());
    if (!e) return std::nullopt;
    TNT_INPUT_CHECK(expected_micro <= 0 || b == expected_micro,
                    "micro_batch_size={} but the dataset yields micro-batches of {} samples on rank {} (step {})",
                    expected_micro, b, rank(), *step);
    Batch batch;
    batch.columns = std::move(*e);
    batch.micro_batch_size = b;
    batch.real_samples = b;
    batch.global_real_samples = global;
    batch.global_batch_size = global;
    batch.sample_offset = offset;
    batch.step = (*step)++;
    return batch;
  };
}

// A batch column on the model's device: data already there (synthetic batches made on the
// GPU once) are used as they are; nothing in a step writes to its inputs.
Tensor on_device(const Tensor& t, Device device) { return t.device() == device ? t : t.to(device); }

// The real samples of a micro-batch are its first `real` rows (see Batch), so losses and
// metrics look at a prefix.
Tensor rows(const Tensor& t, int64_t n) { return n == t.dim(0) ? t : t.slice_rows(0, n); }

// The batch's sample weights (b,) f32 on the host: its weight column (taken out of
// batch.columns) times the class weights of its labels; padding rows weigh 0.
Tensor batch_sample_weights(Batch& batch, size_t n_in, const Loss& loss, const ClassWeight& class_weight,
                            const char* what) {
  TNT_INPUT_CHECK(loss.supports_sample_weights(), "{}: {} does not support sample weights (given by {})", what,
                  loss.name(), class_weight.empty() ? "the data's weight column" : "class_weight");
  const int64_t b = batch.micro_batch_size, real = batch.real_samples;
  std::vector<double> w(static_cast<size_t>(b), 1.0);
  if (batch.columns.size() == n_in + 2) {
    Tensor column = batch.columns.back();
    batch.columns.pop_back();
    TNT_INPUT_CHECK(column.ndim() >= 1 && column.dim(0) == b && column.numel() == b,
                    "{}: the sample weight column (column {}, after the target) must hold one number per sample; it "
                    "is {}",
                    what, n_in + 1, column.str());
    w = column.to_double_vector();
  }
  if (!class_weight.empty()) {
    std::vector<double> cw = sample_weights_for_classes(loss, rows(batch.columns.at(n_in), real), class_weight);
    for (int64_t i = 0; i < real; ++i) w[i] *= cw[i];
  }
  Tensor weights = Tensor::zeros({b}, DType::f32);  // (b,)
  for (int64_t i = 0; i < real; ++i) {
    TNT_INPUT_CHECK(std::isfinite(w[i]) && w[i] >= 0,
                    "{}: sample weight {} of sample {} in global batch {} is not finite and >= 0", what, w[i],
                    batch.sample_offset + i, batch.step);
    weights.data<float>()[i] = static_cast<float>(w[i]);
  }
  return weights;
}

// Moves each batch's weights into Batch::sample_weights (see model.hpp). A bad weight is seen
// on one rank only, so the ranks agree on every weighted batch, and all of them throw.
NextBatch with_sample_weights(NextBatch next, size_t n_in, const LossPtr& loss, const ClassWeight& class_weight,
                              const char* what) {
  check_class_weight(class_weight);  // the same options on every rank
  return [next = std::move(next), n_in, loss, class_weight, what]() -> std::optional<Batch> {
    std::optional<Batch> batch = next();
    if (!batch || (batch->columns.size() != n_in + 2 && class_weight.empty())) return batch;
    std::string problem;
    try {
      batch->sample_weights = batch_sample_weights(*batch, n_in, *loss, class_weight, what);
    } catch (const InputError& e) {
      problem = e.what();
    }
    std::optional<detail::Disagreement> d = detail::find_disagreement(communicator(), {problem});
    if (!problem.empty() && !d) TNT_INPUT_ERROR("{}", problem);
    if (d) {
      for (const auto& [text, ranks] : d->groups) {
        if (!text.empty()) TNT_INPUT_ERROR("{} (on rank(s) {})", text, detail::rank_list(ranks));
      }
    }
    return batch;
  };
}

// Stages each batch on the device one batch ahead (train/staging.hpp): the batch handed out
// was queued to the device before the step before it ran, and the next one is queued now,
// before this one's step. So every rank fetches batch k + 1 before step k: the batch
// sources' own collectives (sizes, sample-weight checks) stay in the same order on every rank.
NextBatch with_staging(NextBatch next, const std::shared_ptr<detail::InputStager>& stager) {
  if (!stager) return next;
  auto ahead = std::make_shared<std::optional<Batch>>();
  auto started = std::make_shared<bool>(false);
  return [next = std::move(next), stager, ahead, started]() -> std::optional<Batch> {
    stager->step_queued();  // the last batch's step is queued: its slot may be refilled later
    if (!*started) {
      *started = true;
      *ahead = next();
      if (*ahead) stager->stage(**ahead);
    }
    std::optional<Batch> current = std::move(*ahead);
    ahead->reset();
    if (!current) return current;
    *ahead = next();
    if (*ahead) stager->stage(**ahead);
    return current;
  };
}

// The stager of a pass on `device`: CUDA with TNT_PINNED_STAGING not 0.
std::shared_ptr<detail::InputStager> stager_for(Device device) {
  const bool enabled = detail::pinned_staging_enabled();  // validated on every device
  if (!device.is_cuda() || !enabled) return nullptr;
  return std::make_shared<detail::InputStager>(device);
}

// "v" when every rank holds v, else "v0, v1, ... (ranks 0 to p-1)".
std::string per_rank(const std::vector<int64_t>& values) {
  if (std::all_of(values.begin(), values.end(), [&](int64_t v) { return v == values.front(); })) {
    return std::to_string(values.front());
  }
  return fmt::format("{} (ranks 0 to {})", fmt::join(values, ", "), values.size() - 1);
}

// The global batch of a distributed pass ("Local batch sizes" in model.hpp): `batch` as
// given, or `micro` x ranks when only that is given; batch_name and micro_name are the
// options' names for messages. Collective when batch is given: with a batch the ranks do not
// divide, their shares differ, so a micro_batch_size may fit some ranks only; every rank
// looks at every rank's value, and all of them throw alike (none waits for the others in
// the pass's first collective).
int64_t global_batch_of(const char* what, const char* batch_name, int64_t batch, const char* micro_name,
                        int64_t micro) {
  const int p = size();
  TNT_INPUT_CHECK(batch >= 0, "{}: {}={} must be positive (the GLOBAL batch size), or 0 to use {} x ranks", what,
                  batch_name, batch, micro_name);
  TNT_INPUT_CHECK(micro >= 0, "{}: {}={} must be positive (per rank), or 0", what, micro_name, micro);
  if (batch == 0) {
    TNT_INPUT_CHECK(micro > 0,
                    "{}: {}=0 and {}=0: give {} (the GLOBAL batch, split over the ranks) or {} (per rank: the "
                    "dataset is then batched with {} x ranks)",
                    what, batch_name, micro_name, batch_name, micro_name, micro_name);
    TNT_INPUT_CHECK(micro <= std::numeric_limits<int64_t>::max() / p, "{}: {}={} x {} ranks is too large", what,
                    micro_name, micro, p);
    return micro * p;
  }
  TNT_INPUT_CHECK(batch >= p, "{}: the global batch size {} is smaller than the number of ranks {}", what, batch, p);
  const std::vector<int64_t> micros = communicator().allgather(micro);
  std::vector<int64_t> shares;
  bool agree = true;
  for (int q = 0; q < p; ++q) {
    shares.push_back(micro_batch_size(batch, q, p));
    agree = agree && (micros[q] == 0 || micros[q] == shares.back());
  }
  TNT_INPUT_CHECK(agree,
                  "{}: {}={} disagrees with {}={}: over {} that is {} samples per rank; give one of the two ({}=0 "
                  "batches with {} x ranks)",
                  what, micro_name, per_rank(micros), batch_name, batch, p == 1 ? "1 rank" : fmt::format("{} ranks", p),
                  per_rank(shares), batch_name, micro_name);
  return batch;
}

}  // namespace

namespace detail {

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
    std::vector<double> sums{loss_sum_, samples_, error_.empty() ? 0.0 : 1.0};
    for (auto& m : metrics_) {
      const std::vector<double> s = m->sums();  // 2 for most metrics, a histogram for AUC
      sums.insert(sums.end(), s.begin(), s.end());
    }
    std::vector<double> all = communicator().allreduce_sum(sums);
    if (all[2] > 0) raise_error();
    Logs logs;
    logs["loss"] = all[1] > 0 ? all[0] / all[1] : 0.0;
    auto at = all.begin() + 3;
    for (auto& m : metrics_) {
      const auto end = at + static_cast<std::ptrdiff_t>(m->sums().size());
      logs[m->name()] = m->value_of(std::vector<double>(at, end));
      at = end;
    }
    return logs;
  }

 private:
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
};

}  // namespace detail

Model::Model(std::shared_ptr<Network> network, uint64_t seed) : network_(std::move(network)), seed_(seed) {
  TNT_CHECK(network_, "Model needs a network");
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
  optimizer_ = std::move(optimizer);
  loss_ = std::move(loss);
  metrics_ = std::move(metrics);
  optimizer_->init_state(network_->trainable_parameters());
  reducer_.reset();
  precision_ = precision;
  scaler_ = scaler;
  network_->set_compute_dtype(cdt);
  if (precision_.mixed() && network_->device().is_cpu()) {
    log_warning("mixed precision {} on the CPU is emulated: activations are stored in {}, but the CPU engines "
                "compute in f32, so it is no faster than fp32 (meant for trying a GPU program out on a CPU)",
                precision_.name(), dtype_name(cdt));
  }
}

void Model::check_compiled(const char* what) const {
  TNT_INPUT_CHECK(compiled(), "Model::{} called before Model::compile", what);
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
  optimizer_->set_learning_rate(lr);
}

void Model::broadcast_weights() {
  Communicator& comm = communicator();
  for (auto& p : network_->named_parameters()) comm.broadcast(p.param->value, master_rank());
  for (auto& b : network_->named_buffers()) comm.broadcast(b.param->value, master_rank());
  weights_synced_ = true;
}

// ---------------------------------------------------------------------------------------
// The steps

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

// The real units of a step (loss.hpp): samples, or for a token-level loss the real tokens,
// counted from the batch's host target column when it has one, so that no device read is
// needed (the count goes into an allreduce before the loss, so it cannot wait for the step's
// one readback at the end).
// batch_target: the batch's own target column; device_target: the step's copy of it.
int64_t step_units(const Loss& loss, const Tensor& batch_target, const Tensor& device_target, int64_t real) {
  if (!loss.normalizes_by_tokens()) return real;
  if (real == 0) return 0;
  return loss.count_tokens(rows(batch_target.device().is_cpu() ? batch_target : device_target, real));
}

}  // namespace

// One training step on this rank's micro-batch: forward, the loss of the GLOBAL batch (each
// rank divides by the global count, so the SUM of the ranks' gradients is the serial
// gradient), backward with the Reducer summing each gradient as soon as it is final, then
// the same update on every rank.
void Model::train_step(const Batch& batch, RunContext& rc, detail::PassTotals& totals) {
  StepInputs in = step_inputs(batch, "fit", totals.staging());
  detail::StepScalars::Scope readback(totals.scalars());  // the losses' and metrics' results
  const int64_t real = batch.real_samples;
  rc.step = global_step_;
  rc.sample_offset = batch.sample_offset;
  network_->zero_grad();
  Tensor pred;
  {
    Span span(Lane::compute, "forward", timeline::on_device);
    pred = network_->forward(in.inputs, rc).at(0);
  }

  // Padding rows get a zero gradient: they are computed but never counted.
  Tensor grad_pred;
  if (real < batch.micro_batch_size) grad_pred = Tensor::zeros(pred.shape(), pred.dtype(), pred.device());
  // A token-level loss is averaged over the global number of real tokens (loss.hpp).
  const bool by_tokens = loss_->normalizes_by_tokens();
  const int64_t units = step_units(*loss_, batch.columns.at(network_->inputs().size()), in.target, real);
  const int64_t global_units = by_tokens ? communicator().allreduce_sum(units) : batch.global_real_samples;
  if (real > 0) {
    Span span(Lane::compute, "loss", timeline::on_device);
    SavedState ls;
    const int64_t global_real = std::max<int64_t>(global_units, 1);
    Tensor loss = loss_->forward_weighted(rows(pred, real), rows(in.target, real), in.weights, global_real, ls);
    Tensor g = loss_->backward(ls, scaler_.scale());
    if (real == batch.micro_batch_size) {
      grad_pred = g;
    } else {
      Tensor head = grad_pred.slice_rows(0, real);
      head.copy_from(g);
    }
    totals.add(pred, in.target, real, loss, static_cast<double>(global_real), units);
  }

  const double t_bwd = now_s();
  double t_bwd_end = 0;
  try {
    {
      Span span(Lane::compute, "backward", timeline::on_device);
      timeline::LayerSpans layers(&trainable_);
      network_->backward({grad_pred}, rc, [&](size_t index, Parameter&) {
        layers.gradient_ready(index);
        reducer_->mark_ready(index);
      });
    }
    t_bwd_end = now_s();
    Span span(Lane::compute, "wait for gradients");
    reducer_->finalize(1.0 / scaler_.scale());  // the loss scale is divided out here
  } catch (...) {
    // The Reducer may be left mid-step, its thread still reducing this step's buckets.
    // Destroying it cancels them; the next fit() builds a fresh one (on every rank,
    // since the peers fail this step too, on their collective timeout at the latest).
    reducer_.reset();
    throw;
  }
  const double t_comm_end = now_s();

  // The step's one readback: the loss, the metrics' counts and checks, the overflow flag. A
  // bad label found there does not stop the update: every rank applies it alike (replicas
  // stay equal), and the logs' allreduce right after raises the error on every rank.
  bool overflow = false;
  if (scaler_.enabled()) {
    detail::defer_has_non_finite(totals.scalars(), trainable_grads_, [&overflow](bool found) { overflow = found; });
  }
  {
    Span span(Lane::compute, "step results");
    timeline::Readback anchor;  // the GPU lanes' clock (io/timeline_gpu.hpp); no wait of its own
    totals.finish_step();
  }

  // The summed gradients are bitwise equal on every rank, so every rank decides alike.
  Span span(Lane::compute, "optimizer", timeline::on_device);
  if (!scaler_.enabled() || scaler_.update(overflow)) {
    optimizer_->step(trainable_);
  } else {
    // A skipped step still moves the schedule on (as Keras' LossScaleOptimizer and a
    // PyTorch scheduler stepped every batch), so warmup and decay stay on their batches.
    optimizer_->set_step_count(optimizer_->step_count() + 1);
  }
  ++global_step_;

  timing_.steps++;
  timing_.backward_seconds += t_bwd_end - t_bwd;
  timing_.exposed_comm_seconds += t_comm_end - t_bwd_end;
  timing_.comm_seconds += reducer_->last_step().comm_s();
  timing_.hidden_comm_seconds += reducer_->last_step().hidden_s();
}

void Model::test_step(const Batch& batch, const RunContext& rc, detail::PassTotals& totals) {
  StepInputs in = step_inputs(batch, "evaluate", totals.staging());
  detail::StepScalars::Scope readback(totals.scalars());
  const int64_t real = batch.real_samples;
  Span span(Lane::compute, "evaluation step", timeline::on_device);
  const Tensor pred = network_->forward(in.inputs, rc, false).at(0);
  if (real == 0) return;
  SavedState ls;
  // Divided by 1: this rank's plain sum of per-sample losses.
  const Tensor loss = loss_->forward_weighted(rows(pred, real), rows(in.target, real), in.weights, 1, ls);
  const int64_t units = step_units(*loss_, batch.columns.at(network_->inputs().size()), in.target, real);
  totals.add(pred, in.target, real, loss, 1.0, units);
  totals.finish_step();  // one readback a step
}

// ---------------------------------------------------------------------------------------
// fit

std::optional<DistributedDataset> Model::validation_set(const FitOptions& options) const {
  TNT_INPUT_CHECK(!(options.validation_data && options.distributed_validation_data),
                  "fit: both validation_data and distributed_validation_data are given; pass one of them");
  if (options.distributed_validation_data) return *options.distributed_validation_data;
  if (!options.validation_data) return std::nullopt;
  const int p = size();
  int64_t vb = 0;
  if (options.validation_batch_size != 0 || options.validation_micro_batch_size != 0) {
    vb = global_batch_of("fit", "validation_batch_size", options.validation_batch_size,
                         "validation_micro_batch_size", options.validation_micro_batch_size);
  } else {
    vb = options.batch_size;
    TNT_INPUT_CHECK(vb >= p, "fit: the validation batch size {} is smaller than the number of ranks {}", vb, p);
  }
  return options.validation_data->distribute(vb, rank(), p, Remainder::pad);
}

namespace {

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
  const Dataset data = options.validation_split != 0 ? split_off_validation(all_data, options) : all_data;
  const int p = size();
  if (!options.distribute_dataset) {
    // The data are already this rank's micro-batches.
    const int64_t micro = options.micro_batch_size;
    return run_fit([data, micro](int64_t epoch) { return user_source(data, epoch, micro); }, data.cardinality(),
                   validation_set(options), options);
  }
  // The global batch is also what callbacks and the validation default see.
  options.batch_size =
      global_batch_of("fit", "batch_size", options.batch_size, "micro_batch_size", options.micro_batch_size);
  DistributedDataset train = data.distribute(options.batch_size, rank(), p, options.remainder);
  if (options.prefetch > 0) train = train.prefetch(options.prefetch);
  return run_fit([train](int64_t epoch) { return distributed_source(train, epoch); }, train.steps(),
                 validation_set(options), options);
}

History Model::fit(const DistributedDataset& data, FitOptions options) {
  check_compiled("fit");
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
  return run_fit([data](int64_t epoch) { return distributed_source(data, epoch); }, data.steps(),
                 validation_set(options), options);
}

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
  if (std::optional<detail::Disagreement> d = detail::find_disagreement(communicator(), {mine, clipping})) {
    TNT_INPUT_CHECK(d->entry != 1,
                    "fit: the ranks' optimizers clip gradients differently ({}); every rank must pass the same "
                    "GradientClipping",
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
  if (!reducer_) {
    reducer_params_ = params;
    std::vector<std::pair<std::string, Tensor>> grads;
    for (auto& np : trainable_) grads.emplace_back(np.name, np.param->grad);
    reducer_ = std::make_unique<Reducer>(communicator(), grads);
  }
}

History Model::run_fit(const std::function<NextBatch(int64_t)>& source, int64_t steps,
                       const std::optional<DistributedDataset>& validation, const FitOptions& options) {
  TNT_INPUT_CHECK(options.epochs >= options.initial_epoch, "fit: epochs={} is smaller than initial_epoch={}",
                  options.epochs, options.initial_epoch);
  TNT_INPUT_CHECK(options.validation_freq > 0, "fit: validation_freq must be positive");
  TNT_INPUT_CHECK(options.total_epochs == 0 || options.total_epochs >= options.epochs,
                  "fit: total_epochs={} is smaller than epochs={}", options.total_epochs, options.epochs);
  prepare_training();

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
  std::vector<CallbackPtr> cbs = options.callbacks;
  cbs.insert(cbs.begin(), std::shared_ptr<Callback>(&history, [](Callback*) {}));
  if (options.verbose > 0) cbs.push_back(std::make_shared<ProgressBar>());
  detail::CallbackList callbacks(cbs, this, params);

  // A run resumed at or past max_steps trains no further.
  stop_requested_ = options.max_steps > 0 && global_step_ >= options.max_steps;
  RunContext rc;
  rc.training = true;
  rc.seed = seed_;
  rc.device = network_->device();
  // Kept for the whole fit: its page-locked buffers are allocated once.
  const std::shared_ptr<detail::InputStager> stager = stager_for(rc.device);

  Logs logs;
  callbacks.each([&](Callback& c) { c.on_train_begin(logs); });
  for (int epoch = options.initial_epoch; epoch < options.epochs && !stop_requested_; ++epoch) {
    const double epoch_start = now_s();
    logs.clear();
    callbacks.each([&](Callback& c) { c.on_epoch_begin(epoch, logs); });
    detail::PassTotals totals(metrics_, /*restore=*/false, rc.device, stager.get());
    timing_ = EpochTiming{};
    double lr_used = optimizer_->learning_rate();

    NextBatch next = with_staging(
        with_sample_weights(source(epoch), network_->inputs().size(), loss_, options.class_weight, "fit"), stager);
    for (int64_t step = 0; !stop_requested_; ++step) {
      const double t_input = now_s();
      std::optional<Batch> batch = next();
      if (!batch) break;
      // Opens/closes the window; the input wait; on a GPU the step's reference event.
      timeline::step_begin(global_step_ + 1, epoch, t_input, network_->device());
      Span step_span(Lane::compute, "step", timeline::on_device, [&] { return fmt::format(R"("epoch":{},"batch":{})", epoch, step); });
      callbacks.each([&](Callback& c) { c.on_train_batch_begin(step, logs); });
      lr_used = optimizer_->learning_rate();
      const double t0 = now_s();
      train_step(*batch, rc, totals);
      {
        Span span(Lane::compute, "metrics");
        logs = totals.global();
      }
      timing_.step_seconds += now_s() - t0;  // the step and its metrics' allreduce
      if (scaler_.enabled()) logs["loss_scale"] = scaler_.scale();
      callbacks.each([&](Callback& c) { c.on_train_batch_end(step, logs); });
      if (options.max_steps > 0 && global_step_ >= options.max_steps) stop_requested_ = true;
    }
    if (stager) stager->end_pass();
    timing_.finish();
    // The epoch's step events on disk before its history row: here, before the validation's
    // collectives, so that every rank has written its part before the master can finish the
    // epoch and write the row.
    timeline::epoch_end();

    const bool ran_steps = !logs.empty();
    if (validation && ((ran_steps && (epoch + 1) % options.validation_freq == 0) || epoch + 1 == options.epochs)) {
      Span span(Lane::compute, "evaluation");
      EvalParams eval;
      eval.steps = validation->steps();
      eval.batch_size = validation->global_batch_size();
      if (options.validation_data) eval.samples = options.validation_data->cardinality();
      eval.verbose = options.verbose;
      for (auto& [k, v] : run_evaluate(distributed_source(*validation, 0), {}, eval, &callbacks)) logs["val_" + k] = v;
    }
    logs["learning_rate"] = lr_used;
    logs["seconds"] = now_s() - epoch_start;
    if (options.verbose >= 2 || log_enabled(LogLevel::info)) print("{}", describe_epoch_timing(epoch + 1, timing_, size()));
    Span span(Lane::compute, "epoch end callbacks");
    callbacks.each([&](Callback& c) { c.on_epoch_end(epoch, logs); });
  }
  callbacks.each([&](Callback& c) { c.on_train_end(logs); });
  timeline::fit_end(communicator());  // collective: the master writes the timeline file
  return history;
}

std::string describe_epoch_timing(int epoch, const EpochTiming& t, int ranks) {
  std::string line = fmt::format("epoch {}: {:.1f} ms/step, backward {:.1f} ms", epoch, t.step_seconds * 1e3,
                                 t.backward_seconds * 1e3);
  if (ranks <= 1) return line + " (1 rank: no gradient allreduce)";
  // The buckets' allreduce time (summed over buckets) and the share of it before backward
  // ended; the wait after backward is the step's own time (it includes unpacking and is not
  // a part of the allreduce time, so the two are reported apart).
  return line + fmt::format("; gradient allreduce {:.1f} ms a step, {:.0f}% of it while backward ran; after "
                            "backward the step waited {:.1f} ms for its gradients",
                            t.comm_seconds * 1e3, t.hidden_fraction() * 100.0, t.exposed_comm_seconds * 1e3);
}

void EpochTiming::finish() {
  if (steps == 0) return;
  const double n = static_cast<double>(steps);
  step_seconds /= n;
  backward_seconds /= n;
  comm_seconds /= n;
  hidden_comm_seconds /= n;
  exposed_comm_seconds /= n;
}

// ---------------------------------------------------------------------------------------
// evaluate and predict

Logs Model::evaluate(const Dataset& data, EvaluateOptions options) {
  check_compiled("evaluate");
  EvalParams eval;
  eval.verbose = options.verbose;
  std::vector<CallbackPtr> bar;
  if (options.verbose > 0) bar.push_back(std::make_shared<ProgressBar>());
  detail::CallbackList callbacks(bar, this, TrainParams{});
  if (!options.distribute_dataset) {
    eval.steps = data.cardinality();  // the ranks' own micro-batches: one a step
    return run_evaluate(user_source(data, 0, options.micro_batch_size), options.class_weight, eval,
                        &callbacks);
  }
  const int64_t global =
      global_batch_of("evaluate", "batch_size", options.batch_size, "micro_batch_size", options.micro_batch_size);
  DistributedDataset distributed = data.distribute(global, rank(), size(), Remainder::pad);
  eval.steps = distributed.steps();
  eval.batch_size = global;
  eval.samples = data.cardinality();
  return run_evaluate(distributed_source(distributed, 0), options.class_weight, eval, &callbacks);
}

Logs Model::evaluate(const DistributedDataset& data, EvaluateOptions options) {
  check_compiled("evaluate");
  TNT_INPUT_CHECK(options.distribute_dataset,
                  "evaluate: distribute_dataset=false with a dataset already distributed (pass the unbatched "
                  "Dataset to evaluate each rank's own micro-batches)");
  TNT_INPUT_CHECK(options.batch_size <= 0 || options.batch_size == data.global_batch_size(),
                  "evaluate: batch_size={} but the distributed dataset was cut into global batches of {}",
                  options.batch_size, data.global_batch_size());
  TNT_INPUT_CHECK(options.micro_batch_size <= 0 || options.micro_batch_size == data.micro_batch_size(),
                  "evaluate: micro_batch_size={} but the distributed dataset gives rank {} {} samples",
                  options.micro_batch_size, rank(), data.micro_batch_size());
  EvalParams eval;
  eval.verbose = options.verbose;
  eval.steps = data.steps();
  eval.batch_size = data.global_batch_size();
  std::vector<CallbackPtr> bar;
  if (options.verbose > 0) bar.push_back(std::make_shared<ProgressBar>());
  detail::CallbackList callbacks(bar, this, TrainParams{});
  return run_evaluate(distributed_source(data, 0), options.class_weight, eval, &callbacks);
}

// callbacks: on_test_begin, on_test_batch_end (empty logs: no collective per step) and
// on_test_end (the global results) with eval as their EvalParams.
Logs Model::run_evaluate(const NextBatch& source, const ClassWeight& class_weight, const EvalParams& eval,
                         detail::CallbackList* callbacks) {
  if (!weights_synced_) broadcast_weights();
  RunContext rc;
  rc.training = false;
  rc.seed = seed_;
  rc.step = global_step_;
  rc.device = network_->device();
  const std::shared_ptr<detail::InputStager> stager = stager_for(rc.device);
  detail::PassTotals totals(metrics_, /*restore=*/true, rc.device, stager.get());
  NextBatch next =
      with_staging(with_sample_weights(source, network_->inputs().size(), loss_, class_weight, "evaluate"), stager);
  const Logs none;
  auto each = [&](auto&& f) {
    if (callbacks) callbacks->each(f);
  };
  each([&](Callback& c) {
    c.set_eval_params(eval);
    c.on_test_begin(none);
  });
  for (int64_t step = 0; std::optional<Batch> batch = next(); ++step) {
    test_step(*batch, rc, totals);
    each([&](Callback& c) { c.on_test_batch_end(step, none); });
  }
  if (stager) stager->end_pass();
  Logs logs = totals.global();
  each([&](Callback& c) { c.on_test_end(logs); });
  return logs;
}

namespace {

// Rows [at, at + rows) of `into` (R, ...) from `part` (rows, ...), both on the host.
void copy_rows(Tensor& into, int64_t at, const Tensor& part) {
  if (part.dim(0) == 0) return;
  Tensor dst = into.slice_rows(at, at + part.dim(0));
  dst.copy_from(part);
}

// The parts stacked along their first dimension: (sum of rows, ...).
Tensor stack_rows(const std::vector<Tensor>& parts) {
  Shape shape = parts.at(0).shape();
  shape[0] = 0;
  for (const Tensor& part : parts) shape[0] += part.dim(0);
  Tensor result = Tensor::empty(shape, parts[0].dtype());
  int64_t at = 0;
  for (const Tensor& part : parts) {
    copy_rows(result, at, part);
    at += part.dim(0);
  }
  return result;
}

// Bytes of one allgather round of predict's outputs per rank: below MPI's int count, and
// small enough that a rank which does not keep the rows (Gather::master) holds little.
constexpr int64_t kGatherChunkBytes = int64_t{64} << 20;

// Every rank's `mine` (rows_q, S...), in rank order, on the ranks that keep them (empty
// tensors elsewhere). Collective: the ranks' row counts first, then rounds of one allgather
// each, of at most kGatherChunkBytes per rank.
std::vector<Tensor> gather_rows(const Tensor& mine, bool keep) {
  Communicator& comm = communicator();
  const int p = size();
  const std::vector<int64_t> rows = comm.allgather(mine.dim(0));
  // The row shape is the network output's, alike on every rank; a rank without real rows
  // (all padding) still has it from its empty tensor.
  const Shape row_shape = mine.shape();
  int64_t elems = 1;
  for (size_t d = 1; d < row_shape.size(); ++d) elems *= row_shape[d];
  const int64_t bytes_per_row = elems * static_cast<int64_t>(dtype_size(mine.dtype()));
  std::vector<Tensor> all(static_cast<size_t>(p));
  if (keep) {
    for (int q = 0; q < p; ++q) {
      Shape shape = row_shape;
      shape[0] = rows[q];
      all[q] = Tensor::empty(shape, mine.dtype());
    }
  }
  const int64_t most = *std::max_element(rows.begin(), rows.end());
  const int64_t chunk = std::max<int64_t>(1, kGatherChunkBytes / std::max<int64_t>(bytes_per_row, 1));
  std::vector<uint8_t> send(static_cast<size_t>(std::min(most, chunk) * bytes_per_row));
  std::vector<uint8_t> received(send.size() * static_cast<size_t>(p));
  const auto* from = static_cast<const uint8_t*>(mine.raw());
  for (int64_t start = 0; start < most; start += chunk) {
    const int64_t n = std::min(chunk, most - start);
    const int64_t own = std::clamp<int64_t>(mine.dim(0) - start, 0, n);
    if (own > 0) std::memcpy(send.data(), from + start * bytes_per_row, static_cast<size_t>(own * bytes_per_row));
    comm.allgather(send.data(), received.data(), n * bytes_per_row, DType::u8, Device::cpu());
    if (!keep) continue;
    for (int q = 0; q < p; ++q) {
      const int64_t theirs = std::clamp<int64_t>(rows[q] - start, 0, n);
      if (theirs == 0) continue;
      auto* to = static_cast<uint8_t*>(all[q].raw());
      std::memcpy(to + start * bytes_per_row, received.data() + static_cast<size_t>(q * n * bytes_per_row),
                  static_cast<size_t>(theirs * bytes_per_row));
    }
  }
  return all;
}

}  // namespace

Tensor Model::predict_rows(const detail::NextBatch& next, const char* what, std::vector<int64_t>* global_real) {
  if (!weights_synced_) broadcast_weights();
  RunContext rc;
  rc.training = false;
  rc.seed = seed_;
  rc.device = network_->device();
  const size_t n_in = network_->inputs().size();
  std::vector<Tensor> parts;  // this rank's real rows of each step
  while (std::optional<Batch> batch = next()) {
    TNT_INPUT_CHECK(batch->columns.size() >= n_in, "{}: each element needs {} input column(s); it has {}", what,
                    n_in, batch->columns.size());
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < n_in; ++i) inputs.push_back(on_device(batch->columns[i], rc.device));
    Tensor out = network_->forward(inputs, rc, false).at(0).to(Device::cpu());  // (b, ...)
    parts.push_back(rows(out, batch->real_samples).contiguous());
    if (global_real) global_real->push_back(batch->global_real_samples);
  }
  TNT_INPUT_CHECK(!parts.empty(), "{}: the dataset is empty", what);
  return stack_rows(parts);
}

Tensor Model::predict(const Dataset& data, PredictOptions options) {
  if (!options.distribute_dataset) {
    TNT_INPUT_CHECK(options.batch_size == 0 && options.micro_batch_size == 0,
                    "predict: distribute_dataset=false predicts the dataset's own batches on this rank; batch_size={} "
                    "and micro_batch_size={} must be 0",
                    options.batch_size, options.micro_batch_size);
    auto it = std::make_shared<Dataset::Iterator>(data.iterate(0));
    return predict_rows(
        [it]() -> std::optional<Batch> {
          std::optional<Element> e = it->next();
          if (!e) return std::nullopt;
          Batch b;
          b.columns = std::move(*e);
          b.micro_batch_size = b.real_samples = b.columns.empty() ? 0 : b.columns.front().dim(0);
          return b;
        },
        "predict", nullptr);
  }
  const int p = size();
  const int64_t global =
      global_batch_of("predict", "batch_size", options.batch_size, "micro_batch_size", options.micro_batch_size);
  const DistributedDataset distributed = data.distribute(global, rank(), p, Remainder::pad);
  std::vector<int64_t> step_real;  // real samples of each global batch, alike on every rank
  const Tensor mine = predict_rows(distributed_source(distributed, 0), "predict", &step_real);
  const bool keep = options.gather == Gather::all || is_master_rank();
  const std::vector<Tensor> all = gather_rows(mine, keep);
  if (!keep) return Tensor();
  // Global batch s holds rank q's rows at offset(q), as many as are real there: the
  // dataset's order is step by step, rank by rank.
  std::vector<int64_t> micro(static_cast<size_t>(p)), offset(static_cast<size_t>(p)), taken(static_cast<size_t>(p), 0);
  for (int q = 0; q < p; ++q) {
    micro[q] = micro_batch_size(global, q, p);
    offset[q] = micro_batch_offset(global, q, p);
  }
  int64_t total = 0;
  for (int64_t n : step_real) total += n;
  Shape shape = mine.shape();
  shape[0] = total;
  Tensor result = Tensor::empty(shape, mine.dtype());
  int64_t at = 0;
  for (int64_t n : step_real) {
    for (int q = 0; q < p; ++q) {
      const int64_t count = std::clamp<int64_t>(n - offset[q], 0, micro[q]);
      if (count == 0) continue;
      copy_rows(result, at, all[q].slice_rows(taken[q], taken[q] + count));
      taken[q] += count;
      at += count;
    }
  }
  TNT_CHECK(at == total, "predict: gathered {} of {} rows", at, total);
  for (int q = 0; q < p; ++q) {
    TNT_CHECK(taken[q] == all[q].dim(0), "predict: rank {} sent {} rows, {} placed", q, all[q].dim(0), taken[q]);
  }
  return result;
}

Tensor Model::predict(const Dataset& data, int64_t batch_size) {
  TNT_INPUT_CHECK(batch_size > 0, "predict: batch_size={} must be positive", batch_size);
  PredictOptions local;
  local.distribute_dataset = false;
  return predict(data.batch(batch_size), local);
}

}  // namespace tnt
