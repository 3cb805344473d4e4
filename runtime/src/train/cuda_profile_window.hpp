// TNT_CUDA_PROFILE_STEPS=a-b: cudaProfilerStart before training step a and cudaProfilerStop
// after step b (steps count from 1 over the whole run, as the timeline's), so that a
// profiler told to capture by the profiler API records exactly those steps:
//   nsys profile --capture-range=cudaProfilerApi ...   ncu --profile-from-start off ...
// The device's queued work is waited for at both ends. On a CPU rank it only warns.
#pragma once

#include "tarantella/device.hpp"

#include <cstdint>

namespace tnt::detail {

class CudaProfileWindow {
 public:
  explicit CudaProfileWindow(Device device);  // off unless TNT_CUDA_PROFILE_STEPS is set
  ~CudaProfileWindow();                       // closes a window training left open
  CudaProfileWindow(const CudaProfileWindow&) = delete;
  CudaProfileWindow& operator=(const CudaProfileWindow&) = delete;
  void step_begin(int64_t step);
  void step_end(int64_t step);
  bool open() const { return open_; }

 private:
  int device_ = -1;  // -1: off
  int64_t first_ = 0, last_ = 0;
  bool open_ = false;
};

}  // namespace tnt::detail
