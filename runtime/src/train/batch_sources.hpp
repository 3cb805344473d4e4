// Where a pass's batches come from: the adapters that make a Model's NextBatch out of a
// distributed dataset or the user's own micro-batches, and the stages around it (sample
// weights, staging on the device one batch ahead), plus the global batch of a pass. The
// training loops (model.cpp) compose them; each is a function of its inputs.
#pragma once

#include "tarantella/dataset.hpp"
#include "tarantella/loss.hpp"
#include "tarantella/model.hpp"
#include "train/staging.hpp"

#include <cstdint>
#include <memory>

namespace tnt::detail {

// A batch column on the model's device: data already there (synthetic batches made on the
// GPU once) are used as they are; nothing in a step writes to its inputs.
inline Tensor on_device(const Tensor& t, Device device) { return t.device() == device ? t : t.to(device); }

// The real samples of a micro-batch are its first `real` rows (see Batch), so losses and
// metrics look at a prefix.
inline Tensor rows(const Tensor& t, int64_t n) { return n == t.dim(0) ? t : t.slice_rows(0, n); }

// The gradient of a whole micro-batch's predictions (`shape`, `dtype`) from the loss's
// gradient `real_grad` of its first rows, the padding rows' 0. Where the loss wrote that
// gradient over the predictions (`predictions`: where they were) and nothing else holds
// their memory, the rest of it takes the zeros: a partial batch (an epoch's last) then
// needs no second buffer of the predictions' size either, as a full one does not.
Tensor padded_gradient(const Tensor& real_grad, const Shape& shape, DType dtype, const void* predictions);

// A distributed dataset's batches of `epoch`, from global batch first_step on.
NextBatch distributed_source(const DistributedDataset& data, int64_t epoch, int64_t first_step = 0);

// The user's micro-batches: every element is {inputs..., target}, each (b, ...). All ranks
// must have the same number of steps; a mismatch is detected (not hung on) because each
// step agrees on "does every rank have a batch" first.
// first_step: that many micro-batches are skipped first (a run resumed inside an epoch).
NextBatch user_source(const Dataset& data, int64_t epoch, int64_t expected_micro, int64_t first_step = 0);

// Moves each batch's weights into Batch::sample_weights (see model.hpp). A bad weight is seen
// on one rank only, so the ranks agree on every weighted batch, and all of them throw.
// classes: the predictions' class count (Loss::class_count), -1 unknown.
// check_class_weight_for: check_class_weight with "<what>: " before its message; fit and
// evaluate call it before any callback acts, with_sample_weights again.
void check_class_weight_for(const char* what, const ClassWeight& class_weight, int64_t classes);
NextBatch with_sample_weights(NextBatch next, size_t n_in, const LossPtr& loss, const ClassWeight& class_weight,
                              int64_t classes, const char* what);

// Stages each batch on the device one batch ahead (train/staging.hpp): see batch_sources.cpp.
NextBatch with_staging(NextBatch next, const std::shared_ptr<InputStager>& stager);

// The stager of a pass on `device`: CUDA with TNT_PINNED_STAGING not 0, else none.
std::shared_ptr<InputStager> stager_for(Device device);

// The global batch of a distributed pass ("Local batch sizes" in model.hpp): `batch` as
// given, or `micro` x ranks when only that is given. Collective when batch is given.
int64_t global_batch_of(const char* what, const char* batch_name, int64_t batch, const char* micro_name,
                        int64_t micro);

// A global batch no larger than the data: a pass over `samples` (-1: unknown) in batches of
// `global` would pad its one partial batch up to `global` rows, computing on copies. The
// result is max(samples, ranks) where that is smaller, else `global`. With `warn`, the
// master says so (training, where BatchNorm's batch statistics see the batch's rows);
// inference gives the same results either way and is only logged at INFO.
int64_t batch_within_data(const char* what, const char* batch_name, int64_t global, int64_t samples, bool warn);

}  // namespace tnt::detail
