#include "native_libs.hpp"

#include "error.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

namespace tnt::launcher {

namespace {

// The sonames of the ABIs the headers describe: hwloc 2.x is libhwloc.so.15, and libnuma
// has been libnuma.so.1 since version 2.
static_assert(HWLOC_API_VERSION >= 0x00020000 && HWLOC_API_VERSION < 0x00030000,
              "hwloc's major version changed: update the soname below");
constexpr const char* hwloc_soname = "libhwloc.so.15";
constexpr const char* numa_soname = "libnuma.so.1";

void* open_library(const char* soname, const char* package) {
  // Never unloaded: the tables below live as long as the process.
  void* handle = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    throw InputError(fmt::format("cannot load {} (Debian package {}): {}", soname, package, ::dlerror()));
  }
  return handle;
}

template <typename Fn>
void resolve(void* handle, const char* soname, const char* name, Fn& slot) {
  void* symbol = ::dlsym(handle, name);
  if (symbol == nullptr) throw InputError(fmt::format("{} has no symbol {}", soname, name));
  slot = reinterpret_cast<Fn>(symbol);
}

Hwloc load_hwloc() {
  void* h = open_library(hwloc_soname, "libhwloc15");
  Hwloc t{};
  auto r = [&](const char* name, auto& slot) { resolve(h, hwloc_soname, name, slot); };
  r("hwloc_get_api_version", t.get_api_version);
  r("hwloc_topology_init", t.topology_init);
  r("hwloc_topology_load", t.topology_load);
  r("hwloc_topology_destroy", t.topology_destroy);
  r("hwloc_topology_set_xml", t.topology_set_xml);
  r("hwloc_topology_set_synthetic", t.topology_set_synthetic);
  r("hwloc_topology_is_thissystem", t.topology_is_thissystem);
  r("hwloc_get_type_depth", t.get_type_depth);
  r("hwloc_get_nbobjs_by_depth", t.get_nbobjs_by_depth);
  r("hwloc_get_obj_by_depth", t.get_obj_by_depth);
  r("hwloc_bitmap_iszero", t.bitmap_iszero);
  r("hwloc_bitmap_isequal", t.bitmap_isequal);
  r("hwloc_bitmap_isset", t.bitmap_isset);
  // Same major version, as hwloc's documentation asks of programs that load it.
  if ((t.get_api_version() >> 16) != (HWLOC_API_VERSION >> 16)) {
    throw InputError(fmt::format("{} is hwloc API {:#x}, the launcher was built for {:#x}", hwloc_soname,
                                 t.get_api_version(), HWLOC_API_VERSION));
  }
  return t;
}

Numa load_numa() {
  void* h = open_library(numa_soname, "libnuma1");
  Numa t{};
  auto r = [&](const char* name, auto& slot) { resolve(h, numa_soname, name, slot); };
  r("numa_available", t.available);
  r("numa_allocate_cpumask", t.allocate_cpumask);
  r("numa_allocate_nodemask", t.allocate_nodemask);
  r("numa_bitmask_setbit", t.bitmask_setbit);
  r("numa_bitmask_free", t.bitmask_free);
  r("numa_sched_setaffinity", t.sched_setaffinity);
  r("numa_set_preferred", t.set_preferred);
  r("numa_set_membind", t.set_membind);
  r("get_mempolicy", t.get_mempolicy);
  return t;
}

}  // namespace

int Hwloc::nbobjs_by_type(hwloc_topology_t topology, hwloc_obj_type_t type) const {
  const int depth = get_type_depth(topology, type);
  if (depth == HWLOC_TYPE_DEPTH_UNKNOWN) return 0;
  if (depth == HWLOC_TYPE_DEPTH_MULTIPLE) return -1;
  return static_cast<int>(get_nbobjs_by_depth(topology, depth));
}

hwloc_obj_t Hwloc::obj_by_type(hwloc_topology_t topology, hwloc_obj_type_t type, unsigned index) const {
  const int depth = get_type_depth(topology, type);
  if (depth == HWLOC_TYPE_DEPTH_UNKNOWN || depth == HWLOC_TYPE_DEPTH_MULTIPLE) return nullptr;
  return get_obj_by_depth(topology, depth, index);
}

const Hwloc& Hwloc::get() {
  static const Hwloc table = load_hwloc();  // a failed load throws, and the next call retries
  return table;
}

const Numa& Numa::get() {
  static const Numa table = load_numa();
  return table;
}

}  // namespace tnt::launcher
