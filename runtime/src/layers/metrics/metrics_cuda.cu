// Top-k accuracy on CUDA: one block per row counts the classes ranked before the label in
// a stable descending order (higher score, or equal score and a smaller index), exactly as
// metrics.cpp does; a row with a NaN or an infinity anywhere counts as wrong, as there.
// Counts are integers, so their atomics are exact; the three words
// (correct, counted, first bad row) come back to the host in one copy.
#include "layers/metrics/metrics_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "backend/device_api.hpp"
#include "layers/metrics/binary_math.hpp"

#include <functional>
#include <string>
#include <vector>

namespace tnt::cuda {

namespace {

struct Counts {
  unsigned long long correct;
  unsigned long long count;
  unsigned long long bad_row;  // ~0 when every label was valid
};

template <typename T, typename L>
__global__ void topk_kernel(const T* __restrict__ scores,  // (R, K)
                            const L* __restrict__ labels,  // (R)
                            int64_t rows, int64_t k_classes, int64_t k, int64_t ignore_index,
                            Counts* __restrict__ out) {
  __shared__ long long scratch[kWarp];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t label = static_cast<int64_t>(labels[r]);  // the same in every thread: branches are uniform
    if (label == ignore_index) continue;
    if (label < 0 || label >= k_classes) {
      if (threadIdx.x == 0) atomicMin(&out->bad_row, static_cast<unsigned long long>(r));
      continue;
    }
    const T* xr = scores + r * k_classes;
    const float v = to_float(xr[label]);
    long long ahead = 0;
    for (int64_t j = threadIdx.x; j < k_classes; j += blockDim.x) {
      const float s = to_float(xr[j]);
      // A non-finite score adds k, so the one block_sum below both ranks the label and
      // rules the row out (ahead >= k: wrong); NaN alone would compare false and never
      // count. At most K * k, far from overflowing.
      ahead += !isfinite(s) ? k : ((s > v || (s == v && j < label)) ? 1 : 0);
    }
    ahead = block_sum(ahead, scratch);
    if (threadIdx.x == 0) {
      if (ahead < k) atomicAdd(&out->correct, 1ull);
      atomicAdd(&out->count, 1ull);
    }
  }
}

}  // namespace

MetricCounts topk_correct(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index) {
  int device = common_device({&scores, &labels}, "accuracy");
  const int64_t classes = scores.dim(-1), rows = scores.numel() / classes;
  MetricCounts result;
  if (rows == 0) return result;
  cudaStream_t stream = compute_stream(device);
  Workspace ws(sizeof(Counts), device);
  Counts* counts = ws.as<Counts>();
  TNT_CUDA_CHECK(cudaMemsetAsync(counts, 0, 2 * sizeof(unsigned long long), stream));
  TNT_CUDA_CHECK(cudaMemsetAsync(&counts->bad_row, 0xff, sizeof(unsigned long long), stream));
  int64_t t = (classes + kWarp - 1) / kWarp * kWarp;
  const unsigned threads = static_cast<unsigned>(t < kBlock ? t : kBlock);
  const unsigned grid = static_cast<unsigned>(rows < 65535 ? rows : 65535);
  TNT_CUDA_DISPATCH_FLOAT(scores.dtype(), "accuracy", {
    TNT_CUDA_DISPATCH_LABEL(labels.dtype(), "accuracy", {
      topk_kernel<scalar_t, label_t><<<grid, threads, 0, stream>>>(static_cast<const scalar_t*>(scores.raw()),
                                                                   static_cast<const label_t*>(labels.raw()), rows,
                                                                   classes, k, ignore_index, counts);
    });
  });
  TNT_CUDA_CHECK_LAUNCH();
  Counts host{};
  backend::cuda_copy(&host, Device::cpu(), counts, scores.device(), sizeof(Counts));
  if (host.bad_row != ~0ull) {
    const int64_t r = static_cast<int64_t>(host.bad_row);
    const int64_t label = static_cast<int64_t>(labels.reshape({rows}).slice_rows(r, r + 1).to_double_vector().at(0));
    TNT_INPUT_ERROR("accuracy: label {} of sample {} is outside the {} classes [0, {})", label, r, classes, classes);
  }
  result.correct = static_cast<int64_t>(host.correct);
  result.count = static_cast<int64_t>(host.count);
  return result;
}

}  // namespace tnt::cuda

