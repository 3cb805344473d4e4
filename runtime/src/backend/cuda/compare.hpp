// Helpers of the engines' first-use trials (Conv2D's cuDNN graphs, the attention engine
// choice): compare two device buffers, sum their products, fill one with test values, and
// time a piece of work on the compute stream with CUDA events. Each waits for the compute
// stream: for one-off trials, never inside a step.
#pragma once

#include "backend/cuda/cuda_context.hpp"
#include "tarantella/dtype.hpp"

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <utility>

namespace tnt::cuda {

// {max |a - b|, max |b|} over n elements of dtype (NaN counted as infinite).
std::pair<float, float> max_difference(const void* a, const void* b, int64_t n, DType dtype, int device);

// sum a[i] * b[i] over n elements of dtype, each product and the sum in double (the order
// of the sum is not fixed: the last bits vary from call to call).
double dot(const void* a, const void* b, int64_t n, DType dtype, int device);

// x[i] = lo + (hi - lo) * u(seed, i), u uniform in [0, 1) from a counter hash, rounded to
// dtype: the same values on every device and call.
void fill_uniform(void* x, int64_t n, DType dtype, uint64_t seed, float lo, float hi, int device);

// Milliseconds a run of f (which queues work on compute_stream(device)), averaged over
// `runs` runs between two CUDA events.
template <typename F>
float time_runs(F&& f, int runs, int device) {
  cudaStream_t stream = compute_stream(device);
  cudaEvent_t start = nullptr, stop = nullptr;
  TNT_CUDA_CHECK(cudaEventCreate(&start));
  TNT_CUDA_CHECK(cudaEventCreate(&stop));
  float ms = -1;
  try {
    TNT_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < runs; ++i) f();
    TNT_CUDA_CHECK(cudaEventRecord(stop, stream));
    TNT_CUDA_CHECK(cudaEventSynchronize(stop));
    TNT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / static_cast<float>(runs);
}

// Two pieces of work compared: one untimed run each (first launches), then `rounds` rounds
// in which a and b alternate, `runs` runs each; {best ms of a, best ms of b}.
template <typename A, typename B>
std::pair<float, float> time_alternating(A&& a, B&& b, int rounds, int runs, int device) {
  a();
  b();
  std::pair<float, float> best{-1.0f, -1.0f};
  for (int round = 0; round < rounds; ++round) {
    const float ta = time_runs(a, runs, device);
    const float tb = time_runs(b, runs, device);
    best.first = round == 0 ? ta : std::min(best.first, ta);
    best.second = round == 0 ? tb : std::min(best.second, tb);
  }
  return best;
}

}  // namespace tnt::cuda
