// CUDA memory entry points of core/device_api.hpp: a caching allocator per device.
//
// cudaMalloc and cudaFree are slow and cudaFree synchronises the whole device, so a
// training step must not call them. Each device has a BlockPool (backend/block_pool.hpp,
// where the policy is): cudaMalloc'd segments cut into best-fitting blocks that are split
// and merged, so any freed byte serves any later request it fits (a freed 1 GiB autotune
// workspace holds the next step's activations). After the first step, whose requests cut
// the segments, a step finds every block it needs in them.
//
// A block is reused without any event: all compute of a device is ordered on its one
// compute stream (see cuda_context.hpp), so the next owner's kernels run after the last
// owner's. When cudaMalloc runs out of memory the wholly free segments are given back to
// the driver and the request retried once; a second failure throws with the sizes involved.
//
// current_bytes counts the bytes tensors asked for (as for host memory); reserved_bytes
// counts every segment held from the driver, in use or not.
#include "backend/block_pool.hpp"
#include "backend/cuda/allocator.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/layout.hpp"
#include "core/device_api.hpp"

#include <cstdio>
#include <memory>
#include <mutex>

namespace tnt::backend {

namespace {

struct Pool {
  std::mutex mu;
  std::unique_ptr<BlockPool> blocks;  // made at the device's first request
  size_t peak = 0;   // of the bytes tensors asked for
  size_t total = 0;  // the device's global memory, asked once (memory_stats)
};

// Never destroyed: tensors with static storage may be freed after main returns.
Pool& pool(int device) {
  static Pool* pools = new Pool[cuda::kMaxDevices];
  TNT_CHECK(device >= 0 && device < cuda::kMaxDevices, "CUDA device index {} out of range [0, {})", device,
            cuda::kMaxDevices);
  return pools[device];
}

// Caller holds p.mu. Segments come from the driver: out of memory is null (the pool then
// gives free segments back and retries), any other failure an error.
BlockPool& blocks_of(Pool& p, int device) {
  if (!p.blocks) {
    p.blocks = std::make_unique<BlockPool>(
        [device](size_t bytes) -> void* {
          cuda::DeviceGuard guard(device);
          void* ptr = nullptr;
          const cudaError_t err = cudaMalloc(&ptr, bytes);
          if (err == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            return nullptr;
          }
          TNT_CUDA_CHECK(err);
          return ptr;
        },
        [device](void* ptr, size_t) {
          cuda::DeviceGuard guard(device);
          if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();  // the segment is gone either way
        });
  }
  return *p.blocks;
}

std::string mib(size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error for later calls
    return 0;
  }
  return n;
}

void cuda_set_device(int device) { TNT_CUDA_CHECK(cudaSetDevice(device)); }

void* cuda_malloc(size_t bytes, int device) {
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  BlockPool& blocks = blocks_of(p, device);
  void* ptr = blocks.allocate(bytes);
  if (ptr == nullptr) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    const BlockPoolStats s = blocks.stats();
    TNT_THROW("out of GPU memory on cuda:{} allocating {} bytes ({}): {} in use by tensors, {} held by the "
              "allocator (largest free block {}), {} free of {} on the device",
              device, bytes, mib(bytes), mib(s.requested), mib(s.reserved), mib(s.largest_free), mib(free_b),
              mib(total_b));
  }
  const size_t now = blocks.stats().requested;
  if (now > p.peak) p.peak = now;
  return ptr;
}

void cuda_free(void* ptr, size_t bytes, int device) {
  (void)bytes;  // the block remembers what was asked for
  if (!ptr) return;
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.blocks || !p.blocks->release(ptr)) {
    // Called from Storage's destructor, so it must not throw: report the bug instead.
    std::fprintf(stderr, "tarantella: cuda_free of %p on cuda:%d, which the allocator did not hand out\n", ptr,
                 device);
  }
}

