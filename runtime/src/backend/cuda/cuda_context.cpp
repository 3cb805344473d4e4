#include "backend/cuda/cuda_context.hpp"

#include "backend/cuda/cublas_api.hpp"
#include "core/device_api.hpp"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <atomic>
#include <mutex>

namespace tnt::cuda {

namespace {

// cuBLAS's recommended workspace on Hopper; smaller GPUs use less of it.
constexpr size_t kCublasWorkspaceBytes = 32u << 20;

struct DeviceResources {
  std::once_flag stream_once, copy_once, cudnn_once, cublas_once, props_once;
  cudaStream_t stream = nullptr;
  cudaStream_t copy = nullptr;
  std::atomic<int64_t> host_waits{0};  // see count_host_wait
  std::atomic<int64_t> readbacks{0};
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  int sm_count = 1;
};

// Never destroyed (see the header).
DeviceResources& resources(int device) {
  static DeviceResources* all = new DeviceResources[kMaxDevices];
  TNT_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index {} out of range [0, {})", device, kMaxDevices);
  return all[device];
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  TNT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    TNT_CUDA_CHECK(cudaSetDevice(device));
  } else {
    previous_ = -1;  // nothing to restore
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

cudaStream_t compute_stream(int device) {
  DeviceResources& r = resources(device);
  std::call_once(r.stream_once, [&] {
    DeviceGuard guard(device);
    TNT_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamDefault));
  });
  return r.stream;
}

cudaStream_t copy_stream(int device) {
  DeviceResources& r = resources(device);
  std::call_once(r.copy_once, [&] {
    DeviceGuard guard(device);
    TNT_CUDA_CHECK(cudaStreamCreateWithFlags(&r.copy, cudaStreamNonBlocking));
  });
  return r.copy;
}

cudaStream_t stream_of(backend::CudaStream stream, int device) {
  return stream == backend::CudaStream::copy ? copy_stream(device) : compute_stream(device);
}

cudnnHandle_t cudnn_handle(int device) {
  DeviceResources& r = resources(device);
  cudaStream_t stream = compute_stream(device);
  std::call_once(r.cudnn_once, [&] {
    DeviceGuard guard(device);
    TNT_CUDNN_CHECK(cudnnCreate(&r.cudnn));
    TNT_CUDNN_CHECK(cudnnSetStream(r.cudnn, stream));
  });
  return r.cudnn;
}

cublasHandle_t cublas_handle(int device) {
  DeviceResources& r = resources(device);
  cudaStream_t stream = compute_stream(device);
  std::call_once(r.cublas_once, [&] {
    DeviceGuard guard(device);
    const CublasApi& api = cublas_api();
    TNT_CUBLAS_CHECK(api.create(&r.cublas));
    // SetStream resets the workspace to cuBLAS's own pool, so the workspace comes after.
    TNT_CUBLAS_CHECK(api.set_stream(r.cublas, stream));
    // A fixed workspace held for the life of the process: cuBLAS then never allocates
    // during a step. It is taken once, outside the tensor statistics.
    void* ws = nullptr;
    TNT_CUDA_CHECK(cudaMalloc(&ws, kCublasWorkspaceBytes));
    TNT_CUBLAS_CHECK(api.set_workspace(r.cublas, ws, kCublasWorkspaceBytes));
    // Plain FP32 products (no TF32) so that f32 results stay within FP32 rounding of the
    // CPU engine's.
    TNT_CUBLAS_CHECK(api.set_math_mode(r.cublas, CUBLAS_DEFAULT_MATH));
  });
  return r.cublas;
}

void synchronize(int device) {
  DeviceGuard guard(device);
  TNT_CUDA_CHECK(cudaStreamSynchronize(compute_stream(device)));
  count_host_wait(device, false);
}

void count_host_wait(int device, bool readback) {
  DeviceResources& r = resources(device);
  r.host_waits.fetch_add(1, std::memory_order_relaxed);
  if (readback) r.readbacks.fetch_add(1, std::memory_order_relaxed);
}

int device_of(const Tensor& t, const char* what) {
  TNT_CHECK(t.defined(), "{}: undefined tensor", what);
  TNT_CHECK(t.device().is_cuda(), "{}: tensor {} is not on a CUDA device", what, t.str());
  return t.device().index;
}

int common_device(std::initializer_list<const Tensor*> tensors, const char* what) {
  int device = -1;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    int d = device_of(*t, what);
    TNT_CHECK(device < 0 || d == device, "{}: tensors on different devices (cuda:{} and {})", what, device,
              t->device().str());
    device = d;
  }
  TNT_CHECK(device >= 0, "{}: no CUDA tensor given", what);
  TNT_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

Workspace::Workspace(size_t bytes, int device) : bytes_(bytes), device_(device) {
  if (bytes > 0) ptr_ = backend::cuda_malloc(bytes, device);
}

Workspace::~Workspace() { release(); }

Workspace::Workspace(Workspace&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_), device_(other.device_) {
  other.ptr_ = nullptr;
  other.bytes_ = 0;
}

Workspace& Workspace::operator=(Workspace&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Workspace::release() {
  if (ptr_) backend::cuda_free(ptr_, bytes_, device_);
  ptr_ = nullptr;
  bytes_ = 0;
}

unsigned grid_for(int64_t n, int block, int device) {
  DeviceResources& r = resources(device);
  std::call_once(r.props_once, [&] {
    int sms = 1;
    TNT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    r.sm_count = std::max(sms, 1);
  });
  int64_t needed = (n + block - 1) / block;
  // 32 blocks per SM keep every SM busy for a grid-stride loop; more only adds launches.
  int64_t cap = static_cast<int64_t>(r.sm_count) * 32;
  return static_cast<unsigned>(std::clamp<int64_t>(needed, 1, cap));
}

}  // namespace tnt::cuda

namespace tnt::backend {

void* cuda_compute_stream(int device) { return cuda::compute_stream(device); }

void* cuda_event_create(int device) {
  cuda::DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  // Without timing: recording and waiting are then cheapest.
  TNT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void cuda_event_destroy(void* event, int device) {
  if (!event) return;
  cuda::DeviceGuard guard(device);
  // Called from destructors: an error is cleared, not thrown.
  if (cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) cudaGetLastError();
}

void cuda_event_record(void* event, CudaStream stream, int device) {
  cuda::DeviceGuard guard(device);
  TNT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), cuda::stream_of(stream, device)));
}

