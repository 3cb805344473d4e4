// Model::predict (model.hpp): the predictions of every rank's share gathered back into the
// dataset's order on every rank. The training and evaluation loops are model.cpp.
#include "comm/agreement.hpp"
#include "tarantella/model.hpp"

#include "tarantella/comm.hpp"
#include "tarantella/runtime.hpp"
#include "train/batch_sources.hpp"
#include "train/same_network.hpp"

#include <algorithm>
#include <vector>

namespace tnt {

using detail::distributed_source;
using detail::global_batch_of;
using detail::on_device;
using detail::rows;
using detail::user_source;

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
  const int64_t global = detail::batch_within_data(
      "predict", "batch_size",
      global_batch_of("predict", "batch_size", options.batch_size, "micro_batch_size", options.micro_batch_size),
      data.cardinality(), false);
  const DistributedDataset distributed = data.distribute(global, rank(), p, Remainder::pad);
  detail::require_same_pass(communicator(), "predict",
                            {fmt::format("{} samples", data.cardinality()), fmt::format("global batch {}", global)});
  // Every row by the master's BatchNorm statistics (the saved model's). Only here: a predict
  // of the rank's own batches (distribute_dataset=false) is no collective once the weights
  // were shared.
  if (weights_synced_ && !ps_) detail::share_master_buffers(communicator(), *network_);
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