void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  TNT_CHECK(dst_device.is_cuda() || src_device.is_cuda(), "cuda_copy between two host buffers");
  int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    cuda::synchronize(src_device.index);  // the source's producers run on the other device's stream
  }
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::compute_stream(device);
  // Stream-ordered after the kernels that produced src (or last used dst).
  TNT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  // Within one device nothing on the host touches either buffer, and every kernel that
  // reads dst (or reuses src's block from the caching allocator) is queued on the same
  // stream after the copy: no wait. Tensor::clone and the gradient copies of Add::backward
  // ran one host wait each (about 32 per ResNet-50 step) before.
  if (dst_device == src_device) return;
  // A host buffer may be read or freed as soon as this returns (and a page-locked one is
  // copied from only when the stream gets there): the host waits.
  TNT_CUDA_CHECK(cudaStreamSynchronize(stream));
  cuda::count_host_wait(device, /*readback=*/!dst_device.is_cuda());
}

void cuda_fill_bytes(void* ptr, int byte, size_t bytes, int device) {
  if (bytes == 0) return;
  TNT_CHECK(byte >= 0 && byte <= 0xff, "cuda_fill_bytes: {} is not a byte value", byte);
  cuda::DeviceGuard guard(device);
  // Stream-ordered like cuda_memset_zero: the kernels that then write these bytes come after.
  TNT_CUDA_CHECK(cudaMemsetAsync(ptr, byte, bytes, cuda::compute_stream(device)));
}

void cuda_fill(const Tensor& t, double value) { cuda::fill(t, value); }

void cuda_convert_memory_format(const Tensor& src, const Tensor& dst) { cuda::convert_memory_format(src, dst); }

void cuda_copy_async(void* dst, const void* src, size_t bytes, CudaStream stream, int device) {
  if (bytes == 0) return;
  cuda::DeviceGuard guard(device);
  // cudaMemcpyDefault: the direction follows from the pointers (unified addressing). From
  // page-locked host memory the copy is queued and the call returns at once.
  TNT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::stream_of(stream, device)));
}

void* cuda_host_alloc(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    TNT_THROW("could not allocate {} bytes ({}) of page-locked host memory: {} (input staging takes the most; "
              "TNT_PINNED_STAGING=0 copies inputs from ordinary memory instead)",
              bytes, mib(bytes), cudaGetErrorString(err));
  }
  return ptr;
}

void cuda_host_free(void* ptr) {
  if (!ptr) return;
  // Called from destructors: an error (the runtime shutting down) is cleared, not thrown.
  if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
}

void cuda_memset_zero(void* ptr, size_t bytes, int device) {
  if (bytes == 0) return;
  cuda::DeviceGuard guard(device);
  // Ordered on the compute stream like a kernel: every later reader is on that stream or
  // waits for it, so no host synchronisation is needed.
  TNT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, cuda::compute_stream(device)));
}

MemoryStats cuda_memory_stats(int device) {
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  const BlockPoolStats b = blocks_of(p, device).stats();
  MemoryStats s;
  s.current_bytes = b.requested;
  s.peak_bytes = p.peak;
  s.reserved_bytes = b.reserved;
  if (p.total == 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) p.total = prop.totalGlobalMem;
  }
  s.total_bytes = p.total;
  return s;
}

void cuda_reset_peak(int device) {
  Pool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  p.peak = blocks_of(p, device).stats().requested;
}

}  // namespace tnt::backend

namespace tnt::cuda {

size_t allocator_block_size(size_t bytes) { return backend::BlockPool::round(bytes); }

AllocatorCounters allocator_counters(int device) {
  backend::Pool& p = backend::pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  const backend::BlockPoolStats b = backend::blocks_of(p, device).stats();
  AllocatorCounters c;
  c.driver_mallocs = b.segment_allocs;
  c.driver_frees = b.segment_frees;
  c.requests = b.requests;
  c.cache_hits = b.cache_hits;
  c.cached_bytes = b.cached;
  c.reserved_bytes = b.reserved;
  c.largest_free_bytes = b.largest_free;
  c.segments = b.segments;
  return c;
}

void empty_cache(int device) {
  backend::Pool& p = backend::pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  backend::blocks_of(p, device).release_free_segments();
}

}  // namespace tnt::cuda
