// The parsing behind tnt::host_memory_limits (tarantella/device.hpp), apart for its tests.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace tnt::detail {

struct CgroupLimit {
  size_t bytes = 0;  // 0: no limit
  std::string file;  // the file that gave it
};
// The least memory limit over this process's cgroup and its parents, in cgroup v1's memory
// hierarchy (root + "/memory") or v2's unified one (root), as /proc/self/cgroup places it.
CgroupLimit cgroup_memory_limit(std::string_view proc_self_cgroup, const std::string& root);

}  // namespace tnt::detail
