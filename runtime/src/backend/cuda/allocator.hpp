// Introspection of the CUDA caching allocator (backend/cuda/memory.cpp), for tests and
// diagnostics. Plain C++: includable without the CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tnt::cuda {

struct AllocatorCounters {
  uint64_t driver_mallocs = 0;  // cudaMalloc calls that succeeded (a steady-state step adds none)
  uint64_t driver_frees = 0;    // cudaFree calls (empty_cache, or the retry after an OOM)
  uint64_t requests = 0;        // cuda_malloc calls
  uint64_t cache_hits = 0;      // requests served from a cached block
  size_t cached_bytes = 0;      // free blocks held for reuse
};

AllocatorCounters allocator_counters(int device);
// Gives every cached (free) block of the device back to the driver.
void empty_cache(int device);
// The size class a request of `bytes` is served from (exposed for tests).
size_t allocator_block_size(size_t bytes);

}  // namespace tnt::cuda
