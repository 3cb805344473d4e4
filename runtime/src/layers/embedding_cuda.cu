// Embedding on CUDA (semantics in embedding_cuda.hpp). The ids never travel to the host.
//
// Checking ids without a stall: a lookup call launches a kernel that records the first
// out-of-range id and its position in a small device buffer, copies that buffer into
// pinned host memory and records an event, all queued on the compute stream. The result is
// read (1) at the start of every later call of the layer, for the calls whose event has
// completed, without waiting (cudaEventQuery), and (2) in the call's own backward, which
// waits for its event (cudaEventSynchronize): the check ran before everything that
// produced dy, so that wait costs nothing in practice. A bad id throws the InputError of
// the CPU engine, naming the layer, the id, its position and the vocabulary size, plus the
// call it came from. Meanwhile the lookup writes 0 for a bad id, never reading outside W.
//
// Deterministic weight gradient: backward sorts the rows by id on the device (a stable
// cub::DeviceRadixSort of (id, row) pairs, so each id's rows stay in row order) and one
// block per group of equal ids adds that group's dy rows in row order, column by column.
// Each dW row thus gets one fixed sum, with no atomics. Projection: cuBLAS products as
// Dense's, on a vocabulary padded to a multiple of 8 where that pays (embedding_projection_cuda.hpp).
#include "layers/embedding_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/sort_bits.hpp"
#include "layers/embedding_projection_cuda.hpp"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

namespace tnt::cuda {

namespace {

constexpr unsigned long long kNoBadId = ~0ull;  // the "position" of a check that found nothing

// The result of one lookup call's device check of its ids, and the means to read it late.
struct IdCheck {
  int device = 0;                      // the event's device: a check is reused only there
  unsigned long long* host = nullptr;  // pinned (2): first bad position (kNoBadId: none), that id
  cudaEvent_t done = nullptr;          // recorded after the copy into `host`
  uint64_t call = 0;                   // which lookup call of the layer (1, 2, ...)
  bool pending = false;                // copy queued, result not read yet
  bool bad = false;                    // result, once read
  long long id = 0;
  unsigned long long position = 0;
  bool reported = false;  // thrown once already (by the next call or by backward)

  explicit IdCheck(int on_device) : device(on_device) {
    TNT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), 2 * sizeof(unsigned long long),
                                 cudaHostAllocDefault));
    TNT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  }
  ~IdCheck() {
    // Unchecked: a layer may be destroyed while the CUDA runtime shuts down.
    if (done != nullptr) (void)cudaEventDestroy(done);
    if (host != nullptr) (void)cudaFreeHost(host);
  }
  IdCheck(const IdCheck&) = delete;
  IdCheck& operator=(const IdCheck&) = delete;

  void read() {
    bad = host[0] != kNoBadId;
    position = host[0];
    id = static_cast<long long>(host[1]);
    pending = false;
  }
};

// The layer's engine cache: every check still referenced, and the count of lookup calls.
struct EmbeddingCache {
  std::vector<std::shared_ptr<IdCheck>> checks;
  uint64_t calls = 0;
};

struct EmbeddingSaved {
  bool lookup = true;
  Tensor x;                        // projection: the input (R, D)
  Tensor ids;                      // lookup: the ids (R), on the device
  std::shared_ptr<IdCheck> check;  // lookup: this call's id check
  int64_t rows = 0;
  ProjectionPath path;             // projection: direct or padded, each way (TNT_GEMM_PAD)
};

EmbeddingCache& cache_of(Embedding& layer) {
  std::shared_ptr<void>& slot = layer.engine_cache(Device::Kind::cuda);
  if (!slot) slot = std::make_shared<EmbeddingCache>();
  return *static_cast<EmbeddingCache*>(slot.get());
}

[[noreturn]] void throw_bad_id(const Embedding& layer, IdCheck& check, const char* found_by) {
  check.reported = true;
  // The CPU engine's message (embedding.cpp), then which call the ids came from.
  TNT_INPUT_ERROR(
      "Embedding '{}': token id {} at position {} is outside the vocabulary [0, {}) (ids of lookup call {} of this "
      "layer, checked on the device, reported by {})",
      layer.name(), check.id, check.position, layer.vocab_size(), check.call, found_by);
}

