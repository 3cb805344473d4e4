// The limits on this process's host memory besides the machine's own (tarantella/device.hpp):
// a cgroup's (SLURM's --mem, containers) and the address-space limit (ulimit -v). A program
// that sizes a run by the physical memory alone is killed by the kernel's out-of-memory
// killer (SIGKILL, no word) or fails inside a library under such a limit.
#include "core/host_memory_limits.hpp"

#include "tarantella/device.hpp"

#include <fmt/format.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace tnt {

namespace detail {

namespace {

// A limit file's value: a byte count, or nothing ("max", v1's "no limit" of about 2^63).
std::optional<size_t> limit_in(const std::string& file) {
  std::ifstream in(file);
  std::string text;
  if (!in || !(in >> text) || text == "max") return std::nullopt;
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || v >= (1ULL << 62)) return std::nullopt;
  return static_cast<size_t>(v);
}

}  // namespace

CgroupLimit cgroup_memory_limit(std::string_view proc_self_cgroup, const std::string& root) {
  CgroupLimit best;
  auto consider = [&](const std::string& dir, const char* file_name) {
    const std::string file = dir + "/" + file_name;
    if (auto v = limit_in(file); v && (best.bytes == 0 || *v < best.bytes)) {
      best.bytes = *v;
      best.file = file;
    }
  };
  // The cgroup and each of its parents up to the hierarchy's root: a limit on any of them
  // binds. A path that is not there under the mount (a container's own cgroup namespace
  // shows "/") leaves the mount's root, which is then the container's cgroup.
  auto walk = [&](const std::string& mount, std::string path, const char* file_name) {
    while (true) {
      consider(mount + path, file_name);
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? std::string() : path.substr(0, slash);
    }
  };
  std::istringstream lines{std::string(proc_self_cgroup)};
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-ID:controller-list:path"
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      walk(root, path == "/" ? std::string() : path, "memory.max");  // v2, the unified hierarchy
      continue;
    }
    std::istringstream list(controllers);
    std::string c;
    while (std::getline(list, c, ',')) {
      if (c == "memory") walk(root + "/memory", path == "/" ? std::string() : path, "memory.limit_in_bytes");
    }
  }
  return best;
}

}  // namespace detail

HostMemoryLimits host_memory_limits() {
  HostMemoryLimits l;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) l.physical_bytes = static_cast<size_t>(pages) * static_cast<size_t>(page);
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  const detail::CgroupLimit cg = detail::cgroup_memory_limit(text.str(), "/sys/fs/cgroup");
  if (cg.bytes > 0 && (l.physical_bytes == 0 || cg.bytes < l.physical_bytes)) {
    l.cgroup_bytes = cg.bytes;
    l.cgroup_file = cg.file;
  }
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    l.address_space_limit = static_cast<size_t>(as.rlim_cur);
    size_t mapped = 0;  // VmSize, in kB
    std::ifstream status("/proc/self/status");
    std::string key;
    while (status >> key) {
      if (key == "VmSize:") {
        status >> mapped;
        mapped *= 1024;
        break;
      }
      std::getline(status, key);
    }
    l.address_space_left = l.address_space_limit > mapped ? l.address_space_limit - mapped : 0;
  }
  return l;
}

std::string host_memory_limit_text() {
  const HostMemoryLimits l = host_memory_limits();
  if (l.address_space_limit > 0) {
    return fmt::format(" under this process's address-space limit of {} MB (ulimit -v; {} MB of it left)",
                       l.address_space_limit >> 20, l.address_space_left >> 20);
  }
  // A cgroup's limit shows as the out-of-memory killer, not as a failed allocation: said as
  // a fact about the process, not as the cause.
  if (l.cgroup_bytes > 0) {
    return fmt::format(" (this process's cgroup limits its memory to {} MB, {}: a batch system's or a container's "
                       "limit, shared by every process in it)",
                       l.cgroup_bytes >> 20, l.cgroup_file);
  }
  return {};
}

}  // namespace tnt
