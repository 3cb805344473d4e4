// Introspection of the CUDA caching allocator (backend/cuda/memory.cpp), for tests and
// diagnostics. Plain C++: includable without the CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tnt::cuda {

// The allocator is a BlockPool per device (backend/block_pool.hpp): segments from cudaMalloc
// cut into blocks.
struct AllocatorCounters {
  uint64_t driver_mallocs = 0;  // segments cudaMalloc'd (a steady-state step adds none)
  uint64_t driver_frees = 0;    // segments cudaFree'd (empty_cache, or the retry after an OOM)
  uint64_t requests = 0;        // cuda_malloc calls
  uint64_t cache_hits = 0;      // requests served from the segments held
  size_t cached_bytes = 0;      // free bytes inside the segments
  size_t reserved_bytes = 0;    // bytes of all segments
  size_t largest_free_bytes = 0;
  size_t segments = 0;
};

AllocatorCounters allocator_counters(int device);
// Gives every wholly free segment of the device back to the driver.
void empty_cache(int device);
// The bytes a request of `bytes` takes at least (exposed for tests).
size_t allocator_block_size(size_t bytes);

}  // namespace tnt::cuda
