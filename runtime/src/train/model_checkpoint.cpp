// tnt::Model's weights and checkpoints: PyTorch names and layouts (parameters, buffers,
// then "optimizer.<state>"), the training position and the loss scale in the metadata. Saves
// are collective (the master writes atomically; every rank learns whether it worked). A
// diverged model (a NaN or an infinity in any tensor) is never written: its file would
// replace the last good checkpoint with one that cannot be trained on.
#include "tarantella/model.hpp"

#include "comm/collective_scope.hpp"
#include "tarantella/checkpoint.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"
#include "train/non_finite.hpp"
#include "train/same_network.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>

namespace tnt {

namespace detail {

std::string first_non_finite(const std::vector<NamedTensor>& tensors) {
  std::vector<std::pair<Device, std::vector<Tensor>>> by_device;
  for (const auto& t : tensors) {
    auto it = std::find_if(by_device.begin(), by_device.end(), [&](const auto& g) { return g.first == t.tensor.device(); });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {t.tensor.device(), {}});
    it->second.push_back(t.tensor);
  }
  bool any = false;
  for (const auto& [device, group] : by_device) any = any || ops::has_non_finite(group);
  if (!any) return "";
  for (const auto& t : tensors) {
    if (ops::has_non_finite(t.tensor)) return t.name;
  }
  return "";
}

}  // namespace detail

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

// Checkpoints written before BatchNorm kept PyTorch's num_batches_tracked lack it; they
// still load (the counters keep their values).
LoadOptions tolerant_of_older_files(const std::vector<NamedTensor>& v) {
  LoadOptions lo;
  const std::string suffix = ".num_batches_tracked";
  for (const auto& t : v) {
    if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      lo.optional.insert(t.name);
    }
  }
  return lo;
}

// A finite number written with {:.17g}; anything else is an InputError naming file and key.
double metadata_number(const Checkpoint& ck, const std::string& key, const std::string& path) {
  const std::string& text = ck.metadata(key);
  double value = 0;
  bool ok = false;
  try {
    size_t used = 0;
    value = std::stod(text, &used);
    ok = used == text.size() && std::isfinite(value);
  } catch (const std::exception&) {
    ok = false;
  }
  TNT_INPUT_CHECK(ok, "checkpoint '{}': metadata {}='{}' is not a finite number", path, key, text);
  return value;
}

// "[s0,s1,...]": an epoch's loss and metric sums so far (PassTotals::last_global), finite.
std::vector<double> epoch_sums(const Checkpoint& ck, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(ck.metadata("epoch_sums"), nullptr, false);
  bool ok = j.is_array() && j.size() >= 5 && j.size() <= (1 << 20);
  std::vector<double> sums;
  for (size_t i = 0; ok && i < j.size(); ++i) {
    ok = j[i].is_number() && std::isfinite(j[i].get<double>());
    if (ok) sums.push_back(j[i].get<double>());
  }
  TNT_INPUT_CHECK(ok, "checkpoint '{}': metadata epoch_sums='{}' is not a list of finite numbers (the epoch's loss and "
                  "metric sums); the file is damaged", path, ck.metadata("epoch_sums").substr(0, 60));
  return sums;
}

NamedTensors as_named(const std::vector<NamedTensor>& v) {
  NamedTensors out;
  for (auto& t : v) out.emplace_back(t.name, t.tensor);
  return out;
}
// Values no optimizer writes, as a damaged file has them (a flipped sign bit): loaded, a
// negative step count or mean of squares trains on until a NaN, which the divergence check
// then blames on the input data.
void check_optimizer_state(const Optimizer& optimizer, const std::string& path, int64_t max_steps) {
  auto ends_with = [](const std::string& s, const char* suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
  };
  for (const NamedTensor& nt : optimizer.named_state()) {
    const bool step = ends_with(nt.name, ".step"), squares = ends_with(nt.name, ".exp_avg_sq");
    if (!step && !squares) continue;
    const std::vector<double> v = (nt.tensor.device().is_cpu() ? nt.tensor : nt.tensor.to(Device::cpu())).to_double_vector();
    for (size_t i = 0; i < v.size(); ++i) {
      const bool bad = step ? !(v[i] >= 0 && v[i] <= static_cast<double>(max_steps)) : !(v[i] >= 0);
      TNT_INPUT_CHECK(!bad, "checkpoint '{}': optimizer state '{}' holds {} at element {}, which {} never writes ({}); "
                      "the file is damaged",
                      path, nt.name, v[i], i, optimizer.type(),
                      step ? "a count of steps, from 0" : "a running mean of squares, never negative");
    }
  }
}

}  // namespace

