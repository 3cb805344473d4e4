#include "core/memory.hpp"

#include "core/device_api.hpp"
#include "tarantella/device.hpp"
#include "tarantella/check.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include <unistd.h>

namespace tnt {

namespace {
std::atomic<size_t> g_host_current{0};
std::atomic<size_t> g_host_peak{0};
constexpr size_t kAlign = 64;

// Freed host blocks of at least kCacheMin bytes are kept for reuse, by exact rounded size:
// a training step allocates the same activation shapes every time, and handing multi-MB
// blocks back to the system makes every step pay for fresh pages (mmap and page faults
// cost 15-20% of a small CNN's step). The cache holds at most kCacheMax bytes.
constexpr size_t kCacheMin = 64 * 1024;
constexpr size_t kCacheMax = size_t{2} << 30;

struct HostCache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks
  size_t cached_bytes = 0;

  ~HostCache() {
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) std::free(p);
  }
};

HostCache& host_cache() {
  static HostCache* cache = new HostCache();  // never destroyed: tensors may outlive statics
  return *cache;
}

size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void* host_alloc(size_t bytes) {
  if (bytes == 0) bytes = kAlign;  // a valid, unique pointer for empty tensors
  size_t size = rounded(bytes);
  void* p = nullptr;
  if (size >= kCacheMin) {
    HostCache& c = host_cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      c.cached_bytes -= size;
    }
  }
  if (!p) p = std::aligned_alloc(kAlign, size);
  if (!p) {
    throw Error(fmt::format("out of host memory allocating {} bytes{}: a smaller batch (or fewer ranks on this host) "
                            "needs less",
                            bytes, host_memory_limit_text()));
  }
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
  size_t size = rounded(bytes);
  if (size >= kCacheMin) {
    HostCache& c = host_cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.cached_bytes + size <= kCacheMax) {
      c.free_blocks[size].push_back(ptr);
      c.cached_bytes += size;
      return;
    }
  }
  std::free(ptr);
}

MemoryStats host_memory_stats() {
  MemoryStats s;
  s.current_bytes = g_host_current.load();
  s.peak_bytes = g_host_peak.load();
  {
    HostCache& c = host_cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    s.reserved_bytes = s.current_bytes + c.cached_bytes;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) s.total_bytes = static_cast<size_t>(pages) * static_cast<size_t>(page);
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
