#pragma once

#include <cstddef>
#include <string>

namespace tnt {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  static Device parse(const std::string& text);  // "cpu", "cuda", "cuda:1"; throws InputError

  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

// True when this build has the CUDA backend AND a CUDA device can be used at run time.
bool cuda_available();
int cuda_device_count();  // 0 on CPU-only builds
// The stream (a cudaStream_t) every engine of libtarantella launches on for this CUDA
// device. A custom layer's CUDA kernels go on it too: they are then ordered with the other
// layers and with the gradient allreduce, and need no synchronisation of their own.
// Throws tnt::Error for a CPU device or in a build without CUDA.
void* cuda_stream(Device device);

struct MemoryStats {
  size_t current_bytes = 0;  // handed out to tensors now
  size_t peak_bytes = 0;     // most ever handed out at once
  size_t reserved_bytes = 0; // held by the caching allocator (GPU)
  size_t total_bytes = 0;    // the device's capacity: the host's physical memory, the GPU's
                             // global memory (0 where unknown)
};
MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);

// What this process may hold in host memory, by each limit that applies: the host's
// physical memory, the memory limit of its cgroup (v2 memory.max, v1 memory.limit_in_bytes,
// the least over the cgroup and its parents: SLURM's --mem, a container's limit; shared by
// every process in it) and what its address-space limit (ulimit -v) leaves of the address
// space it has mapped so far (the libraries alone map hundreds of MB). 0: no such limit.
struct HostMemoryLimits {
  size_t physical_bytes = 0;
  size_t cgroup_bytes = 0;
  std::string cgroup_file;        // where the binding cgroup limit was read
  size_t address_space_limit = 0; // RLIMIT_AS
  size_t address_space_left = 0;  // RLIMIT_AS less what is mapped now
};
HostMemoryLimits host_memory_limits();
// " under ... (ulimit -v ...)" or " under ... cgroup ...": the limit that an allocation of
// host memory most likely ran into, for a message; empty when only the host's memory bounds it.
std::string host_memory_limit_text();

}  // namespace tnt
