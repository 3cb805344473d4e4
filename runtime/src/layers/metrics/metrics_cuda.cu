// Top-k accuracy on CUDA: one block per row counts the classes ranked before the label in
// a stable descending order (higher score, or equal score and a smaller index), exactly as
// metrics.cpp does; a row with a NaN or an infinity anywhere counts as wrong, as there.
// Counts are integers, so their atomics are exact; the three words
// (correct, counted, first bad row) come back to the host in one copy.
#include "layers/metrics/metrics_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "backend/device_api.hpp"

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
