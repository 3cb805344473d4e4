// The data-parallel training loop (see model.hpp for the semantics it keeps).
#include "tarantella/model.hpp"

#include "tarantella/checkpoint.hpp"
#include "tarantella/comm.hpp"
#include "core/clock.hpp"
#include "tarantella/log.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"

#include <chrono>
#include <cmath>
#include <functional>

namespace tnt {

namespace {

using detail::now_s;

using detail::NextBatch;

// Calls each callback that runs on this rank.
class CallbackList {
 public:
  CallbackList(std::vector<CallbackPtr> callbacks, Model* model, const TrainParams& params) {
    for (auto& cb : callbacks) {
      if (!cb) continue;
      if (cb->ranks() == Callback::Ranks::master && !(is_master_rank() || config().output_on_all_devices)) continue;
      cb->set_model(model);
      cb->set_params(params);
      list_.push_back(std::move(cb));
    }
  }
  template <typename F>
  void each(F&& f) {
    for (auto& cb : list_) f(*cb);
  }

 private:
  std::vector<CallbackPtr> list_;
};

NextBatch distributed_source(const DistributedDataset& data, int64_t epoch) {
  auto it = std::make_shared<DistributedDataset::Iterator>(data.iterate(epoch));
  int64_t offset = data.micro_batch_offset();
  return [it, offset]() {
    std::optional<Batch> b = it->next();
    if (b) b->sample_offset = offset;
    return b;
  };
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
    if (with_data != 0 && with_data != size()) {
      throw InputError(fmt::format(
          "distribute_dataset=false: the ranks ran out of micro-batches at different steps (step {}: {} of {} ranks "
          "still had data); every rank must yield the same number of micro-batches",
          *step, with_data, size()));
    }
    if (!e) return std::nullopt;
    if (expected_micro > 0 && b != expected_micro) {
      throw InputError(fmt::format(
          "micro_batch_size={} but the dataset yields micro-batches of {} samples on rank {} (step {})", expected_micro, b,
          rank(), *step));
    }
    Batch batch;
    batch.columns = std::move(*e);
    batch.weights = Tensor::full({b}, 1.0);
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

// The real samples of a micro-batch are its first `real` rows (padding goes last, see
// dataset.hpp), so losses and metrics look at a prefix.
Tensor rows(const Tensor& t, int64_t n) { return n == t.dim(0) ? t : t.slice_rows(0, n); }

}  // namespace

Model::Model(std::shared_ptr<Network> network, uint64_t seed) : network_(std::move(network)), seed_(seed) {
  TNT_CHECK(network_, "Model needs a network");
  network_->to(default_device());
  network_->initialize(seed_);
  network_->set_input_gradients(false);
}

Model::~Model() = default;

void Model::compile(std::shared_ptr<Optimizer> optimizer, LossPtr loss, std::vector<MetricPtr> metrics,
                    Precision precision) {
  if (!optimizer) throw InputError("Model::compile: no optimizer given");
  const DType cdt = precision.compute_dtype;
  if (cdt != DType::f32 && cdt != DType::bf16 && cdt != DType::f16) {
    throw InputError(fmt::format("Model::compile: precision with compute dtype {}: expected f32, bf16 or f16",
                                 dtype_name(cdt)));
  }
  LossScaler scaler(precision);  // validates the scaling options
  if (!loss) throw InputError("Model::compile: no loss given");
  for (const auto& m : metrics) {
    if (!m) throw InputError("Model::compile: a metric is null");
  }
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
  if (!compiled()) throw InputError(fmt::format("Model::{} called before Model::compile", what));
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

History Model::fit(const Dataset& data, FitOptions options) {
  check_compiled("fit");
  const int p = size();
  if (options.distribute_dataset) {
    if (options.batch_size <= 0) {
      throw InputError(fmt::format("fit: batch_size={} (the GLOBAL batch size) must be positive", options.batch_size));
    }
    if (options.batch_size < p) {
      throw InputError(fmt::format("fit: the global batch size {} is smaller than the number of ranks {}",
                                   options.batch_size, p));
    }
    int64_t mine = micro_batch_size(options.batch_size, rank(), p);
    if (options.micro_batch_size > 0 && options.micro_batch_size != mine) {
      throw InputError(fmt::format(
          "fit: micro_batch_size={} disagrees with batch_size={} on {} ranks (rank {} gets {} samples)",
          options.micro_batch_size, options.batch_size, p, rank(), mine));
    }
    DistributedDataset train = data.distribute(options.batch_size, rank(), p, options.remainder);
    if (options.prefetch > 0) train = train.prefetch(options.prefetch);
    std::optional<DistributedDataset> val;
    if (options.validation_data) {
      int64_t vb = options.validation_batch_size > 0 ? options.validation_batch_size : options.batch_size;
      if (vb < p) {
        throw InputError(fmt::format("fit: the validation batch size {} is smaller than the number of ranks {}", vb, p));
      }
      int64_t vmine = micro_batch_size(vb, rank(), p);
      if (options.validation_micro_batch_size > 0 && options.validation_micro_batch_size != vmine) {
        throw InputError(fmt::format("fit: validation_micro_batch_size={} disagrees with validation batch size {} on {} ranks",
                                     options.validation_micro_batch_size, vb, p));
      }
      val = options.validation_data->distribute(vb, rank(), p, Remainder::pad);
    } else if (options.distributed_validation_data) {
      val = *options.distributed_validation_data;
    }
    return run_fit([train](int64_t epoch) { return distributed_source(train, epoch); }, train.steps(),
                   val ? &*val : nullptr, options);
  }
  // distribute_dataset = false: the data are already this rank's micro-batches.
  std::optional<DistributedDataset> val;
  if (options.validation_data) {
    int64_t vb = options.validation_batch_size > 0 ? options.validation_batch_size : options.batch_size;
    if (vb < p) throw InputError(fmt::format("fit: validation batch size {} must be at least the number of ranks {}", vb, p));
    val = options.validation_data->distribute(vb, rank(), p, Remainder::pad);
  }
  int64_t micro = options.micro_batch_size;
  return run_fit([data, micro](int64_t epoch) { return user_source(data, epoch, micro); }, data.cardinality(),
                 val ? &*val : nullptr, options);
}

History Model::fit(const DistributedDataset& data, FitOptions options) {
  check_compiled("fit");
  if (options.batch_size > 0 && options.batch_size != data.global_batch_size()) {
    throw InputError(fmt::format("fit: batch_size={} but the distributed dataset was cut into global batches of {}",
                                 options.batch_size, data.global_batch_size()));
  }
  if (options.micro_batch_size > 0 && options.micro_batch_size != data.micro_batch_size()) {
    throw InputError(fmt::format("fit: micro_batch_size={} but the distributed dataset gives rank {} {} samples",
                                 options.micro_batch_size, rank(), data.micro_batch_size()));
  }
  const DistributedDataset* val =
      options.distributed_validation_data ? &*options.distributed_validation_data : nullptr;
  return run_fit([data](int64_t epoch) { return distributed_source(data, epoch); }, data.steps(), val, options);
}

History Model::run_fit(const std::function<detail::NextBatch(int64_t)>& source, int64_t steps,
                       const DistributedDataset* validation, FitOptions& options) {
  if (options.epochs < options.initial_epoch) {
    throw InputError(fmt::format("fit: epochs={} is smaller than initial_epoch={}", options.epochs, options.initial_epoch));
  }
  if (options.validation_freq <= 0) throw InputError("fit: validation_freq must be positive");
  Communicator& comm = communicator();
  if (!weights_synced_) broadcast_weights();
  {
    // Ranks that disagree on the precision or on the loss scale would sum gradients scaled
    // differently and disagree on which steps to skip: their replicas would drift apart
    // without any error. Refuse it up front (the scale itself too: a resumed rank may have
    // read another checkpoint).
    std::string mine = precision_.name();
    if (scaler_.enabled()) {
      mine += fmt::format(" with loss scale {} ({} good steps; x{} after {} good steps, x{} on overflow)", scaler_.scale(),
                          scaler_.good_steps(), precision_.growth_factor, precision_.growth_interval,
                          precision_.backoff_factor);
    } else {
      mine += " without loss scaling";
    }
    std::string master = mine;
    comm.broadcast(master, 0);
    std::vector<int64_t> differs = comm.allgather(int64_t{mine != master ? 1 : 0});
    for (size_t r = 1; r < differs.size(); ++r) {
      if (differs[r] == 0) continue;
      std::string theirs = mine;
      comm.broadcast(theirs, static_cast<int>(r));
      throw InputError(fmt::format("fit: the ranks compiled the model with different precisions (rank 0: {}; rank {}: "
                                   "{}); every rank must pass the same Precision to compile() and load the same "
                                   "checkpoint",
                                   master, r, theirs));
    }
  }

  std::vector<NamedParameter> trainable = network_->trainable_parameters();
  std::vector<Tensor> trainable_grads;
  for (auto& np : trainable) trainable_grads.push_back(np.param->grad);
  std::vector<NamedParameter> all_params = network_->named_parameters();
  // Hook indices are positions in named_parameters(); the Reducer knows trainable ones.
  std::vector<int64_t> reducer_slot(all_params.size(), -1);
  {
    size_t t = 0;
    for (size_t i = 0; i < all_params.size(); ++i) {
      if (t < trainable.size() && all_params[i].param == trainable[t].param) reducer_slot[i] = static_cast<int64_t>(t++);
    }
  }
  if (!reducer_) {
    std::vector<std::pair<std::string, Tensor>> grads;
    for (auto& np : trainable) grads.emplace_back(np.name, np.param->grad);
    reducer_ = std::make_unique<Reducer>(comm, grads);
  }

  History history;
  TrainParams params;
  params.epochs = options.epochs;
  params.initial_epoch = options.initial_epoch;
  params.steps = steps;
  params.verbose = options.verbose;
  params.metrics.push_back("loss");
  for (auto& m : metrics_) params.metrics.push_back(m->name());
  std::vector<CallbackPtr> cbs = options.callbacks;
  cbs.insert(cbs.begin(), std::shared_ptr<Callback>(&history, [](Callback*) {}));
  if (options.verbose > 0) cbs.push_back(std::make_shared<ProgressBar>());
  CallbackList callbacks(cbs, this, params);

  stop_requested_ = false;
  RunContext rc;
  rc.training = true;
  rc.seed = seed_;
  rc.device = network_->device();

  Logs logs;
  callbacks.each([&](Callback& c) { c.on_train_begin(logs); });
  for (int epoch = options.initial_epoch; epoch < options.epochs && !stop_requested_; ++epoch) {
    current_epoch_ = epoch;
    double epoch_start = now_s();
    logs.clear();
    callbacks.each([&](Callback& c) { c.on_epoch_begin(epoch, logs); });
    for (auto& m : metrics_) m->reset();
    double loss_sum = 0;     // this rank: sum of per-sample losses of the epoch so far
    double sample_sum = 0;   // this rank: real samples so far
    timing_ = EpochTiming{};
    double lr_used = optimizer_->learning_rate();

    NextBatch next = source(epoch);
    int64_t step = 0;
    while (!stop_requested_) {
      std::optional<Batch> batch = next();
      if (!batch) break;
      callbacks.each([&](Callback& c) { c.on_train_batch_begin(step, logs); });
      double t0 = now_s();
      const size_t n_in = network_->inputs().size();
      TNT_CHECK(batch->columns.size() == n_in + 1,
                "fit: each element must have {} input column(s) and a target; it has {} column(s)", n_in,
                batch->columns.size());
      std::vector<Tensor> inputs;
      for (size_t i = 0; i < n_in; ++i) inputs.push_back(on_device(batch->columns[i], rc.device));
      Tensor target = on_device(batch->columns[n_in], rc.device);
      const int64_t real = batch->real_samples;
      const int64_t b = batch->micro_batch_size;

      rc.step = global_step_;
      rc.sample_offset = batch->sample_offset;
      network_->zero_grad();
      std::vector<Tensor> outputs = network_->forward(inputs, rc);
      Tensor& pred = outputs.at(0);
      Tensor grad_pred;
      double local_loss_sum = 0;
      if (real > 0) {
        SavedState ls;
        Tensor loss_t = loss_->forward(rows(pred, real), rows(target, real), batch->global_real_samples, ls);
        local_loss_sum = Loss::value(loss_t) * static_cast<double>(batch->global_real_samples);
        Tensor g = loss_->backward(ls, scaler_.scale());
        if (real == b) {
          grad_pred = g;
        } else {
          grad_pred = Tensor::zeros(pred.shape(), pred.dtype(), pred.device());
          Tensor head = grad_pred.slice_rows(0, real);
          head.copy_from(g);
        }
        for (auto& m : metrics_) m->update(rows(pred, real), rows(target, real));
      } else {
        grad_pred = Tensor::zeros(pred.shape(), pred.dtype(), pred.device());
      }
      double t_bwd = now_s(), t_bwd_end = 0, t_comm_end = 0;
      try {
        network_->backward({grad_pred}, rc, [&](size_t index, Parameter&) {
          int64_t slot = reducer_slot[index];
          if (slot >= 0) reducer_->mark_ready(static_cast<size_t>(slot));
        });
        t_bwd_end = now_s();
        // Each rank's loss is already divided by the GLOBAL count: the SUM is the serial
        // gradient (times the loss scale, which finalize divides out).
        reducer_->finalize(1.0 / scaler_.scale());
        t_comm_end = now_s();
      } catch (...) {
        // The Reducer may be left mid-step, its thread still reducing this step's buckets.
        // Destroying it cancels them; the next fit() builds a fresh one (on every rank,
        // since the peers fail this step too, on their collective timeout at the latest).
        reducer_.reset();
        throw;
      }
      lr_used = optimizer_->learning_rate();
      // The summed gradients are bitwise equal on every rank, so every rank decides alike.
      bool apply = !scaler_.enabled() || scaler_.update(ops::has_non_finite(trainable_grads));
      if (apply) {
        optimizer_->step(trainable);
      } else {
        // A skipped step still moves the schedule on (as Keras' LossScaleOptimizer and a
        // PyTorch scheduler stepped every batch), so warmup and decay stay on their batches.
        optimizer_->set_step_count(optimizer_->step_count() + 1);
      }
      ++global_step_;

      loss_sum += local_loss_sum;
      sample_sum += static_cast<double>(real);
      std::vector<double> sums{loss_sum, sample_sum};
      for (auto& m : metrics_) {
        sums.push_back(m->total());
        sums.push_back(m->count());
      }
      std::vector<double> global = comm.allreduce_sum(sums);
      logs.clear();
      logs["loss"] = global[1] > 0 ? global[0] / global[1] : 0.0;
      for (size_t i = 0; i < metrics_.size(); ++i) {
        double total = global[2 + 2 * i], count = global[3 + 2 * i];
        logs[metrics_[i]->name()] = count > 0 ? total / count : 0.0;
      }
      if (scaler_.enabled()) logs["loss_scale"] = scaler_.scale();
      double t1 = now_s();
      timing_.steps++;
      timing_.step_seconds += t1 - t0;
      timing_.backward_seconds += t_bwd_end - t_bwd;
      timing_.exposed_comm_seconds += t_comm_end - t_bwd_end;
      timing_.comm_seconds += reducer_->last_step().comm_s();
      timing_.hidden_comm_seconds += reducer_->last_step().hidden_s();
      callbacks.each([&](Callback& c) { c.on_train_batch_end(step, logs); });
      ++step;
    }
    if (timing_.steps > 0) {
      double n = static_cast<double>(timing_.steps);
      timing_.step_seconds /= n;
      timing_.backward_seconds /= n;
      timing_.comm_seconds /= n;
      timing_.hidden_comm_seconds /= n;
      timing_.exposed_comm_seconds /= n;
    }
    // Restore the metric objects to the global epoch values (for users reading them).
    if (!logs.empty() && validation && (epoch + 1) % options.validation_freq == 0) {
      Logs val = run_evaluate(distributed_source(*validation, 0));
      for (auto& [k, v] : val) logs["val_" + k] = v;
    } else if (validation && epoch + 1 == options.epochs) {
      Logs val = run_evaluate(distributed_source(*validation, 0));
      for (auto& [k, v] : val) logs["val_" + k] = v;
    }
    logs["learning_rate"] = lr_used;
    logs["seconds"] = now_s() - epoch_start;
    if (options.verbose >= 2 || log_enabled(LogLevel::info)) {
      print("epoch {}: {:.1f} ms/step, backward {:.1f} ms, gradient allreduce {:.1f} ms of which {:.1f} ms exposed "
            "({:.0f}% hidden behind backward)",
            epoch + 1, timing_.step_seconds * 1e3, timing_.backward_seconds * 1e3, timing_.comm_seconds * 1e3,
            timing_.exposed_comm_seconds * 1e3, timing_.hidden_fraction() * 100.0);
    }
    callbacks.each([&](Callback& c) { c.on_epoch_end(epoch, logs); });
  }
  callbacks.each([&](Callback& c) { c.on_train_end(logs); });
  return history;
}

Logs Model::evaluate(const Dataset& data, EvaluateOptions options) {
  check_compiled("evaluate");
  const int p = size();
  if (!weights_synced_) broadcast_weights();
  if (options.distribute_dataset) {
    if (options.batch_size < p) {
      throw InputError(fmt::format("evaluate: the global batch size {} is smaller than the number of ranks {}",
                                   options.batch_size, p));
    }
    int64_t mine = micro_batch_size(options.batch_size, rank(), p);
    if (options.micro_batch_size > 0 && options.micro_batch_size != mine) {
      throw InputError(fmt::format("evaluate: micro_batch_size={} disagrees with batch_size={} on {} ranks",
                                   options.micro_batch_size, options.batch_size, p));
    }
    return run_evaluate(distributed_source(data.distribute(options.batch_size, rank(), p, Remainder::pad), 0));
  }
  return run_evaluate(user_source(data, 0, options.micro_batch_size));
}

Logs Model::evaluate(const DistributedDataset& data) {
  check_compiled("evaluate");
  if (!weights_synced_) broadcast_weights();
  return run_evaluate(distributed_source(data, 0));
}

Logs Model::run_evaluate(const detail::NextBatch& next) {
  RunContext rc;
  rc.training = false;
  rc.seed = seed_;
  rc.step = global_step_;
  rc.device = network_->device();
  std::vector<MetricPtr> metrics = metrics_;
  std::vector<std::pair<double, double>> saved_totals;
  for (auto& m : metrics) {
    saved_totals.emplace_back(m->total(), m->count());
    m->reset();
  }
  double loss_sum = 0, samples = 0;
  while (std::optional<Batch> batch = next()) {
    const size_t n_in = network_->inputs().size();
    TNT_CHECK(batch->columns.size() == n_in + 1, "evaluate: each element must have {} input column(s) and a target",
              n_in);
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < n_in; ++i) inputs.push_back(batch->columns[i].to(rc.device));
    Tensor target = batch->columns[n_in].to(rc.device);
    int64_t real = batch->real_samples;
    std::vector<Tensor> out = network_->forward(inputs, rc, false);
    if (real > 0) {
      SavedState ls;
      // Divide by 1 to get this rank's plain sum of per-sample losses.
      loss_sum += Loss::value(loss_->forward(rows(out[0], real), rows(target, real), 1, ls));
      for (auto& m : metrics) m->update(rows(out[0], real), rows(target, real));
      samples += static_cast<double>(real);
    }
  }
  std::vector<double> sums{loss_sum, samples};
  for (auto& m : metrics) {
    sums.push_back(m->total());
    sums.push_back(m->count());
  }
  std::vector<double> global = communicator().allreduce_sum(sums);
  Logs logs;
  logs["loss"] = global[1] > 0 ? global[0] / global[1] : 0.0;
  for (size_t i = 0; i < metrics.size(); ++i) {
    double count = global[3 + 2 * i];
    logs[metrics[i]->name()] = count > 0 ? global[2 + 2 * i] / count : 0.0;
    metrics[i]->set_totals(saved_totals[i].first, saved_totals[i].second);
  }
  return logs;
}

Tensor Model::predict(const Dataset& data, int64_t batch_size) {
  if (batch_size <= 0) throw InputError(fmt::format("predict: batch_size={} must be positive", batch_size));
  if (!weights_synced_) broadcast_weights();
  RunContext rc;
  rc.training = false;
  rc.seed = seed_;
  rc.device = network_->device();
  std::vector<Tensor> parts;
  int64_t rows_total = 0;
  auto it = data.batch(batch_size).iterate(0);
  const size_t n_in = network_->inputs().size();
  while (std::optional<Element> e = it.next()) {
    TNT_CHECK(e->size() >= n_in, "predict: each element needs {} input column(s)", n_in);
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < n_in; ++i) inputs.push_back((*e)[i].to(rc.device));
    Tensor out = network_->forward(inputs, rc, false).at(0).to(Device::cpu());
    rows_total += out.dim(0);
    parts.push_back(out);
  }
  TNT_CHECK(!parts.empty(), "predict: the dataset is empty");
  Shape shape = parts[0].shape();
  shape[0] = rows_total;
  Tensor result = Tensor::empty(shape, parts[0].dtype());
  int64_t at = 0;
  for (auto& part : parts) {
    Tensor dst = result.slice_rows(at, at + part.dim(0));
    dst.copy_from(part);
    at += part.dim(0);
  }
  return result;
}

std::vector<NamedTensor> Model::checkpoint_tensors(bool with_optimizer) {
  std::vector<NamedTensor> out;
  for (auto& p : network_->named_parameters()) out.push_back({p.name, p.param->value});
  for (auto& b : network_->named_buffers()) out.push_back({b.name, b.param->value});
  if (with_optimizer && optimizer_) {
    for (auto& s : optimizer_->named_state()) out.push_back({"optimizer." + s.name, s.tensor});
  }
  return out;
}

namespace {
NamedTensors as_named(const std::vector<NamedTensor>& v) {
  NamedTensors out;
  for (auto& t : v) out.emplace_back(t.name, t.tensor);
  return out;
}
}  // namespace

void Model::save_weights(const std::string& path) {
  write_on_master(path, checkpoint_tensors(false), {{checkpoint_key::format, "pt"}});
}

void Model::load_weights(const std::string& path) {
  Checkpoint ck = Checkpoint::read(path);
  LoadOptions lo;
  lo.allow_unexpected = true;  // a full checkpoint also holds optimizer state
  ck.load_into(as_named(checkpoint_tensors(false)), lo);
  weights_synced_ = false;
}

void Model::save_checkpoint(const std::string& path, int epoch) {
  Metadata md;
  md[checkpoint_key::format] = "pt";
  md[checkpoint_key::epoch] = std::to_string(epoch);
  md[checkpoint_key::step] = std::to_string(global_step_);
  md[checkpoint_key::seed] = std::to_string(seed_);
  md["optimizer_step"] = optimizer_ ? std::to_string(optimizer_->step_count()) : "0";
  md["ranks"] = std::to_string(size());
  md["precision"] = precision_.name();
  if (scaler_.enabled()) {
    md["loss_scale"] = fmt::format("{:.17g}", scaler_.scale());
    md["loss_scale_good_steps"] = std::to_string(scaler_.good_steps());
  }
  write_on_master(path, checkpoint_tensors(true), md);
}

// Collective: the master writes (atomically), then tells every rank whether it worked, so
// a failed write (full disk, bad path) ends the job on every rank instead of only one.
void Model::write_on_master(const std::string& path, const std::vector<NamedTensor>& tensors, const Metadata& md) {
  std::string failure;
  if (is_master_rank()) {
    try {
      write_safetensors(path, as_named(tensors), md);
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.empty()) failure = "unknown error";
    }
  }
  communicator().broadcast(failure, master_rank());
  if (!failure.empty()) throw Error(fmt::format("writing checkpoint '{}' on the master failed: {}", path, failure));
}

