// The narrow interface between the core and the CUDA backend. backend/cuda implements it
// in CUDA builds; backend/stub implements it in CPU-only builds (every call but the
// queries throws "built without CUDA").
#pragma once

#include "tarantella/device.hpp"

#include <cstddef>

namespace tnt::backend {

bool cuda_built();
int cuda_device_count();
void* cuda_malloc(size_t bytes, int device);  // through the caching allocator
void cuda_free(void* ptr, size_t bytes, int device);
// Copy between any two places (host or device); synchronous with respect to the host.
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void cuda_memset_zero(void* ptr, size_t bytes, int device);
MemoryStats cuda_memory_stats(int device);
void cuda_reset_peak(int device);
void cuda_set_device(int device);
// The compute stream (cudaStream_t) of `device`: where every layer engine launches, so
// work on another stream (NCCL's) that reads their results orders itself after it.
void* cuda_compute_stream(int device);

}  // namespace tnt::backend