// Reads every earlier check that has completed, without waiting; throws for the first bad
// one not reported yet.
void report_finished_checks(Embedding& layer, EmbeddingCache& cache) {
  for (const std::shared_ptr<IdCheck>& c : cache.checks) {
    if (c->pending) {
      const cudaError_t state = cudaEventQuery(c->done);
      if (state == cudaErrorNotReady) {
        // "Not ready" is a status, not an error; clear it so that no later launch check
        // mistakes it for one.
        (void)cudaGetLastError();
        continue;
      }
      TNT_CUDA_CHECK(state);
      c->read();
    }
  }
  for (const std::shared_ptr<IdCheck>& c : cache.checks) {
    if (c->bad && !c->reported) throw_bad_id(layer, *c, "a later call of the layer");
  }
}

// A check object for a new call on `device` (current): a read one that only the cache still
// holds (its call's SavedState is gone), else a new one.
std::shared_ptr<IdCheck> acquire_check(EmbeddingCache& cache, int device) {
  for (const std::shared_ptr<IdCheck>& c : cache.checks) {
    if (c->device == device && !c->pending && c.use_count() == 1 && (!c->bad || c->reported)) {
      c->bad = c->reported = false;
      return c;
    }
  }
  cache.checks.push_back(std::make_shared<IdCheck>(device));
  return cache.checks.back();
}

// first[0] = min over rows with an id outside [0, V) of the row (kNoBadId if none).
// Integer atomicMin: the result is the same whatever the order of the threads.
template <typename I>
__global__ void find_bad_id_kernel(const I* __restrict__ ids,  // (R)
                                   int64_t rows, int64_t vocab,
                                   unsigned long long* __restrict__ first) {  // (2)
  TNT_KERNEL_LOOP(r, rows) {
    const int64_t id = static_cast<int64_t>(ids[r]);
    if (id < 0 || id >= vocab) atomicMin(first, static_cast<unsigned long long>(r));
  }
}

// One thread: first[1] = the id at the position found (after find_bad_id_kernel).
template <typename I>
__global__ void fetch_bad_id_kernel(const I* __restrict__ ids,  // (R)
                                    unsigned long long* __restrict__ first) {  // (2)
  if (first[0] != kNoBadId) first[1] = static_cast<unsigned long long>(static_cast<long long>(ids[first[0]]));
}

// Block b handles rows b, b + gridDim.x, ...; its threads the columns. A bad id (reported
// by the check) gives 0 like padding, so nothing outside W is read.
template <typename T, typename I>
__global__ void lookup_kernel(const I* __restrict__ ids,   // (R)
                              const float* __restrict__ w,  // (V, D)
                              T* __restrict__ y,            // (R, D)
                              int64_t rows, int64_t d, int64_t vocab, float scale) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t id = static_cast<int64_t>(ids[r]);
    const bool zero = id <= 0 || id >= vocab;
    T* yr = y + r * d;
    const float* wr = w + (zero ? 0 : id) * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yr[j] = from_float<T>(zero ? 0.0f : wr[j] * scale);
  }
}

// Sort keys: the id for rows that get a gradient, 0 for padding (and for bad ids, which
// backward has rejected before it gets here); values: the row.
template <typename I>
__global__ void sort_keys_kernel(const I* __restrict__ ids,  // (R)
                                 int64_t rows, int64_t vocab,
                                 uint32_t* __restrict__ keys,  // (R)
                                 int32_t* __restrict__ values) {  // (R)
  TNT_KERNEL_LOOP(r, rows) {
    const int64_t id = static_cast<int64_t>(ids[r]);
    keys[r] = id > 0 && id < vocab ? static_cast<uint32_t>(id) : 0u;
    values[r] = static_cast<int32_t>(r);
  }
}

// keys/rows sorted by id (stable). Block b takes sorted positions k = b, b + gridDim.x, ...;
// where k starts a group of equal nonzero ids, its threads sum the group's dy rows in row
// order, per column, and add scale times that sum to dW[id].
template <typename T>
__global__ void scatter_kernel(const T* __restrict__ dy,              // (R, D)
                               const uint32_t* __restrict__ keys,     // (R) sorted
                               const int32_t* __restrict__ sorted_rows,  // (R)
                               float* __restrict__ dw,                // (V, D)
                               int64_t rows, int64_t d, float scale) {
  for (int64_t k = blockIdx.x; k < rows; k += gridDim.x) {
    const uint32_t id = keys[k];
    if (id == 0 || (k > 0 && keys[k - 1] == id)) continue;  // padding, or not the group's first
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = 0.0f;
      for (int64_t m = k; m < rows && keys[m] == id; ++m) acc += to_float(dy[static_cast<int64_t>(sorted_rows[m]) * d + j]);
      dw[static_cast<int64_t>(id) * d + j] += acc * scale;
    }
  }
}

