// The narrow interface between the core and the CUDA backend. backend/cuda implements it
// in CUDA builds; backend/stub implements it in CPU-only builds (every call but the
// queries throws "built without CUDA"). The core reaches CUDA only through it.
#pragma once

#include "tarantella/device.hpp"
#include "tarantella/dtype.hpp"
#include "tarantella/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace tnt::backend {

bool cuda_built();
int cuda_device_count();
void* cuda_malloc(size_t bytes, int device);  // through the caching allocator
void cuda_free(void* ptr, size_t bytes, int device);
// Copy between any two places (host or device). Synchronous with respect to the host when
// either side is host memory or the devices differ; a copy within one device is queued on
// its compute stream, ordered before every later kernel there, and the host does not wait.
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void cuda_memset_zero(void* ptr, size_t bytes, int device);
// Every byte of each span (pointer, bytes) of `device` set to zero, in one launch on the
// compute stream (the spans may not overlap). For zero_grad. `cache` (the caller's, opaque;
// empty at first) keeps the chunk table on the device: where the spans are those of the
// last call with this cache on this device, nothing is uploaded; else the upload waits.
void cuda_zero_spans(const std::vector<std::pair<void*, size_t>>& spans, int device, std::shared_ptr<void>& cache);
// dst[i] = src[i] rounded to dst_dtype (bf16 or f16, to nearest even as every cast), for each
// span, in one launch on the compute stream, with a cache as cuda_zero_spans'. For the
// compute-dtype copies of the master weights.
struct CastSpan {
  const float* src = nullptr;
  void* dst = nullptr;
  int64_t n = 0;  // elements
  DType dst_dtype = DType::bf16;
  bool operator==(const CastSpan& o) const {
    return src == o.src && dst == o.dst && n == o.n && dst_dtype == o.dst_dtype;
  }
};
void cuda_cast_spans(const std::vector<CastSpan>& spans, int device, std::shared_ptr<void>& cache);
// Every byte of [ptr, ptr + bytes) set to `byte` (0 or 0xff), on the compute stream.
void cuda_fill_bytes(void* ptr, int byte, size_t bytes, int device);
// Every element of t (on a CUDA device) set to value, converted as the host converts it.
void cuda_fill(const Tensor& t, double value);
// dst = src in dst's memory format (both 4-D, same shape, dtype and CUDA device).
void cuda_convert_memory_format(const Tensor& src, const Tensor& dst);
// Debug counters (tests count a training step's with them): every time the host waited for
// `device` through this API (cuda_copy, except within one device; cuda_event_synchronize; the
// backend's synchronize), and of those the device-to-host copies (cuda_copy to host memory).
// Waits inside other libraries (NCCL's, polled by comm/) are not counted.
int64_t cuda_host_waits(int device);
int64_t cuda_readbacks(int device);

// The streams a caller may queue on: the compute stream, and the copy stream on which input
// batches go to the device while the compute stream runs the step before (train/staging.hpp).
enum class CudaStream { compute, copy };
// Asynchronous copy queued on `stream` of `device`: host to device (from page-locked host
// memory, else the driver stages it and the copy is not asynchronous) or device to device.
// The caller orders it with events and keeps both buffers alive until it has run.
void cuda_copy_async(void* dst, const void* src, size_t bytes, CudaStream stream, int device);
// Page-locked host memory (cudaHostAlloc), freed with cuda_host_free.
void* cuda_host_alloc(size_t bytes);
void cuda_host_free(void* ptr);
// Events (cudaEvent_t, created without timing); opaque to the core.
void* cuda_event_create(int device);
void cuda_event_destroy(void* event, int device);
void cuda_event_record(void* event, CudaStream stream, int device);
// Later work queued on `stream` waits for the event's work; the host does not wait.
void cuda_stream_wait(CudaStream stream, void* event, int device);
void cuda_event_synchronize(void* event, int device);  // the host waits for the event's work
// cuda_event_synchronize for an event recorded after a device-to-host copy queued with
// cuda_copy_async into page-locked memory: counted as a readback (cuda_readbacks) as well.
void cuda_wait_readback(void* event, int device);
// Timed events, for the timeline's GPU lanes (io/timeline_gpu.hpp): destroyed with
// cuda_event_destroy, recorded with cuda_event_record.
void* cuda_timed_event_create(int device);
// Whether the event's work is done; never waits, and a "not yet" leaves no error behind for
// the next launch check.
bool cuda_event_query(void* event, int device);
// Milliseconds from one complete timed event to another (negative when `to` ran first).
double cuda_event_elapsed_ms(void* from, void* to, int device);
MemoryStats cuda_memory_stats(int device);
void cuda_reset_peak(int device);
// cudaProfilerStart / cudaProfilerStop: what nsys and ncu capture when told to start with the
// profiler API (after waiting for the device's queued work, so that the window is the steps').
void cuda_profiler_start(int device);
void cuda_profiler_stop(int device);
void cuda_set_device(int device);
// The host waits for the compute stream of `device` and throws the first error of its work
// (a kernel's fault surfaces at the next wait, wherever that is): TNT_CUDA_SYNC_CHECK calls it
// after each layer, so that the error is named with the layer that queued the work.
void cuda_check_now(int device);
// The compute stream (cudaStream_t) of `device`: where every layer engine launches, so
// work on another stream (NCCL's) that reads their results orders itself after it.
void* cuda_compute_stream(int device);

}  // namespace tnt::backend
