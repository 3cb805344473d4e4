// CUDA memory entry points of backend/device_api.hpp (plain cudaMalloc for now).
#include "backend/cuda/cuda_check.hpp"
#include "backend/device_api.hpp"

#include <atomic>
#include <mutex>
#include <vector>

namespace tnt::backend {

namespace {
struct Counters {
  std::atomic<size_t> current{0};
  std::atomic<size_t> peak{0};
};
Counters& counters(int device) {
  static std::vector<Counters> all(64);
  return all.at(static_cast<size_t>(device));
}
}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void cuda_set_device(int device) { TNT_CUDA_CHECK(cudaSetDevice(device)); }

void* cuda_malloc(size_t bytes, int device) {
  TNT_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  TNT_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 256 : bytes));
  Counters& c = counters(device);
  size_t now = c.current.fetch_add(bytes) + bytes;
  size_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void cuda_free(void* ptr, size_t bytes, int device) {
  if (!ptr) return;
  counters(device).current.fetch_sub(bytes);
  cudaFree(ptr);
}

void cuda_copy(void* dst, Device, const void* src, Device, size_t bytes) {
  TNT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void cuda_memset_zero(void* ptr, size_t bytes, int device) {
  TNT_CUDA_CHECK(cudaSetDevice(device));
  TNT_CUDA_CHECK(cudaMemset(ptr, 0, bytes));
}

MemoryStats cuda_memory_stats(int device) {
  MemoryStats s;
  s.current_bytes = counters(device).current.load();
  s.peak_bytes = counters(device).peak.load();
  s.reserved_bytes = s.current_bytes;
  return s;
}

void cuda_reset_peak(int device) { counters(device).peak.store(counters(device).current.load()); }

}  // namespace tnt::backend
