#include "topology.hpp"

#include "error.hpp"
#include "native_libs.hpp"
#include "text.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>

namespace tnt::launcher {

namespace {

// An hwloc XML file of a machine with thousands of cores is a few MiB.
constexpr off_t max_topology_bytes = 256L * 1024 * 1024;

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { Hwloc::get().topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

// Several NUMA nodes can share one set of cores (DRAM plus HBM or CXL memory behind the
// same package); for pinning ranks to cores only the first of them is a distinct domain.
NodeTopology extract(hwloc_topology_t topo, std::string source) {
  const Hwloc& hw = Hwloc::get();
  NodeTopology out;
  out.source = std::move(source);
  out.this_system = hw.topology_is_thissystem(topo) != 0;

  std::vector<hwloc_const_cpuset_t> seen;
  const int numa_count = hw.nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  const int pu_count = hw.nbobjs_by_type(topo, HWLOC_OBJ_PU);
  for (int n = 0; n < numa_count; ++n) {
    hwloc_obj_t numa = hw.obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(n));
    if (numa == nullptr || numa->cpuset == nullptr || hw.bitmap_iszero(numa->cpuset)) continue;
    bool duplicate = false;
    for (auto s : seen) duplicate = duplicate || hw.bitmap_isequal(s, numa->cpuset);
    if (duplicate) continue;
    seen.push_back(numa->cpuset);

    NumaDomain domain;
    domain.os_index = numa->os_index;
    hwloc_obj_t current_core = nullptr;
    for (int p = 0; p < pu_count; ++p) {
      hwloc_obj_t pu = hw.obj_by_type(topo, HWLOC_OBJ_PU, static_cast<unsigned>(p));
      if (!hw.bitmap_isset(numa->cpuset, pu->os_index)) continue;
      // A topology without a core level (some synthetic ones) counts each PU as a core.
      hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_CORE, pu);
      if (core == nullptr || core != current_core || domain.cores.empty()) {
        domain.cores.push_back({});
        current_core = core;
      }
      domain.cores.back().push_back(pu->os_index);
    }
    if (!domain.cores.empty()) out.domains.push_back(std::move(domain));
  }
  if (out.domains.empty()) {
    throw InputError(fmt::format("the topology of {} shows no NUMA node with cores", out.source));
  }
  return out;
}

TopologyPtr new_topology() {
  hwloc_topology_t raw = nullptr;
  if (Hwloc::get().topology_init(&raw) != 0) throw system_error("hwloc_topology_init");
  return TopologyPtr(raw);
}

}  // namespace

NodeTopology load_topology() {
  auto topo = new_topology();
  if (Hwloc::get().topology_load(topo.get()) != 0) {
    throw InputError(fmt::format("cannot read this machine's topology with hwloc: {}", std::strerror(errno)));
  }
  NodeTopology t = extract(topo.get(), "this machine");
  if (!t.this_system) {
    // hwloc read another machine, as its environment told it: named in messages.
    if (const char* x = std::getenv("HWLOC_XMLFILE")) {
      t.source = fmt::format("the topology in HWLOC_XMLFILE='{}'", x);
    } else if (const char* y = std::getenv("HWLOC_SYNTHETIC")) {
      t.source = fmt::format("the synthetic topology HWLOC_SYNTHETIC='{}'", y);
    } else {
      t.source = "a topology that is not this machine's (set by hwloc's environment)";
    }
  }
  return t;
}

NodeTopology load_topology(std::string_view spec) {
  const std::string s(spec);
  auto topo = new_topology();
  struct stat st {};
  std::string source;
  if (::stat(s.c_str(), &st) == 0) {
    // hwloc reads the whole file: /dev/zero would never end, and a FIFO without a writer
    // would block the launcher for good.
    if (!S_ISREG(st.st_mode)) {
      throw InputError(fmt::format("topology file '{}' is not a regular file ({}): give an hwloc XML file "
                                   "(lstopo FILE.xml) or a synthetic description", s, file_kind(st.st_mode)));
    }
    if (st.st_size > max_topology_bytes) {
      throw InputError(fmt::format("topology file '{}' is larger than {} MiB: not an hwloc XML file", s,
                                   max_topology_bytes / (1024 * 1024)));
    }
    if (Hwloc::get().topology_set_xml(topo.get(), s.c_str()) != 0) {
      throw InputError(fmt::format("cannot read topology file '{}': not an hwloc XML file", s));
    }
    source = fmt::format("topology file '{}'", s);
  } else {
    if (Hwloc::get().topology_set_synthetic(topo.get(), s.c_str()) != 0) {
      throw InputError(fmt::format(
          "cannot read topology '{}': no such file, and not a synthetic description such as "
          "\"pack:2 numa:1 core:8 pu:1\"",
          s));
    }
    source = fmt::format("synthetic topology '{}'", s);
  }
  if (Hwloc::get().topology_load(topo.get()) != 0) {
    throw InputError(fmt::format("cannot read {}: {}", source, std::strerror(errno)));
  }
  return extract(topo.get(), source);
}

}  // namespace tnt::launcher
