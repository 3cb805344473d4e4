#include "gpus.hpp"

#include "text.hpp"

#include <dlfcn.h>

#include <algorithm>

namespace tnt::launcher {

namespace {

// NVML's and the driver's C signatures, declared here because their headers are not
// installed on a CPU-only machine. Both return 0 on success.
using NvmlInit = int (*)();
using NvmlGetCount = int (*)(unsigned*);
using NvmlShutdown = int (*)();
using CuInit = int (*)(unsigned);
using CuGetCount = int (*)(int*);

int count_with_nvml() {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return -1;
  int count = -1;
  auto init = reinterpret_cast<NvmlInit>(::dlsym(lib, "nvmlInit_v2"));
  auto get = reinterpret_cast<NvmlGetCount>(::dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto shutdown = reinterpret_cast<NvmlShutdown>(::dlsym(lib, "nvmlShutdown"));
  if (init != nullptr && get != nullptr && init() == 0) {
    unsigned n = 0;
    if (get(&n) == 0) count = static_cast<int>(n);
    if (shutdown != nullptr) shutdown();
  }
  ::dlclose(lib);
  return count;
}

// The driver API applies CUDA_VISIBLE_DEVICES itself.
int count_with_driver() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return -1;
  int count = -1;
  auto init = reinterpret_cast<CuInit>(::dlsym(lib, "cuInit"));
  auto get = reinterpret_cast<CuGetCount>(::dlsym(lib, "cuDeviceGetCount"));
  if (init != nullptr && get != nullptr && init(0) == 0) {
    int n = 0;
    if (get(&n) == 0) count = n;
  }
  // The driver library is not closed: unloading it after cuInit is not supported.
  return count;
}

}  // namespace

int visible_gpu_count(const std::string& cuda_visible_devices, int physical) {
  auto value = trim(cuda_visible_devices);
  if (value.empty()) return 0;
  int entries = 0;
  for (auto e : split(value, ',')) {
    if (trim(e).empty()) break;
    if (trim(e) == "-1") break;  // a common way to hide the rest
    ++entries;
  }
  return std::min(entries, physical);
}

int count_gpus(const Environment& env) {
  int physical = count_with_nvml();
  if (physical >= 0) {
    if (auto cvd = lookup(env, "CUDA_VISIBLE_DEVICES")) return visible_gpu_count(*cvd, physical);
    return physical;
  }
  int visible = count_with_driver();
  return std::max(visible, 0);
}

}  // namespace tnt::launcher
