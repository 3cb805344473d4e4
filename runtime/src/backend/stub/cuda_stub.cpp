// CPU-only build: the CUDA entry points exist so the API is the same, and fail clearly.
#include "core/device_api.hpp"
#include "tarantella/check.hpp"

namespace tnt::backend {

namespace {
[[noreturn]] void no_cuda() {
  throw Error("this libtarantella was built without CUDA (configure with -DTNT_CUDA=ON on a machine with the CUDA toolkit, cuDNN and NCCL)");
}
}  // namespace

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
void* cuda_malloc(size_t, int) { no_cuda(); }
void cuda_free(void*, size_t, int) {}
void cuda_copy(void*, Device, const void*, Device, size_t) { no_cuda(); }
void cuda_memset_zero(void*, size_t, int) { no_cuda(); }
void cuda_zero_spans(const std::vector<std::pair<void*, size_t>>&, int, std::shared_ptr<void>&) { no_cuda(); }
void cuda_cast_spans(const std::vector<CastSpan>&, int, std::shared_ptr<void>&) { no_cuda(); }
MemoryStats cuda_memory_stats(int) { return {}; }
void cuda_reset_peak(int) {}
void cuda_profiler_start(int) { no_cuda(); }
void cuda_profiler_stop(int) { no_cuda(); }
void cuda_set_device(int) { no_cuda(); }
void cuda_check_now(int) { no_cuda(); }
void* cuda_compute_stream(int) { no_cuda(); }
void cuda_fill_bytes(void*, int, size_t, int) { no_cuda(); }
void cuda_fill(const Tensor&, double) { no_cuda(); }
void cuda_convert_memory_format(const Tensor&, const Tensor&) { no_cuda(); }
int64_t cuda_host_waits(int) { return 0; }
int64_t cuda_readbacks(int) { return 0; }
void cuda_copy_async(void*, const void*, size_t, CudaStream, int) { no_cuda(); }
void* cuda_host_alloc(size_t) { no_cuda(); }
void cuda_host_free(void*) {}
void* cuda_event_create(int) { no_cuda(); }
void cuda_event_destroy(void*, int) {}
void cuda_event_record(void*, CudaStream, int) { no_cuda(); }
void cuda_stream_wait(CudaStream, void*, int) { no_cuda(); }
void cuda_event_synchronize(void*, int) { no_cuda(); }
void cuda_wait_readback(void*, int) { no_cuda(); }
void* cuda_timed_event_create(int) { no_cuda(); }
bool cuda_event_query(void*, int) { no_cuda(); }
double cuda_event_elapsed_ms(void*, void*, int) { no_cuda(); }

}  // namespace tnt::backend