int Model::load_checkpoint(const std::string& path) {
  check_compiled("load_checkpoint");
  Checkpoint ck = Checkpoint::read(path);
  ck.load_into(as_named(checkpoint_tensors(true)));
  int64_t epoch = ck.metadata_int(checkpoint_key::epoch);
  global_step_ = ck.metadata_int(checkpoint_key::step);
  if (ck.has_metadata("optimizer_step")) optimizer_->set_step_count(ck.metadata_int("optimizer_step"));
  // The scale continues where it was (a fresh 65536 would cost a few skipped steps); a
  // checkpoint written without scaling leaves this run's initial scale.
  if (scaler_.enabled() && ck.has_metadata("loss_scale")) {
    const std::string text = ck.metadata("loss_scale");
    double scale = 0;
    try {
      size_t used = 0;
      scale = std::stod(text, &used);
      if (used != text.size()) scale = 0;
    } catch (const std::exception&) {
      scale = 0;
    }
    if (!(scale > 0) || !std::isfinite(scale)) {
      throw InputError(fmt::format("checkpoint '{}': metadata loss_scale='{}' is not a positive number", path, text));
    }
    int64_t good = ck.has_metadata("loss_scale_good_steps") ? ck.metadata_int("loss_scale_good_steps") : 0;
    if (good < 0) {
      throw InputError(fmt::format("checkpoint '{}': metadata loss_scale_good_steps={} is negative", path, good));
    }
    scaler_.set_state(scale, good);
  }
  weights_synced_ = false;
  return static_cast<int>(epoch);
}

}  // namespace tnt