// Threads per block of the row kernels: the columns, in whole warps, at most kBlock.
int row_block(int64_t d) { return static_cast<int>(std::min<int64_t>(kBlock, (d + kWarp - 1) / kWarp * kWarp)); }

void queue_id_check(const Tensor& ids, int64_t vocab, IdCheck& check, int device) {
  cudaStream_t stream = compute_stream(device);
  const int64_t rows = ids.numel();
  Workspace first(2 * sizeof(unsigned long long), device);  // (2)
  TNT_CUDA_CHECK(cudaMemsetAsync(first.data(), 0xff, 2 * sizeof(unsigned long long), stream));
  if (rows > 0) {
    TNT_CUDA_DISPATCH_LABEL(ids.dtype(), "Embedding", {
      find_bad_id_kernel<label_t><<<grid_for(rows, kBlock, device), kBlock, 0, stream>>>(
          static_cast<const label_t*>(ids.raw()), rows, vocab, first.as<unsigned long long>());
      TNT_CUDA_CHECK_LAUNCH();
      fetch_bad_id_kernel<label_t><<<1, 1, 0, stream>>>(static_cast<const label_t*>(ids.raw()),
                                                        first.as<unsigned long long>());
      TNT_CUDA_CHECK_LAUNCH();
    });
  }
  // The workspace returns to the cache at scope exit; the copy is queued on the same
  // stream, so it reads the buffer before any later owner writes it (cuda_context.hpp).
  TNT_CUDA_CHECK(cudaMemcpyAsync(check.host, first.data(), 2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                 stream));
  TNT_CUDA_CHECK(cudaEventRecord(check.done, stream));
  check.pending = true;
}

}  // namespace

std::vector<Tensor> embedding_forward(Embedding& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                      SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);
  const Parameter& weight = layer.weight();
  int device = common_device({&x, &weight.value}, "Embedding");
  const int64_t d = layer.hidden_size(), v = layer.vocab_size();
  EmbeddingCache& cache = cache_of(layer);
  report_finished_checks(layer, cache);
  auto s = std::make_shared<EmbeddingSaved>();
  if (x.dtype() == DType::i32 || x.dtype() == DType::i64) {
    const int64_t rows = x.numel();
    s->lookup = true;
    s->rows = rows;
    s->ids = x;
    s->check = acquire_check(cache, device);
    s->check->call = ++cache.calls;
    queue_id_check(x, v, *s->check, device);
    // Half activations when the network keeps a half copy of the weight (mixed precision).
    const DType out_dtype = weight.compute.defined() && is_half(weight.compute.dtype()) ? weight.compute.dtype()
                                                                                        : DType::f32;
    Shape out_shape = x.shape();
    out_shape.push_back(d);
    Tensor y = Tensor::empty(out_shape, out_dtype, x.device());  // (R, D)
    if (rows > 0) {
      const unsigned grid = grid_for(rows, 1, device);
      TNT_CUDA_DISPATCH_FLOAT(out_dtype, "Embedding", {
        TNT_CUDA_DISPATCH_LABEL(x.dtype(), "Embedding", {
          lookup_kernel<scalar_t, label_t><<<grid, row_block(d), 0, compute_stream(device)>>>(
              static_cast<const label_t*>(x.raw()), static_cast<const float*>(weight.value.raw()),
              static_cast<scalar_t*>(y.raw()), rows, d, v, static_cast<float>(layer.scale()));
        });
      });
      TNT_CUDA_CHECK_LAUNCH();
    }
    saved.tensors = {x};
    saved.extra = s;
    return {y};
  }
  const Tensor& w = compute_value(weight, x.dtype(), layer.name());  // (V, D)
  const int64_t rows = x.numel() / d;
  Shape out_shape = x.shape();
  out_shape.back() = v;
  Tensor logits = Tensor::empty(out_shape, x.dtype(), x.device());  // (R, V) = x W^T
  s->path = projection_path(fmt::format("Embedding '{}'", layer.name()), x.dtype(), rows, v, d, x.raw(), w.raw(),
                            logits.raw(), device);
  projection_forward(s->path.forward_padded, device, x.dtype(), rows, v, d, x.raw(), w.raw(), logits.raw());
  s->lookup = false;
  s->x = x;
  s->rows = rows;
  saved.tensors = {x};
  saved.extra = s;
  return {logits};
}

