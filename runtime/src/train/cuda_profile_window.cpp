#include "train/cuda_profile_window.hpp"

#include "core/device_api.hpp"
#include "tarantella/config.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

namespace tnt::detail {

CudaProfileWindow::CudaProfileWindow(Device device) {
  const std::string& window = config().cuda_profile_steps;
  if (window.empty()) return;
  const auto [first, last] = parse_step_window(window, "TNT_CUDA_PROFILE_STEPS");
  if (!device.is_cuda()) {
    log_warning("TNT_CUDA_PROFILE_STEPS={} has no effect: this rank trains on {}, not a GPU", window, device.str());
    return;
  }
  device_ = device.index;
  first_ = first;
  last_ = last;
}

CudaProfileWindow::~CudaProfileWindow() {
  if (!open_) return;
  try {
    backend::cuda_profiler_stop(device_);
  } catch (...) {  // a destructor must not throw; the profiler stops with the process anyway
  }
}

void CudaProfileWindow::step_begin(int64_t step) {
  if (device_ < 0 || open_ || step < first_ || step > last_) return;
  backend::cuda_profiler_start(device_);
  open_ = true;
  log_info("CUDA profiler started before step {} (TNT_CUDA_PROFILE_STEPS={}-{})", step, first_, last_);
}

void CudaProfileWindow::step_end(int64_t step) {
  if (!open_ || step < last_) return;
  backend::cuda_profiler_stop(device_);
  open_ = false;
  log_info("CUDA profiler stopped after step {}", step);
}

}  // namespace tnt::detail
