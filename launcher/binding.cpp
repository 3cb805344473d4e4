#include "binding.hpp"

#include "error.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tnt::launcher {

NodeBindings plan_node_bindings(const NodeTopology& topology, int local_size) {
  const int k = static_cast<int>(topology.domains.size());
  if (k == 0) throw InputError(fmt::format("{} has no NUMA node with cores to pin ranks to", topology.source));
  NodeBindings out;
  if (local_size <= 0) return out;

  if (local_size > k) {
    out.warnings.push_back(fmt::format(
        "{} ranks per node on {} NUMA node{}: ranks that share a NUMA node get disjoint sets of its cores",
        local_size, k, k == 1 ? "" : "s"));
  }
  bool cores_shared = false;
  for (int i = 0; i < local_size; ++i) {
    const NumaDomain& domain = topology.domains[static_cast<size_t>(i % k)];
    const int sharing = (local_size - 1 - i % k) / k + 1;  // ranks j < local_size with j % k == i % k
    const int slot = i / k;                                 // this rank's place among them
    const int ncores = static_cast<int>(domain.cores.size());

    int first = 0, count = 0;
    if (sharing <= ncores) {
      // Blocks differ by at most one core; the first (ncores % sharing) ranks get the extra.
      const int base = ncores / sharing, extra = ncores % sharing;
      first = slot * base + std::min(slot, extra);
      count = base + (slot < extra ? 1 : 0);
    } else {
      cores_shared = true;
      first = slot % ncores;
      count = 1;
    }
    RankBinding b;
    b.numa_node = domain.os_index;
    b.cores = count;
    for (int c = first; c < first + count; ++c) {
      const auto& pus = domain.cores[static_cast<size_t>(c)];
      b.cpus.insert(b.cpus.end(), pus.begin(), pus.end());
    }
    std::sort(b.cpus.begin(), b.cpus.end());
    out.ranks.push_back(std::move(b));
  }
  if (cores_shared) {
    out.warnings.push_back(fmt::format(
        "{} ranks per node exceed the cores of a NUMA node: some ranks share a core", local_size));
  }
  return out;
}

std::string format_cpu_list(const std::vector<unsigned>& cpus) {
  std::string out;
  size_t i = 0;
  while (i < cpus.size()) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += (j == i) ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

const char* pin_mode_name(PinMode mode) {
  switch (mode) {
    case PinMode::none: return "none";
    case PinMode::socket: return "socket";
    case PinMode::socket_strict: return "socket-strict";
  }
  return "none";
}

}  // namespace tnt::launcher
