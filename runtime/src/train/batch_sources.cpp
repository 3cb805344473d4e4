// Where a pass's batches come from (train/batch_sources.hpp).
#include "train/batch_sources.hpp"

#include "comm/agreement.hpp"
#include "comm/waiter.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tnt::detail {

namespace {

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

// "v" when every rank holds v, else "v0, v1, ... (ranks 0 to p-1)".
std::string per_rank(const std::vector<int64_t>& values) {
  if (std::all_of(values.begin(), values.end(), [&](int64_t v) { return v == values.front(); })) {
    return std::to_string(values.front());
  }
  return fmt::format("{} (ranks 0 to {})", fmt::join(values, ", "), values.size() - 1);
}

}  // namespace

Tensor padded_gradient(const Tensor& real_grad, const Shape& shape, DType dtype, const void* predictions) {
  const int64_t real = real_grad.dim(0);
  const size_t full = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  const std::shared_ptr<Storage>& s = real_grad.storage();
  if (real_grad.raw() == predictions && real_grad.dtype() == dtype && s.use_count() == 1 &&
      real_grad.byte_offset() + full <= s->bytes()) {
    Tensor whole = real_grad.view(shape, dtype, 0);
    whole.slice_rows(real, shape.at(0)).zero_();
    return whole;
  }
  Tensor whole = Tensor::zeros(shape, dtype, real_grad.device());
  whole.slice_rows(0, real).copy_from(real_grad);
  return whole;
}

NextBatch distributed_source(const DistributedDataset& data, int64_t epoch, int64_t first_step) {
  auto it = std::make_shared<DistributedDataset::Iterator>(data.iterate(epoch, first_step));
  return [it]() { return it->next(); };
}

// The user's micro-batches: every element is {inputs..., target}, each (b, ...). All ranks
// must have the same number of steps; a mismatch is detected (not hung on) because each
// step agrees on "does every rank have a batch" first.
NextBatch user_source(const Dataset& data, int64_t epoch, int64_t expected_micro, int64_t first_step) {
  auto it = std::make_shared<Dataset::Iterator>((first_step > 0 ? data.skip(first_step) : data).iterate(epoch));
  auto step = std::make_shared<int64_t>(first_step);
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



// Moves each batch's weights into Batch::sample_weights (see model.hpp). A bad weight is seen
// on one rank only, so the ranks agree on every weighted batch, and all of them throw.
void check_class_weight_for(const char* what, const ClassWeight& class_weight, int64_t classes) {
  try {
    check_class_weight(class_weight, classes);  // the same options on every rank
  } catch (const InputError& e) {
    TNT_INPUT_ERROR("{}: {}", what, e.what());
  }
}

NextBatch with_sample_weights(NextBatch next, size_t n_in, const LossPtr& loss, const ClassWeight& class_weight,
                              int64_t classes, const char* what) {
  check_class_weight_for(what, class_weight, classes);
  return [next = std::move(next), n_in, loss, class_weight, what]() -> std::optional<Batch> {
    std::optional<Batch> batch = next();
    if (!batch || (batch->columns.size() != n_in + 2 && class_weight.empty())) return batch;
    std::string problem;
    try {
      batch->sample_weights = batch_sample_weights(*batch, n_in, *loss, class_weight, what);
    } catch (const InputError& e) {
      problem = e.what();
    }
    std::optional<Disagreement> d = find_disagreement(communicator(), {problem});
    if (!problem.empty() && !d) TNT_INPUT_ERROR("{}", problem);
    if (d) {
      for (const auto& [text, ranks] : d->groups) {
        if (!text.empty()) TNT_INPUT_ERROR("{} (on rank(s) {})", text, rank_list(ranks));
      }
    }
    return batch;
  };
}

// Stages each batch on the device one batch ahead (train/staging.hpp): the batch handed out
// was queued to the device before the step before it ran, and the next one is queued now,
// before this one's step. So every rank fetches batch k + 1 before step k: the batch
// sources' own collectives (sizes, sample-weight checks) stay in the same order on every rank.
NextBatch with_staging(NextBatch next, const std::shared_ptr<InputStager>& stager) {
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
std::shared_ptr<InputStager> stager_for(Device device) {
  const bool enabled = detail::pinned_staging_enabled();  // validated on every device
  if (!device.is_cuda() || !enabled) return nullptr;
  return std::make_shared<InputStager>(device);
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
  if (!agree) detail::raise_if_collectives_differ(communicator(), what);
  TNT_INPUT_CHECK(agree,
                  "{}: {}={} disagrees with {}={}: over {} that is {} samples per rank; give one of the two ({}=0 "
                  "batches with {} x ranks)",
                  what, micro_name, per_rank(micros), batch_name, batch, p == 1 ? "1 rank" : fmt::format("{} ranks", p),
                  per_rank(shares), batch_name, micro_name);
  return batch;
}

int64_t batch_within_data(const char* what, const char* batch_name, int64_t global, int64_t samples, bool warn) {
  const int64_t within = std::max<int64_t>(samples, size());
  if (samples <= 0 || global <= within) return global;
  if (is_master_rank()) {
    // Fewer samples than ranks: a batch of one sample a rank, the missing ones padding
    // (weight 0): Keras' one batch of `samples`, spread over the ranks.
    const std::string text =
        within == samples
            ? fmt::format("{}: the global batch of {} ({}) is larger than the data's {} samples; each pass is one "
                          "batch of {} (as Keras does), not {} padded with copies",
                          what, global, batch_name, samples, within, global)
            : fmt::format("{}: the global batch of {} ({}) is larger than the data's {} sample{}; each pass is one "
                          "batch of them (as Keras does), one a rank over the {} ranks (the {} without one pad with "
                          "a copy of weight 0)",
                          what, global, batch_name, samples, samples == 1 ? "" : "s", within, within - samples);
    if (warn) log_warning("{}", text);
    else log_info("{}", text);
  }
  return within;
}

}  // namespace tnt::detail