std::vector<Tensor> embedding_backward(Embedding& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                       SavedState& saved) {
  (void)rc;
  const auto& s = *static_cast<const EmbeddingSaved*>(saved.extra.get());
  const Tensor& dy = grad_outputs.at(0);
  Parameter& weight = layer.weight();
  int device = common_device({&dy, &weight.grad}, "Embedding backward");
  const int64_t d = layer.hidden_size(), v = layer.vocab_size();
  TNT_CHECK(weight.grad.dtype() == DType::f32, "Embedding '{}': the weight gradient must be f32", layer.name());
  if (s.lookup) {
    TNT_CHECK(dy.numel() == s.rows * d, "Embedding '{}': gradient {} for {} ids", layer.name(), dy.str(), s.rows);
    IdCheck& check = *s.check;
    if (check.pending) {
      TNT_CUDA_CHECK(cudaEventSynchronize(check.done));
      check.read();
    }
    if (check.bad) throw_bad_id(layer, check, "its backward");
    const int64_t rows = s.rows;
    if (rows == 0) return {Tensor()};
    TNT_CHECK(rows <= std::numeric_limits<int32_t>::max() && v <= (int64_t{1} << 32),
              "Embedding '{}': {} ids over a vocabulary of {}: the CUDA gradient sorts at most 2^31 - 1 ids of "
              "32-bit values",
              layer.name(), rows, v);
    cudaStream_t stream = compute_stream(device);
    Workspace keys(2 * static_cast<size_t>(rows) * sizeof(uint32_t), device);   // (2, R): unsorted, sorted
    Workspace values(2 * static_cast<size_t>(rows) * sizeof(int32_t), device);  // (2, R)
    uint32_t* keys_in = keys.as<uint32_t>();
    uint32_t* keys_out = keys_in + rows;
    int32_t* rows_in = values.as<int32_t>();
    int32_t* rows_out = rows_in + rows;
    TNT_CUDA_DISPATCH_LABEL(s.ids.dtype(), "Embedding", {
      sort_keys_kernel<label_t><<<grid_for(rows, kBlock, device), kBlock, 0, stream>>>(
          static_cast<const label_t*>(s.ids.raw()), rows, v, keys_in, rows_in);
    });
    TNT_CUDA_CHECK_LAUNCH();
    const int bits = radix_key_bits(static_cast<uint64_t>(v - 1));  // keys are < v: no other bit differs
    const int items = static_cast<int>(rows);
    size_t temp_bytes = 0;
    TNT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, rows_in, rows_out, items,
                                                   0, bits, stream));
    Workspace temp(std::max<size_t>(temp_bytes, 1), device);
    TNT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, keys_in, keys_out, rows_in, rows_out,
                                                   items, 0, bits, stream));
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "Embedding", {
      scatter_kernel<scalar_t><<<grid_for(rows, 1, device), row_block(d), 0, stream>>>(
          static_cast<const scalar_t*>(dy.raw()), keys_out, rows_out, static_cast<float*>(weight.grad.raw()), rows, d,
          static_cast<float>(layer.scale()));
    });
    TNT_CUDA_CHECK_LAUNCH();
    return {Tensor()};
  }
  const Tensor& x = s.x;  // (R, D)
  const Tensor& w = compute_value(weight, x.dtype(), layer.name());
  TNT_CHECK(dy.numel() == s.rows * v && dy.dtype() == x.dtype(), "Embedding '{}': gradient {} for logits ({}, {})",
            layer.name(), dy.str(), s.rows, v);
  Tensor dx;
  // (R, D) = dy (R, V) W (V, D); dW (V, D) += dy^T (V, R) x (R, D), accumulated in f32
  if (saved.need_input_grads) dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  projection_backward(s.path.backward_padded, device, x.dtype(), s.rows, v, d, dy.raw(), x.raw(), w.raw(),
                      dx.defined() ? dx.raw() : nullptr, static_cast<float*>(weight.grad.raw()));
  return {dx};
}

}  // namespace tnt::cuda
