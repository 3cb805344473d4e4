#include "tarantella/device.hpp"

#include "core/device_api.hpp"
#include "core/memory.hpp"
#include "tarantella/check.hpp"

#include <charconv>

namespace tnt {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda" || text == "gpu") return cuda(0);
  for (const char* prefix : {"cuda:", "gpu:"}) {
    std::string p(prefix);
    if (text.rfind(p, 0) == 0) {
      int index = -1;
      const char* b = text.data() + p.size();
      const char* e = text.data() + text.size();
      auto [ptr, ec] = std::from_chars(b, e, index);
      if (ec == std::errc() && ptr == e && index >= 0 && b != e) return cuda(index);
    }
  }
  TNT_INPUT_ERROR("device '{}' is not 'cpu', 'cuda' or 'cuda:K'", text);
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

bool cuda_available() { return backend::cuda_built() && backend::cuda_device_count() > 0; }
int cuda_device_count() { return backend::cuda_built() ? backend::cuda_device_count() : 0; }

void* cuda_stream(Device device) {
  TNT_CHECK(device.is_cuda(), "cuda_stream: {} is not a CUDA device", device.str());
  return backend::cuda_compute_stream(device.index);
}

MemoryStats memory_stats(Device device) {
  return device.is_cpu() ? host_memory_stats() : backend::cuda_memory_stats(device.index);
}

void reset_peak_memory(Device device) {
  if (device.is_cpu()) {
    reset_host_peak();
  } else {
    backend::cuda_reset_peak(device.index);
  }
}

}  // namespace tnt
