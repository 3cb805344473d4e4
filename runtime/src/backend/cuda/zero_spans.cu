// backend::cuda_zero_spans (core/device_api.hpp): many byte ranges of one device set to zero
// by one kernel, for zero_grad (one memset per parameter was ~160 launches a ResNet-50 step,
// ~260 a Transformer-big step). The ranges are cut into chunks of at most kChunkBytes, one
// block each; the chunk table lives on the device and is uploaded again only when the
// ranges change (a network's gradients keep their memory from step to step).
#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/device_common.cuh"
#include "core/device_api.hpp"
#include "tarantella/check.hpp"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace tnt::backend {

namespace {

constexpr int64_t kChunkBytes = int64_t{1} << 16;
constexpr int kZeroThreads = 256;

struct Chunk {
  unsigned char* p;
  int64_t bytes;  // 0 < bytes <= kChunkBytes
};

// One block a chunk: 16-byte stores where the chunk starts 16-byte aligned, bytes for the rest.
__global__ void zero_chunks_kernel(const Chunk* __restrict__ chunks) {
  const Chunk c = chunks[blockIdx.x];
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(c.p) & 15) == 0) {
    const int64_t n16 = c.bytes / 16;
    uint4* q = reinterpret_cast<uint4*>(c.p);
    for (int64_t i = threadIdx.x; i < n16; i += blockDim.x) q[i] = make_uint4(0, 0, 0, 0);
    done = n16 * 16;
  }
  for (int64_t i = done + threadIdx.x; i < c.bytes; i += blockDim.x) c.p[i] = 0;
}

struct Table {
  std::vector<std::pair<void*, size_t>> spans;  // what the table on the device was made from
  void* device_table = nullptr;
  size_t table_bytes = 0;
  int64_t chunks = 0;
};

std::mutex tables_mu;
Table tables[cuda::kMaxDevices];

// The spans cut into chunks of at most kChunkBytes (each chunk of a 16-byte aligned span
// starts 16-byte aligned).
std::vector<std::pair<void*, int64_t>> zero_span_chunks(const std::vector<std::pair<void*, size_t>>& spans) {
  std::vector<std::pair<void*, int64_t>> out;
  for (const auto& [ptr, bytes] : spans) {
    for (size_t at = 0; at < bytes; at += static_cast<size_t>(kChunkBytes)) {
      const size_t n = std::min(bytes - at, static_cast<size_t>(kChunkBytes));
      out.push_back({static_cast<unsigned char*>(ptr) + at, static_cast<int64_t>(n)});
    }
  }
  return out;
}

}  // namespace

void cuda_zero_spans(const std::vector<std::pair<void*, size_t>>& spans, int device) {
  TNT_CHECK(device >= 0 && device < cuda::kMaxDevices, "cuda_zero_spans: device {} out of range", device);
  cuda::DeviceGuard guard(device);
  std::lock_guard<std::mutex> lock(tables_mu);
  Table& t = tables[device];
  if (t.spans != spans) {
    const std::vector<std::pair<void*, int64_t>> parts = zero_span_chunks(spans);
    std::vector<Chunk> host(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) host[i] = {static_cast<unsigned char*>(parts[i].first), parts[i].second};
    const size_t bytes = host.size() * sizeof(Chunk);
    // The old table may still be read by a queued launch: freed to the caching allocator,
    // whose next user is ordered after it on the compute stream.
    if (t.device_table) cuda_free(t.device_table, t.table_bytes, device);
    t = Table{};
    if (bytes > 0) {
      t.device_table = cuda_malloc(bytes, device);
      t.table_bytes = bytes;
      // From pageable memory: the driver has staged the bytes when the call returns.
      TNT_CUDA_CHECK(cudaMemcpyAsync(t.device_table, host.data(), bytes, cudaMemcpyHostToDevice,
                                     cuda::compute_stream(device)));
    }
    t.chunks = static_cast<int64_t>(host.size());
    t.spans = spans;
  }
  if (t.chunks == 0) return;
  zero_chunks_kernel<<<static_cast<unsigned>(t.chunks), kZeroThreads, 0, cuda::compute_stream(device)>>>(
      static_cast<const Chunk*>(t.device_table));
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::backend
