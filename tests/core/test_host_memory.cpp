// The host memory a process may use under a cgroup's limit (v1 and v2, the limit on a parent
// binding too) and ulimit -v; a fake cgroup tree in a temporary folder stands for /sys/fs/cgroup.
#include <catch2/catch.hpp>

#include "core/host_memory_limits.hpp"
#include "tarantella/device.hpp"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

}  // namespace

TEST_CASE("host memory: a cgroup's limit, the least over the cgroup and its parents") {
  char tmpl[] = "/tmp/tnt_cgroup_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path root = tmpl;
  SECTION("v1: the memory controller's hierarchy; its 'no limit' is about 2^63") {
    write(root / "memory/memory.limit_in_bytes", "9223372036854771712\n");
    write(root / "memory/slurm/uid_0/memory.limit_in_bytes", "4294967296\n");  // the job: 4 GiB
    write(root / "memory/slurm/uid_0/job_7/memory.limit_in_bytes", "9223372036854771712\n");
    const std::string cgroup = "5:cpuacct,cpu:/slurm\n4:memory:/slurm/uid_0/job_7\n0::/\n";
    const tnt::detail::CgroupLimit l = tnt::detail::cgroup_memory_limit(cgroup, root.string());
    CHECK(l.bytes == 4294967296u);
    CHECK(l.file == (root / "memory/slurm/uid_0/memory.limit_in_bytes").string());
    // Combined controllers on one line count too.
    CHECK(tnt::detail::cgroup_memory_limit("4:memory,hugetlb:/slurm/uid_0\n", root.string()).bytes == 4294967296u);
  }
  SECTION("v2: memory.max, 'max' for none") {
    write(root / "memory.max", "max\n");
    write(root / "user.slice/memory.max", "max\n");
    write(root / "user.slice/job.scope/memory.max", "1073741824\n");
    const tnt::detail::CgroupLimit l = tnt::detail::cgroup_memory_limit("0::/user.slice/job.scope\n", root.string());
    CHECK(l.bytes == 1073741824u);
    CHECK(tnt::detail::cgroup_memory_limit("0::/user.slice\n", root.string()).bytes == 0);
  }
  SECTION("a container's own namespace shows '/': the mount's root is its cgroup") {
    write(root / "memory.max", "536870912\n");
    CHECK(tnt::detail::cgroup_memory_limit("0::/\n", root.string()).bytes == 536870912u);
  }
  SECTION("nothing readable: no limit") {
    CHECK(tnt::detail::cgroup_memory_limit("4:memory:/nowhere\n0::/nowhere\ngarbage\n", root.string()).bytes == 0);
    write(root / "memory.max", "lots\n");
    CHECK(tnt::detail::cgroup_memory_limit("0::/\n", root.string()).bytes == 0);
  }
  fs::remove_all(root);
}

TEST_CASE("host memory: ulimit -v gives what is left of the address space") {
  // In a child: the limit cannot be raised again once lowered.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const tnt::HostMemoryLimits before = tnt::host_memory_limits();
    rlimit as{};
    as.rlim_cur = as.rlim_max = 8ULL << 30;
    if (::setrlimit(RLIMIT_AS, &as) != 0) ::_exit(10);
    const tnt::HostMemoryLimits l = tnt::host_memory_limits();
    if (before.address_space_limit != 0 || before.physical_bytes == 0) ::_exit(11);
    if (l.address_space_limit != (8ULL << 30)) ::_exit(12);
    // Less than the limit by what this test program has mapped already (its libraries).
    if (l.address_space_left == 0 || l.address_space_left >= l.address_space_limit) ::_exit(13);
    if (tnt::host_memory_limit_text().find("address-space limit of 8192 MB (ulimit -v") == std::string::npos) ::_exit(14);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
