// Work over many tensors of one device in one launch (core/device_api.hpp), for the per-step
// loops over a network's parameters that took one launch per parameter:
//   cuda_zero_spans   zero_grad (161 memsets a ResNet-50 step)
//   cuda_cast_spans   the compute-dtype copies of the f32 master weights before every
//                     forward (54 casts a ResNet-50 step, 97 a Transformer-big step)
// Each cuts its spans into chunks, one block a chunk, listed in a table on the device, which
// the caller keeps (an opaque cache: the Network's own). A table is uploaded again only when
// its spans change: a network's gradients and weight copies keep their memory from step to
// step.
#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/device_common.cuh"
#include "core/device_api.hpp"
#include "tarantella/check.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace tnt::backend {

namespace {

constexpr int kSpanThreads = 256;

// A chunk table on one device, rebuilt when the spans it was made from change.
template <typename Span, typename Chunk>
struct Table {
  bool made = false;
  std::vector<Span> spans;
  void* device_table = nullptr;
  size_t table_bytes = 0;
  int64_t chunks = 0;

  Table() = default;
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  ~Table() { release(); }

  // Makes the table current for spans (cut() cuts them into chunks on the host). The copy
  // waits for the device (cuda_copy from host memory; the optimizer's tables are uploaded the
  // same way): only when the spans change, at a network's first step.
  template <typename Cut>
  void update(const std::vector<Span>& want, int device, Cut&& cut) {
    if (made && want == spans) return;
    const std::vector<Chunk> host = cut(want);
    made = false;  // until the new table is complete: a failure below leaves none in use
    release();
    const size_t bytes = host.size() * sizeof(Chunk);
    if (bytes > 0) {
      device_table = cuda_malloc(bytes, device);
      device_of_table = device;
      table_bytes = bytes;
      cuda_copy(device_table, Device::cuda(device), host.data(), Device::cpu(), bytes);
    }
    chunks = static_cast<int64_t>(host.size());
    spans = want;
    made = true;
  }

  // The old table may still be read by a queued launch: it goes back to the caching
  // allocator, whose next user is ordered after that launch on the same stream.
  void release() {
    if (device_table) cuda_free(device_table, table_bytes, device_of_table);
    device_table = nullptr;
    table_bytes = 0;
    chunks = 0;
  }
  int device_of_table = 0;
};

// --- zero -------------------------------------------------------------------------------------

constexpr int64_t kZeroChunkBytes = int64_t{1} << 16;

struct ZeroChunk {
  unsigned char* p;
  int64_t bytes;  // 0 < bytes <= kZeroChunkBytes
};

// One block a chunk: 16-byte stores where the chunk starts 16-byte aligned, bytes for the rest.
__global__ void zero_chunks_kernel(const ZeroChunk* __restrict__ chunks) {
  const ZeroChunk c = chunks[blockIdx.x];
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(c.p) & 15) == 0) {
    const int64_t n16 = c.bytes / 16;
    uint4* q = reinterpret_cast<uint4*>(c.p);
    for (int64_t i = threadIdx.x; i < n16; i += blockDim.x) q[i] = make_uint4(0, 0, 0, 0);
    done = n16 * 16;
  }
  for (int64_t i = done + threadIdx.x; i < c.bytes; i += blockDim.x) c.p[i] = 0;
}

// Each chunk of a 16-byte aligned span starts 16-byte aligned.
std::vector<ZeroChunk> zero_chunks(const std::vector<std::pair<void*, size_t>>& spans) {
  std::vector<ZeroChunk> out;
  for (const auto& [ptr, bytes] : spans) {
    for (size_t at = 0; at < bytes; at += static_cast<size_t>(kZeroChunkBytes)) {
      const size_t n = std::min(bytes - at, static_cast<size_t>(kZeroChunkBytes));
      out.push_back({static_cast<unsigned char*>(ptr) + at, static_cast<int64_t>(n)});
    }
  }
  return out;
}

// --- cast ---------------------------------------------------------------------------------------

constexpr int64_t kCastChunkElements = int64_t{1} << 14;

struct CastChunk {
  const float* src;
  void* dst;
  int64_t n;      // 0 < n <= kCastChunkElements
  int32_t dtype;  // the destination's DType: bf16 or f16
};

