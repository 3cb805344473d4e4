#include "core/memory.hpp"

#include "backend/device_api.hpp"
#include "tarantella/check.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace tnt {

namespace {
std::atomic<size_t> g_host_current{0};
std::atomic<size_t> g_host_peak{0};
constexpr size_t kAlign = 64;
}  // namespace

void* host_alloc(size_t bytes) {
  if (bytes == 0) bytes = kAlign;  // a valid, unique pointer for empty tensors
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) throw Error(fmt::format("out of host memory allocating {} bytes", bytes));
  size_t now = g_host_current.fetch_add(bytes) + bytes;
  size_t peak = g_host_peak.load();
  while (now > peak && !g_host_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void host_free(void* ptr, size_t bytes) {
  if (!ptr) return;
  if (bytes == 0) bytes = kAlign;
  g_host_current.fetch_sub(bytes);
  std::free(ptr);
}

MemoryStats host_memory_stats() {
  MemoryStats s;
  s.current_bytes = g_host_current.load();
  s.peak_bytes = g_host_peak.load();
  s.reserved_bytes = s.current_bytes;
  return s;
}

void reset_host_peak() { g_host_peak.store(g_host_current.load()); }

void* device_alloc(size_t bytes, Device device) {
  return device.is_cpu() ? host_alloc(bytes) : backend::cuda_malloc(bytes, device.index);
}

void device_free(void* ptr, size_t bytes, Device device) {
  if (device.is_cpu()) {
    host_free(ptr, bytes);
  } else {
    backend::cuda_free(ptr, bytes, device.index);
  }
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
  } else {
    backend::cuda_copy(dst, dst_device, src, src_device, bytes);
  }
}

}  // namespace tnt