void Model::save_weights(const std::string& path) {
  const detail::CollectiveLabel label("save_weights");
  write_on_master(path, checkpoint_tensors(false), {{checkpoint_key::format, "pt"}});
}

void Model::load_weights(const std::string& path) {
  Checkpoint ck = Checkpoint::read(path);
  auto tensors = checkpoint_tensors(false);
  LoadOptions lo = tolerant_of_older_files(tensors);
  lo.allow_unexpected = true;  // a full checkpoint also holds optimizer state
  lo.kind = "weights file";
  ck.load_into(as_named(tensors), lo);
  weights_synced_ = false;
}

namespace {

// The metadata keys save_checkpoint writes itself.
constexpr const char* kOwnKeys[] = {checkpoint_key::format, checkpoint_key::version, checkpoint_key::epoch,
                                    checkpoint_key::step,   checkpoint_key::seed,    checkpoint_key::generator,
                                    "epoch_step",           "epoch_batch",           "optimizer_step",
                                    "ranks",                "precision",             "lr_factor",
                                    "lr_floor",             "loss_scale",            "loss_scale_good_steps",
                                    "epoch_sums",           "epoch_seconds"};

}  // namespace

void Model::set_checkpoint_metadata(const std::string& key, const std::string& value) {
  TNT_INPUT_CHECK(!key.empty(), "set_checkpoint_metadata: the key is empty");
  for (const char* own : kOwnKeys) {
    TNT_INPUT_CHECK(key != own, "set_checkpoint_metadata: '{}' is a key the checkpoint writes itself; give another", key);
  }
  if (value.empty()) {
    checkpoint_metadata_.erase(key);
  } else {
    checkpoint_metadata_[key] = value;
  }
}

void Model::save_checkpoint(const std::string& path, int epoch, int64_t epoch_step) {
  const detail::CollectiveLabel label("save_checkpoint");
  TNT_INPUT_CHECK(epoch >= 0 && epoch_step >= 0, "save_checkpoint '{}': epoch {} and epoch_step {} must not be negative",
                  path, epoch, epoch_step);
  Metadata md = checkpoint_metadata_;
  md[checkpoint_key::format] = "pt";
  md[checkpoint_key::version] = std::to_string(kCheckpointVersion);
  md[checkpoint_key::epoch] = std::to_string(epoch);
  md[checkpoint_key::step] = std::to_string(global_step_);
  // Inside epoch `epoch` (a fit cut short by max_steps): absent when the epoch is done, so
  // that files written at an epoch's end read as before.
  if (epoch_step > 0) md["epoch_step"] = std::to_string(epoch_step);
  // ... of this global batch: a resume with another would skip other samples.
  if (epoch_step > 0 && fit_global_batch_ > 0) md["epoch_batch"] = std::to_string(fit_global_batch_);
  // ... and the epoch's loss and metric sums so far, for the resumed epoch's logs.
  // Finite only (a step the fp16 loss scaler skipped may have summed an infinite loss): the
  // resumed row then covers the steps after the resume, rather than the file being refused.
  const bool sums_finite = std::all_of(epoch_sums_.begin(), epoch_sums_.end(), [](double v) { return std::isfinite(v); });
  if (epoch_step > 0 && epoch_step == partial_epoch_steps_ && !epoch_sums_.empty() && sums_finite) {
    md["epoch_sums"] = fmt::format("[{:.17g}]", fmt::join(epoch_sums_, ","));
    md["epoch_seconds"] = fmt::format("{:.6f}", epoch_seconds_);
  }
  md[checkpoint_key::seed] = std::to_string(seed_);
  md["optimizer_step"] = optimizer_ ? std::to_string(optimizer_->step_count()) : "0";
  md["ranks"] = std::to_string(size());
  md["precision"] = precision_.name();
  // ReduceLROnPlateau's factor on the schedule (Optimizer::set_lr_factor): a resumed run goes
  // on at the reduced rate, as a Keras optimizer's saved learning rate does.
  if (optimizer_ && (optimizer_->lr_factor() != 1.0 || optimizer_->lr_floor() != 0.0)) {
    md["lr_factor"] = fmt::format("{:.17g}", optimizer_->lr_factor());
    md["lr_floor"] = fmt::format("{:.17g}", optimizer_->lr_floor());
  }
  if (scaler_.enabled()) {
    md["loss_scale"] = fmt::format("{:.17g}", scaler_.scale());
    md["loss_scale_good_steps"] = std::to_string(scaler_.good_steps());
  }
  write_on_master(path, checkpoint_tensors(true), md);
  last_checkpoint_step_ = global_step_;
}

