// NUMA pinning plan for the ranks of one node. Local rank i goes to NUMA domain i mod K
// (K = domains with cores); the ranks that land on one domain split its cores into
// disjoint contiguous blocks, so two ranks never compete for a core unless there are
// more ranks than cores. The launcher (for --dry-run and warnings) and every rank's own
// step compute this with the same function, so what is printed is what is applied.
#pragma once

#include "topology.hpp"

#include <string>
#include <vector>

namespace tnt::launcher {

enum class PinMode {
  none,
  socket,         // --pin-to-socket: cores of the domain, memory preferred there
  socket_strict,  // --pin-memory-to-socket: the same cores, memory only from that domain
};

struct RankBinding {
  unsigned numa_node = 0;      // OS index, as numactl and libnuma number nodes
  std::vector<unsigned> cpus;  // OS indexes of the PUs of the rank's cores, ascending
  int cores = 0;               // TNT_NUM_THREADS: one compute thread per core
};

struct NodeBindings {
  std::vector<RankBinding> ranks;     // indexed by local rank
  std::vector<std::string> warnings;  // at most one of each kind
};

// Throws InputError when the topology has no domain with cores (it cannot be pinned to).
NodeBindings plan_node_bindings(const NodeTopology& topology, int local_size);

// "0-3,8,10-11": the notation of taskset, numactl and hwloc.
std::string format_cpu_list(const std::vector<unsigned>& cpus);

const char* pin_mode_name(PinMode mode);

}  // namespace tnt::launcher