// BinaryPrecision, BinaryRecall and AUC on CUDA: a grid-stride loop applies binary_math.hpp's rules to
// each element; the counts (integers, so their atomics are exact and the order does not
// matter) and the first bad target's index come back to the host in one copy.
namespace tnt::cuda {

namespace {

constexpr unsigned kBinaryBlocks = 1024;  // enough to fill the device; each thread then loops

template <typename T, typename L>
__global__ void confusion_kernel(const T* __restrict__ predictions,  // (n)
                                 const L* __restrict__ targets,      // (n)
                                 int64_t n, double threshold, bool from_logits,
                                 unsigned long long* __restrict__ out) {  // (4 cells, first bad index)
  unsigned long long local[4] = {0, 0, 0, 0};
  TNT_KERNEL_LOOP(i, n) {
    const int c = binary::target_class(targets[i]);
    if (c < 0) {
      atomicMin(&out[4], static_cast<unsigned long long>(i));
      continue;
    }
    ++local[binary::cell(binary::probability(to_float(predictions[i]), from_logits), c == 1, threshold)];
  }
  for (int k = 0; k < 4; ++k)
    if (local[k] > 0) atomicAdd(&out[k], local[k]);
}

template <typename T, typename L>
__global__ void histogram_kernel(const T* __restrict__ predictions,  // (n)
                                 const L* __restrict__ targets,      // (n)
                                 int64_t n, int64_t bins, bool from_logits,
                                 unsigned long long* __restrict__ out) {  // (2 * bins histogram, first bad index)
  TNT_KERNEL_LOOP(i, n) {
    const int c = binary::target_class(targets[i]);
    if (c < 0) {
      atomicMin(&out[2 * bins], static_cast<unsigned long long>(i));
      continue;
    }
    const int64_t b = binary::bin(binary::probability(to_float(predictions[i]), from_logits), c == 1, bins);
    atomicAdd(&out[(c == 1 ? 0 : bins) + b], 1ull);
  }
}

// Runs launch(scalar_t, target_t) for the dtypes of predictions and targets.
#define TNT_BINARY_DISPATCH(predictions, targets, what, ...)                            \
  TNT_CUDA_DISPATCH_FLOAT((predictions).dtype(), what, {                                \
    if ((targets).dtype() == DType::f32) {                                              \
      using target_t = float;                                                           \
      __VA_ARGS__;                                                                      \
    } else {                                                                            \
      TNT_CUDA_DISPATCH_LABEL((targets).dtype(), what, {                                \
        using target_t = label_t;                                                       \
        __VA_ARGS__;                                                                    \
      });                                                                               \
    }                                                                                   \
  })

// Counts from the device: `words` counters followed by the first bad target's index (~0 when
// every target was 0 or 1), which becomes the InputError the CPU engine raises.
std::vector<unsigned long long> run_counting(const std::string& metric, const Tensor& targets, int64_t words,
                                             int device, const std::function<void(unsigned long long*)>& launch) {
  cudaStream_t stream = compute_stream(device);
  const size_t bytes = static_cast<size_t>(words + 1) * sizeof(unsigned long long);
  Workspace ws(bytes, device);
  unsigned long long* out = ws.as<unsigned long long>();
  TNT_CUDA_CHECK(cudaMemsetAsync(out, 0, bytes - sizeof(unsigned long long), stream));
  TNT_CUDA_CHECK(cudaMemsetAsync(out + words, 0xff, sizeof(unsigned long long), stream));
  launch(out);
  TNT_CUDA_CHECK_LAUNCH();
  std::vector<unsigned long long> host(static_cast<size_t>(words + 1));
  backend::cuda_copy(host.data(), Device::cpu(), out, targets.device(), bytes);
  if (host.back() != ~0ull) {
    const int64_t i = static_cast<int64_t>(host.back());
    const double value = targets.reshape({targets.numel()}).slice_rows(i, i + 1).to_double_vector().at(0);
    TNT_INPUT_ERROR("{}: target {} of element {} is not 0 or 1 (binary metrics take 0/1 targets)", metric, value, i);
  }
  host.pop_back();
  return host;
}

unsigned grid_of(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < kBinaryBlocks ? blocks : kBinaryBlocks);
}

}  // namespace

ConfusionCounts confusion_counts(const std::string& metric, const Tensor& predictions, const Tensor& targets,
                                 double threshold, bool from_logits) {
  int device = common_device({&predictions, &targets}, metric.c_str());
  ConfusionCounts result;
  const int64_t n = predictions.numel();
  if (n == 0) return result;
  std::vector<unsigned long long> c = run_counting(metric, targets, 4, device, [&](unsigned long long* out) {
    TNT_BINARY_DISPATCH(predictions, targets, metric.c_str(), {
      confusion_kernel<scalar_t, target_t><<<grid_of(n), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(predictions.raw()), static_cast<const target_t*>(targets.raw()), n, threshold,
          from_logits, out);
    });
  });
  for (int k = 0; k < 4; ++k) result.counts[k] = static_cast<int64_t>(c[static_cast<size_t>(k)]);
  return result;
}

void auc_histogram(const Tensor& predictions, const Tensor& targets, int64_t bins, bool from_logits,
                   std::vector<double>& hist) {
  int device = common_device({&predictions, &targets}, "auc");
  const int64_t n = predictions.numel();
  TNT_CHECK(static_cast<int64_t>(hist.size()) == 2 * bins, "auc: histogram of {} for {} bins", hist.size(), bins);
  if (n == 0) return;
  std::vector<unsigned long long> h = run_counting("auc", targets, 2 * bins, device, [&](unsigned long long* out) {
    TNT_BINARY_DISPATCH(predictions, targets, "auc", {
      histogram_kernel<scalar_t, target_t><<<grid_of(n), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(predictions.raw()), static_cast<const target_t*>(targets.raw()), n, bins,
          from_logits, out);
    });
  });
  for (size_t k = 0; k < hist.size(); ++k) hist[k] += static_cast<double>(h[k]);
}

}  // namespace tnt::cuda