__device__ __forceinline__ unsigned bits_of(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned bits_of(__half v) { return __half_as_ushort(v); }

template <typename T>
__device__ __forceinline__ void cast_chunk(const CastChunk& c) {
  T* dst = static_cast<T*>(c.dst);
  int64_t done = 0;
  // Four elements a thread where both ends allow it (16-byte loads, 8-byte stores).
  if ((reinterpret_cast<uintptr_t>(c.src) & 15) == 0 && (reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
    const int64_t n4 = c.n / 4;
    const float4* s4 = reinterpret_cast<const float4*>(c.src);
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 v = s4[i];
      // Packed by their bits (element 0 in the low half, as memory holds it): the same
      // conversions as ops::cast, then one 8-byte store.
      uint2 packed;
      packed.x = bits_of(cuda::from_float<T>(v.x)) | (bits_of(cuda::from_float<T>(v.y)) << 16);
      packed.y = bits_of(cuda::from_float<T>(v.z)) | (bits_of(cuda::from_float<T>(v.w)) << 16);
      *reinterpret_cast<uint2*>(dst + 4 * i) = packed;
    }
    done = n4 * 4;
  }
  for (int64_t i = done + threadIdx.x; i < c.n; i += blockDim.x) dst[i] = cuda::from_float<T>(c.src[i]);
}

__global__ void cast_chunks_kernel(const CastChunk* __restrict__ chunks) {
  const CastChunk c = chunks[blockIdx.x];
  if (c.dtype == static_cast<int32_t>(DType::bf16)) {
    cast_chunk<__nv_bfloat16>(c);
  } else {
    cast_chunk<__half>(c);
  }
}

std::vector<CastChunk> cast_chunks(const std::vector<CastSpan>& spans) {
  std::vector<CastChunk> out;
  for (const CastSpan& s : spans) {
    const size_t size = dtype_size(s.dst_dtype);
    for (int64_t at = 0; at < s.n; at += kCastChunkElements) {
      const int64_t n = std::min(s.n - at, kCastChunkElements);
      out.push_back({s.src + at, static_cast<unsigned char*>(s.dst) + static_cast<size_t>(at) * size, n,
                     static_cast<int32_t>(s.dst_dtype)});
    }
  }
  return out;
}

// A caller's tables (the Network's: two networks on one device keep one each), by device.
using ZeroTable = Table<std::pair<void*, size_t>, ZeroChunk>;
using CastTable = Table<CastSpan, CastChunk>;
template <typename T>
struct Tables {
  std::map<int, std::unique_ptr<T>> by_device;
  T& of(int device) {
    std::unique_ptr<T>& t = by_device[device];
    if (!t) t = std::make_unique<T>();
    return *t;
  }
};
template <typename T>
T& table_in(std::shared_ptr<void>& cache, int device) {
  if (!cache) cache = std::make_shared<Tables<T>>();
  return static_cast<Tables<T>*>(cache.get())->of(device);
}

std::mutex tables_mu;

void check_device(int device, const char* what) {
  TNT_CHECK(device >= 0 && device < cuda::kMaxDevices, "{}: device {} out of range", what, device);
}

}  // namespace

void cuda_zero_spans(const std::vector<std::pair<void*, size_t>>& spans, int device, std::shared_ptr<void>& cache) {
  check_device(device, "cuda_zero_spans");
  cuda::DeviceGuard guard(device);
  std::lock_guard<std::mutex> lock(tables_mu);
  ZeroTable& t = table_in<ZeroTable>(cache, device);
  t.update(spans, device, zero_chunks);
  if (t.chunks == 0) return;
  zero_chunks_kernel<<<static_cast<unsigned>(t.chunks), kSpanThreads, 0, cuda::compute_stream(device)>>>(
      static_cast<const ZeroChunk*>(t.device_table));
  TNT_CUDA_CHECK_LAUNCH();
}

void cuda_cast_spans(const std::vector<CastSpan>& spans, int device, std::shared_ptr<void>& cache) {
  check_device(device, "cuda_cast_spans");
  for (const CastSpan& s : spans) {
    TNT_CHECK((s.dst_dtype == DType::bf16 || s.dst_dtype == DType::f16) && s.n >= 0 && (s.n == 0 || (s.src && s.dst)),
              "cuda_cast_spans: f32 into {} of {} elements", dtype_name(s.dst_dtype), s.n);
  }
  cuda::DeviceGuard guard(device);
  std::lock_guard<std::mutex> lock(tables_mu);
  CastTable& t = table_in<CastTable>(cache, device);
  t.update(spans, device, cast_chunks);
  if (t.chunks == 0) return;
  cast_chunks_kernel<<<static_cast<unsigned>(t.chunks), kSpanThreads, 0, cuda::compute_stream(device)>>>(
      static_cast<const CastChunk*>(t.device_table));
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::backend
