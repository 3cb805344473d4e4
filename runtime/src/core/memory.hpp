// Host memory: 64-byte aligned (oneDNN and AVX-512 like it), counted for memory_stats().
#pragma once

#include "tarantella/device.hpp"

#include <cstddef>

namespace tnt {

void* host_alloc(size_t bytes);
void host_free(void* ptr, size_t bytes);
MemoryStats host_memory_stats();
void reset_host_peak();

// Allocation on any device (host_alloc or the CUDA caching allocator).
void* device_alloc(size_t bytes, Device device);
void device_free(void* ptr, size_t bytes, Device device);
// Synchronous copy between any two places.
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

}  // namespace tnt