// Collective: the master writes (atomically), then tells every rank whether it worked, so
// a failed write (full disk, bad path) ends the job on every rank instead of only one.
//
// The master also refuses to write non-finite tensors. That verdict needs no collective of
// its own: it is about the master's tensors (the ones the file would hold; parameters and
// optimizer state are bitwise equal on every rank anyway, while BatchNorm statistics are
// each rank's own), and it reaches every rank in the broadcast below, which every rank waits
// for in any case. So all ranks throw together, and the file on disk stays as it was.
void Model::write_on_master(const std::string& path, const std::vector<NamedTensor>& tensors, const Metadata& md) {
  std::string failure;  // the whole message; empty when the file was written
  if (is_master_rank()) {
    try {
      const std::string bad = detail::first_non_finite(tensors);
      if (!bad.empty()) {
        failure = fmt::format("refusing to write checkpoint '{}': '{}' holds a NaN or an infinity (the training "
                              "diverged); the file there, if any, is left as it was",
                              path, bad);
      } else {
        write_safetensors(path, as_named(tensors), md);
      }
    } catch (const std::exception& e) {
      failure = fmt::format("writing checkpoint '{}' on the master failed: {}", path,
                            *e.what() ? e.what() : "unknown error");
    }
  }
  communicator().broadcast(failure, master_rank());
  if (!failure.empty()) throw Error(failure);
}

int Model::load_checkpoint(const std::string& path) {
  check_compiled("load_checkpoint");
  Checkpoint ck = Checkpoint::read(path);
  // The training position is checked before anything is copied: a damaged file leaves the
  // model as it was. The bounds are far beyond any real run (a billion epochs; 10^15 steps,
  // a million steps a second for 30 years) and keep epoch + 1 and step arithmetic in range.
  constexpr int64_t kMaxEpochs = 1'000'000'000, kMaxSteps = 1'000'000'000'000'000;
  // A later format may mean something else by every key below: refused before any is read.
  check_checkpoint_version(path, ck.metadata());
  TNT_INPUT_CHECK(ck.has_metadata(checkpoint_key::epoch) && ck.has_metadata(checkpoint_key::step),
                  "checkpoint '{}' has no training position (metadata 'epoch' and 'step'): a weights file "
                  "(save_weights) or a model file (save_model, a program's model.safetensors)? Load that with "
                  "load_weights or load_model; load_checkpoint takes what save_checkpoint or ModelCheckpoint wrote",
                  path);
  auto count = [&](const char* key, int64_t max, const char* what) {
    const int64_t v = ck.metadata_int(key);
    TNT_INPUT_CHECK(v >= 0 && v <= max, "checkpoint '{}': metadata {}={} is not a number of {} (0 to {})", path, key,
                    v, what, max);
    return v;
  };
  const int64_t epoch = count(checkpoint_key::epoch, kMaxEpochs, "epochs completed");
  const int64_t step = count(checkpoint_key::step, kMaxSteps, "steps taken");
  const int64_t optimizer_step = ck.has_metadata("optimizer_step") ? count("optimizer_step", kMaxSteps, "steps taken") : -1;
  const int64_t epoch_step = ck.has_metadata("epoch_step") ? count("epoch_step", kMaxSteps, "steps into an epoch") : 0;
  const int64_t epoch_batch = ck.has_metadata("epoch_batch") ? count("epoch_batch", kMaxSteps, "samples") : 0;
  auto tensors = checkpoint_tensors(true);
  ck.load_into(as_named(tensors), tolerant_of_older_files(tensors));
  if (optimizer_) check_optimizer_state(*optimizer_, path, kMaxSteps);
  global_step_ = step;
  checkpoint_epoch_step_ = epoch_step;
  checkpoint_epoch_batch_ = epoch_batch;
  checkpoint_epoch_sums_ = epoch_step > 0 && ck.has_metadata("epoch_sums") ? epoch_sums(ck, path) : std::vector<double>{};
  checkpoint_epoch_seconds_ = epoch_step > 0 && ck.has_metadata("epoch_seconds")
                                  ? std::max(metadata_number(ck, "epoch_seconds", path), 0.0)
                                  : 0.0;
  if (optimizer_step >= 0) optimizer_->set_step_count(optimizer_step);
  // The learning-rate factor of ReduceLROnPlateau (absent: none, factor 1).
  const double lr_factor = ck.has_metadata("lr_factor") ? metadata_number(ck, "lr_factor", path) : 1.0;
  const double lr_floor = ck.has_metadata("lr_floor") ? metadata_number(ck, "lr_floor", path) : 0.0;
  TNT_INPUT_CHECK(lr_factor > 0 && lr_factor <= 1, "checkpoint '{}': metadata lr_factor='{}' is not in (0, 1]", path,
                  ck.metadata("lr_factor"));
  TNT_INPUT_CHECK(lr_floor >= 0, "checkpoint '{}': metadata lr_floor='{}' is negative", path,
                  ck.metadata("lr_floor"));
  optimizer_->set_lr_factor(lr_factor, lr_floor);
  // The scale continues where it was (a fresh 65536 would cost a few skipped steps); a
  // checkpoint written without scaling leaves this run's initial scale.
  if (scaler_.enabled() && ck.has_metadata("loss_scale")) {
    const std::string text = ck.metadata("loss_scale");
    const double scale = metadata_number(ck, "loss_scale", path);
    if (!(scale > 0)) {
      TNT_INPUT_ERROR("checkpoint '{}': metadata loss_scale='{}' is not a positive number", path, text);
    }
    int64_t good = ck.has_metadata("loss_scale_good_steps") ? ck.metadata_int("loss_scale_good_steps") : 0;
    if (good < 0) {
      TNT_INPUT_ERROR("checkpoint '{}': metadata loss_scale_good_steps={} is negative", path, good);
    }
    scaler_.set_state(scale, good);
  }
  weights_synced_ = false;
  return static_cast<int>(epoch);
}

