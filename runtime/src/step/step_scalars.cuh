// The device half of a check word pair (step/step_scalars.hpp): a kernel has lowered
// words[0] to the first bad element's index (atomicMin; kNone when there is none); this
// kernel then writes the element's value, widened to double, into words[1], so the host
// names the value without a second copy.
#pragma once

#include "backend/cuda/device_common.cuh"

#include <cstdint>

namespace tnt::cuda {

// One thread. data: the checked elements (n), flat; T: an integer label or a float target.
template <typename T>
__global__ void value_at_bad_kernel(const T* __restrict__ data, unsigned long long* __restrict__ words) {
  const unsigned long long i = words[0];
  if (i == ~0ull) return;  // nothing was bad: words[1] keeps its fill
  const double v = static_cast<double>(data[i]);
  words[1] = static_cast<unsigned long long>(__double_as_longlong(v));
}

// Queues value_at_bad_kernel on the compute stream of `device`.
template <typename T>
void value_at_bad(const T* data, uint64_t* words, int device) {
  value_at_bad_kernel<T><<<1, 1, 0, compute_stream(device)>>>(data, reinterpret_cast<unsigned long long*>(words));
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::cuda
