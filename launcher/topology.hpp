// What the pinning plan needs to know about a node, read from hwloc: its NUMA domains and,
// for each, the cores (each a list of PU OS indexes). hwloc is asked once and the answer
// kept as plain data, so that plans can be computed and tested without hwloc objects.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tnt::launcher {

struct NumaDomain {
  unsigned os_index = 0;
  std::vector<std::vector<unsigned>> cores;  // PU OS indexes per core, in topology order
};

struct NodeTopology {
  std::vector<NumaDomain> domains;  // only domains with cores; memory-only ones are left out
  bool this_system = false;         // false for synthetic or XML topologies: cannot bind
  std::string source;               // for messages: "this machine", "synthetic '...'", a file
};

// This machine as hwloc sees it (cgroup-restricted cores are excluded, as they cannot be
// bound to). Throws InputError when hwloc cannot read it or it shows no NUMA domain with cores.
NodeTopology load_topology();

// An hwloc XML file (lstopo --of xml) when `spec` names an existing file, otherwise a
// synthetic description such as "pack:2 numa:1 core:8 pu:2". Throws InputError.
NodeTopology load_topology(std::string_view spec);

}  // namespace tnt::launcher
