// Top-k accuracy on CUDA: one block per row counts the classes ranked before the label in
// a stable descending order (higher score, or equal score and a smaller index), exactly as
// metrics.cpp does; a row with a NaN or an infinity anywhere counts as wrong, as there.
// Counts are integers, so their atomics are exact; the words (correct, counted, first bad
// row, its label) are the step's readback's (step/step_scalars.hpp), read by metrics.cpp.
#include "layers/metrics/metrics_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "layers/metrics/binary_math.hpp"
#include "step/step_scalars.cuh"

#include <functional>
#include <string>

namespace tnt::cuda {

namespace {

struct Counts {
  unsigned long long correct;
  unsigned long long count;
  unsigned long long bad_row;  // ~0 when every label was valid
  unsigned long long bad_label;  // written by value_at_bad
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

void topk_correct(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index, uint64_t* words) {
  int device = common_device({&scores, &labels}, "accuracy");
  const int64_t classes = scores.dim(-1), rows = scores.numel() / classes;
  if (rows == 0) return;
  cudaStream_t stream = compute_stream(device);
  static_assert(sizeof(Counts) == (kTopkWords + 2) * sizeof(uint64_t), "Counts is the words' layout");
  Counts* counts = reinterpret_cast<Counts*>(words);  // filled (0, 0, ~0, ~0) by the reservation
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
  TNT_CUDA_DISPATCH_LABEL(labels.dtype(), "accuracy",
                          { value_at_bad(static_cast<const label_t*>(labels.raw()), words + kTopkWords, device); });
}

}  // namespace tnt::cuda

// BinaryPrecision, BinaryRecall and AUC on CUDA: a grid-stride loop applies binary_math.hpp's rules to
// each element; the counts (integers, so their atomics are exact and the order does not
// matter) and the first bad target's index and value go to the step's readback words.
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

// After the counting kernel: the value of the first bad target, into the check pair that
// follows the `counters` words.
void value_of_bad_target(const Tensor& targets, uint64_t* words, int64_t counters, int device) {
  uint64_t* check = words + counters;
  if (targets.dtype() == DType::f32) {
    value_at_bad(targets.data<float>(), check, device);
  } else {
    TNT_CUDA_DISPATCH_LABEL(targets.dtype(), "binary metric",
                            { value_at_bad(static_cast<const label_t*>(targets.raw()), check, device); });
  }
}

unsigned grid_of(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < kBinaryBlocks ? blocks : kBinaryBlocks);
}

}  // namespace

void confusion_counts(const std::string& metric, const Tensor& predictions, const Tensor& targets, double threshold,
                      bool from_logits, uint64_t* words) {
  int device = common_device({&predictions, &targets}, metric.c_str());
  const int64_t n = predictions.numel();
  if (n == 0) return;
  auto* out = reinterpret_cast<unsigned long long*>(words);  // (4 cells, first bad index)
  TNT_BINARY_DISPATCH(predictions, targets, metric.c_str(), {
    confusion_kernel<scalar_t, target_t><<<grid_of(n), kBlock, 0, compute_stream(device)>>>(
        static_cast<const scalar_t*>(predictions.raw()), static_cast<const target_t*>(targets.raw()), n, threshold,
        from_logits, out);
  });
  TNT_CUDA_CHECK_LAUNCH();
  value_of_bad_target(targets, words, kConfusionWords, device);
}

void auc_histogram(const Tensor& predictions, const Tensor& targets, int64_t bins, bool from_logits, uint64_t* words) {
  int device = common_device({&predictions, &targets}, "auc");
  const int64_t n = predictions.numel();
  if (n == 0) return;
  auto* out = reinterpret_cast<unsigned long long*>(words);  // (2 * bins histogram, first bad index)
  TNT_BINARY_DISPATCH(predictions, targets, "auc", {
    histogram_kernel<scalar_t, target_t><<<grid_of(n), kBlock, 0, compute_stream(device)>>>(
        static_cast<const scalar_t*>(predictions.raw()), static_cast<const target_t*>(targets.raw()), n, bins,
        from_logits, out);
  });
  TNT_CUDA_CHECK_LAUNCH();
  value_of_bad_target(targets, words, 2 * bins, device);
}

}  // namespace tnt::cuda