void cuda_stream_wait(CudaStream stream, void* event, int device) {
  cuda::DeviceGuard guard(device);
  TNT_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream_of(stream, device), static_cast<cudaEvent_t>(event), 0));
}

void cuda_event_synchronize(void* event, int device) {
  cuda::DeviceGuard guard(device);
  TNT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  cuda::count_host_wait(device, false);
}

void cuda_check_now(int device) {
  cuda::DeviceGuard guard(device);
  TNT_CUDA_CHECK(cudaGetLastError());
  TNT_CUDA_CHECK(cudaStreamSynchronize(cuda::stream_of(CudaStream::compute, device)));
  cuda::count_host_wait(device, false);
}

void cuda_wait_readback(void* event, int device) {
  cuda::DeviceGuard guard(device);
  TNT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  cuda::count_host_wait(device, true);
}

void* cuda_timed_event_create(int device) {
  cuda::DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  TNT_CUDA_CHECK(cudaEventCreate(&event));
  return event;
}

bool cuda_event_query(void* event, int device) {
  cuda::DeviceGuard guard(device);
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaSuccess) return true;
  // "Not ready" would otherwise stay the thread's last error, and the next kernel's launch
  // check (cudaGetLastError) would report it.
  cudaGetLastError();
  if (e == cudaErrorNotReady) return false;
  TNT_CUDA_CHECK(e);
  return false;
}

double cuda_event_elapsed_ms(void* from, void* to, int device) {
  cuda::DeviceGuard guard(device);
  float ms = 0;
  TNT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
  return ms;
}

void cuda_profiler_start(int device) {
  TNT_CUDA_CHECK(cudaSetDevice(device));
  TNT_CUDA_CHECK(cudaDeviceSynchronize());
  TNT_CUDA_CHECK(cudaProfilerStart());
}

void cuda_profiler_stop(int device) {
  TNT_CUDA_CHECK(cudaSetDevice(device));
  TNT_CUDA_CHECK(cudaDeviceSynchronize());
  TNT_CUDA_CHECK(cudaProfilerStop());
}

int64_t cuda_host_waits(int device) { return cuda::resources(device).host_waits.load(std::memory_order_relaxed); }

int64_t cuda_readbacks(int device) { return cuda::resources(device).readbacks.load(std::memory_order_relaxed); }

}  // namespace tnt::backend
