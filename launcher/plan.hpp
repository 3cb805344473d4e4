// The launch plan: which hosts, how many ranks on each, and for every rank its host, local
// rank, device and (when pinned) NUMA node and cores. Ranks fill a host before the next
// one, so rank 0 (the master) is on the first host. A host's count is -n, else its slots
// (the hostfile's, the SLURM allocation's tasks, the GPUs, 1); with -np N the slots are
// filled in host order until N ranks are placed, as Open MPI's by-slot mapping does. The plan is computed once in the
// launcher, printed by --dry-run, and turned into the mpirun command; each rank's own step
// recomputes its device and binding on its own node with the same functions.
#pragma once

#include "binding.hpp"
#include "cli.hpp"
#include "environment.hpp"
#include "hostfile.hpp"
#include "topology.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

enum class DeviceKind { cpu, gpu };

// Where the hosts come from, before ranks are counted.
struct HostSelection {
  std::string source;                // "hostfile 'x'", "-H", "SLURM job 42", "this machine"
  std::vector<HostEntry> hosts;      // in order; rank 0 goes to the first
  std::vector<int> slurm_tasks;      // SLURM_NTASKS_PER_NODE per host, or empty
  std::vector<std::string> warnings;
  bool this_machine = false;         // no hosts given: -np N puts all N here
};

// --hostfile, else -H, else the SLURM allocation, else this machine. Reads the hostfile.
// Throws InputError.
HostSelection select_hosts(const Options& options, const Environment& env);

struct HostPlan {
  std::string name;
  int ranks = 0;
  bool local = false;  // the launching machine itself
};

struct RankPlacement {
  int rank = 0;
  std::string host;
  int local_rank = 0;
  int local_size = 0;
  std::string device;                  // "cpu" or "cuda:K"
  std::optional<RankBinding> binding;  // when pinned
};

struct LaunchPlan {
  std::string host_source;
  std::vector<HostPlan> hosts;
  std::vector<RankPlacement> ranks;
  DeviceKind device = DeviceKind::cpu;
  int gpus = 0;  // GPUs of the launching node, the count the plan was made with
  PinMode pin = PinMode::none;
  std::string topology_source;  // where NUMA nodes and cores came from, when pinned
  std::vector<std::string> warnings;
};

// `gpus` are the launching node's; `topology` is required when options.pin != none;
// `this_host` is gethostname(), to mark the local host. Throws InputError.
LaunchPlan make_plan(const Options& options, const HostSelection& hosts, int gpus,
                     const NodeTopology* topology, const std::string& this_host);

// Open MPI's by-slot placement of `total` ranks over hosts with `slots` each: fill the first
// host's slots, then the next host's. With `oversubscribe`, the ranks beyond all the slots
// are spread evenly over the hosts, the first hosts taking one more for the remainder (as
// Open MPI's by-slot mapper does). nullopt when `total` exceeds the slots without
// `oversubscribe`; hosts left over get 0.
std::optional<std::vector<int>> place_by_slot(int total, const std::vector<int>& slots, bool oversubscribe);

// "cuda:K" for GPU ranks (K = local_rank mod gpus), "cpu" otherwise.
std::string device_name(DeviceKind kind, int local_rank, int gpus);

bool is_local_host(const std::string& name, const std::string& this_host);

// The --dry-run table and its header lines.
std::string format_plan(const LaunchPlan& plan);

}  // namespace tnt::launcher
