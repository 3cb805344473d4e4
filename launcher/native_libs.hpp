// hwloc and libnuma, loaded with dlopen on first use instead of linked. The launcher binary
// starts once per job and once more per rank (the per-rank step), and linking the two
// libraries cost every start about 0.35 ms -- loading them, resolving their symbols and
// libnuma's constructor -- for what only pinning and planning need. Each table holds the
// functions this launcher calls, typed from the libraries' own headers, so a signature
// mismatch is a compile error; nothing here links against either library, so a direct
// call that bypasses the table is a link error.
#pragma once

#include <hwloc.h>
#include <numa.h>
#include <numaif.h>

namespace tnt::launcher {

struct Hwloc {
  decltype(&::hwloc_get_api_version) get_api_version;
  decltype(&::hwloc_topology_init) topology_init;
  decltype(&::hwloc_topology_load) topology_load;
  decltype(&::hwloc_topology_destroy) topology_destroy;
  decltype(&::hwloc_topology_set_xml) topology_set_xml;
  decltype(&::hwloc_topology_set_synthetic) topology_set_synthetic;
  decltype(&::hwloc_topology_is_thissystem) topology_is_thissystem;
  decltype(&::hwloc_get_type_depth) get_type_depth;
  decltype(&::hwloc_get_nbobjs_by_depth) get_nbobjs_by_depth;
  decltype(&::hwloc_get_obj_by_depth) get_obj_by_depth;
  decltype(&::hwloc_bitmap_iszero) bitmap_iszero;
  decltype(&::hwloc_bitmap_isequal) bitmap_isequal;
  decltype(&::hwloc_bitmap_isset) bitmap_isset;

  // hwloc.h's inline helpers of the same names, over the table.
  int nbobjs_by_type(hwloc_topology_t topology, hwloc_obj_type_t type) const;
  hwloc_obj_t obj_by_type(hwloc_topology_t topology, hwloc_obj_type_t type, unsigned index) const;

  // Loads libhwloc on the first call. Throws InputError when it cannot be loaded or is
  // not the ABI the launcher was built against.
  static const Hwloc& get();
};

struct Numa {
  decltype(&::numa_available) available;
  decltype(&::numa_allocate_cpumask) allocate_cpumask;
  decltype(&::numa_allocate_nodemask) allocate_nodemask;
  decltype(&::numa_bitmask_setbit) bitmask_setbit;
  decltype(&::numa_bitmask_free) bitmask_free;
  decltype(&::numa_sched_setaffinity) sched_setaffinity;
  decltype(&::numa_set_preferred) set_preferred;
  decltype(&::numa_set_membind) set_membind;
  decltype(&::get_mempolicy) get_mempolicy;

  // Loads libnuma on the first call. Throws InputError when it cannot be loaded.
  static const Numa& get();
};

}  // namespace tnt::launcher
