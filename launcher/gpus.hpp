// Counting the GPUs of this node without linking CUDA: NVML (libnvidia-ml.so.1, shipped
// with the driver) is loaded at run time with dlopen, and the driver API (libcuda.so.1)
// is the fallback. On a machine without the NVIDIA driver both loads fail in microseconds
// and the count is 0, so a CPU-only machine needs neither library.
#pragma once

#include "environment.hpp"

namespace tnt::launcher {

// GPUs a CUDA program started with `env` would see: CUDA_VISIBLE_DEVICES, when set, limits
// the count (an empty value hides every GPU).
int count_gpus(const Environment& env);

// The count of entries of a CUDA_VISIBLE_DEVICES value, at most `physical`: CUDA stops at
// the first invalid entry, which we cannot judge without the driver, so entries are
// trusted and capped.
int visible_gpu_count(const std::string& cuda_visible_devices, int physical);

}  // namespace tnt::launcher
