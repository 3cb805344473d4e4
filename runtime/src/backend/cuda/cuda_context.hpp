// Per-device CUDA resources of the compute engines: one compute stream per device, and the
// cuDNN and cuBLAS handles bound to it.
//
// Every engine launches on compute_stream(device). Because a single stream orders all of a
// device's compute, a buffer freed to the caching allocator can be handed to the next
// kernel without any event: that kernel runs after every kernel that used the old owner.
// Work on other streams (NCCL's) must make its stream wait for the compute stream with an
// event before it reads a buffer, and keep the tensor alive until it is done.
//
// The stream is created blocking (it synchronises with the legacy default stream), so a
// kernel that someone launches on stream 0 by mistake is ordered rather than racing.
// Resources are created on first use and never destroyed: they must outlive every Tensor,
// and static tensors may be freed after the CUDA runtime has begun to shut down.
#pragma once

#include "backend/cuda/cuda_check.hpp"
#include "core/device_api.hpp"
#include "tarantella/device.hpp"
#include "tarantella/tensor.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>

namespace tnt::cuda {

constexpr int kMaxDevices = 64;

// Makes `device` current for the scope and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

cudaStream_t compute_stream(int device);
// The copy stream: input batches go to the device on it while the compute stream runs
// (train/staging.hpp). Non-blocking (it never waits for the legacy default stream); every
// use is ordered against the compute stream by events.
cudaStream_t copy_stream(int device);
cudaStream_t stream_of(backend::CudaStream stream, int device);
cudnnHandle_t cudnn_handle(int device);    // bound to compute_stream(device)
cublasHandle_t cublas_handle(int device);  // bound to compute_stream(device), workspace from the cache
void synchronize(int device);              // waits for the compute stream
// The debug counters of backend::cuda_host_waits and cuda_readbacks: one host wait for
// `device`, a device-to-host copy when readback.
void count_host_wait(int device, bool readback);

// The CUDA ordinal of a tensor, checking that it lives on a CUDA device.
int device_of(const Tensor& t, const char* what);
// Checks that all tensors live on one CUDA device and returns it; also makes it current.
int common_device(std::initializer_list<const Tensor*> tensors, const char* what);

// Scratch memory from the caching allocator, returned to the cache at scope exit. Safe
// because the work that uses it is queued on the compute stream (see the top of the file).
class Workspace {
 public:
  Workspace() = default;
  Workspace(size_t bytes, int device);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Workspace(Workspace&& other) noexcept;
  Workspace& operator=(Workspace&& other) noexcept;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void release();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

// Grid size for a grid-stride loop over n elements with `block` threads per block: enough
// blocks to fill the device, never more than needed.
unsigned grid_for(int64_t n, int block, int device);

}  // namespace tnt::cuda