int Model::load_checkpoint_from_master(const std::string& path) {
  check_compiled("load_checkpoint_from_master");
  const detail::CollectiveLabel label("load_checkpoint_from_master");
  Communicator& comm = communicator();
  std::string failure;
  int64_t refused = 0;  // 1: an InputError (the file or its content), 0: another error
  // epoch, step, optimizer step, loss-scale good steps, epoch step, its global batch
  int64_t position[6] = {0, 0, 0, 0, 0, 0};
  double rates[4] = {1.0, 0.0, 0.0, 0.0};  // lr factor, lr floor, loss scale, the epoch's seconds
  if (comm.is_master()) {
    try {
      position[0] = load_checkpoint(path);
    } catch (const InputError& e) {
      failure = e.what();
      refused = 1;
    } catch (const std::exception& e) {
      failure = fmt::format("reading checkpoint '{}' on the master failed: {}", path, e.what());
    }
    if (failure.empty()) {
      position[1] = global_step_;
      position[2] = optimizer_ ? optimizer_->step_count() : 0;
      position[3] = scaler_.enabled() ? scaler_.good_steps() : 0;
      position[4] = checkpoint_epoch_step_;
      position[5] = checkpoint_epoch_batch_;
      rates[0] = optimizer_ ? optimizer_->lr_factor() : 1.0;
      rates[1] = optimizer_ ? optimizer_->lr_floor() : 0.0;
      rates[2] = scaler_.enabled() ? scaler_.scale() : 0.0;
      rates[3] = checkpoint_epoch_seconds_;
    }
  }
  comm.broadcast(failure, master_rank());
  comm.broadcast(&refused, 1, DType::i64, Device::cpu(), master_rank());
  if (!failure.empty()) {
    if (refused != 0) throw InputError(failure);
    throw Error(failure);
  }
  // Every tensor a checkpoint holds, in one order on every rank, once the ranks agree that
  // their models (optimizer state included: another --optimizer has other slots) are alike.
  std::vector<NamedTensor> tensors = checkpoint_tensors(true);
  detail::require_same_tensors(comm, as_named(tensors), fmt::format("load_checkpoint_from_master '{}'", path));
  for (auto& t : tensors) detail::broadcast_via_host(comm, t.tensor, master_rank());
  comm.broadcast(position, 6, DType::i64, Device::cpu(), master_rank());
  comm.broadcast(rates, 4, DType::f64, Device::cpu(), master_rank());
  int64_t sums = static_cast<int64_t>(checkpoint_epoch_sums_.size());
  comm.broadcast(&sums, 1, DType::i64, Device::cpu(), master_rank());
  checkpoint_epoch_sums_.resize(static_cast<size_t>(sums));
  if (sums > 0) comm.broadcast(checkpoint_epoch_sums_.data(), sums, DType::f64, Device::cpu(), master_rank());
  if (!comm.is_master()) {
    global_step_ = position[1];
    checkpoint_epoch_step_ = position[4];
    checkpoint_epoch_batch_ = position[5];
    checkpoint_epoch_seconds_ = rates[3];
    if (optimizer_) {
      optimizer_->set_step_count(position[2]);
      optimizer_->set_lr_factor(rates[0], rates[1]);
    }
    if (scaler_.enabled()) scaler_.set_state(rates[2], position[3]);
  }
  weights_synced_ = true;  // every rank holds the master's tensors now
  return static_cast<int>(position[0]);
}

}  // namespace tnt
