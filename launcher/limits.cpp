#include "limits.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sys/resource.h>
#include <unistd.h>

namespace tnt::launcher {

namespace {

std::uint64_t as_count(rlim_t value) {
  return value == RLIM_INFINITY ? SystemLimits::unlimited : static_cast<std::uint64_t>(value);
}

std::string limit_text(std::uint64_t value) {
  return value == SystemLimits::unlimited ? "unlimited" : std::to_string(value);
}

}  // namespace

SystemLimits current_limits() {
  SystemLimits l;
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0) {
    l.open_files = as_count(r.rlim_cur);
    l.open_files_hard = as_count(r.rlim_max);
  }
  if (::getrlimit(RLIMIT_NPROC, &r) == 0) l.processes = as_count(r.rlim_cur);
  l.privileged = ::geteuid() == 0;
  std::ifstream("/proc/sys/kernel/pid_max") >> l.pid_max;
  // "0.50 0.40 0.30 2/345 6789": the fourth field is running/total scheduling entities.
  std::ifstream loadavg("/proc/loadavg");
  std::string skip, entities;
  if (loadavg >> skip >> skip >> skip >> entities) {
    const auto slash = entities.find('/');
    if (slash != std::string::npos) l.tasks_now = std::strtoull(entities.c_str() + slash + 1, nullptr, 10);
  }
  return l;
}

bool reserve_files(std::uint64_t files) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return true;  // cannot tell: go ahead
  if (r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= files) return true;
  if (r.rlim_max != RLIM_INFINITY && r.rlim_max < files) return false;
  // Only as far as needed: some programs close every descriptor up to the limit when they
  // start a child, and pay for a huge one at every fork.
  r.rlim_cur = static_cast<rlim_t>(files);
  return ::setrlimit(RLIMIT_NOFILE, &r) == 0;
}

std::vector<std::string> limit_problems(std::uint64_t n, const SystemLimits& l) {
  std::vector<std::string> out;
  if (n == 0) return out;
  const std::string ranks = fmt::format("{} rank{} on this machine", n, n == 1 ? "" : "s");

  const std::uint64_t files = mpirun_files_per_rank * n + mpirun_files_base;
  if (files > l.open_files) {
    const std::string remedy =
        l.open_files_hard >= files
            ? fmt::format(" (hard limit {}): raise it with ulimit -n {}", limit_text(l.open_files_hard), files)
            : fmt::format(", and its hard limit only {}: ask for a higher hard limit", l.open_files_hard);
    out.push_back(fmt::format("{} need about {} open files in mpirun ({} per local rank + {}), but the open-file "
                              "limit (RLIMIT_NOFILE, ulimit -n) is {}{}, or start fewer ranks per node",
                              ranks, files, mpirun_files_per_rank, mpirun_files_base, l.open_files, remedy));
  }
  const std::uint64_t processes = processes_per_rank * n;
  if (!l.privileged && processes > l.processes) {
    out.push_back(fmt::format(
        "{} need at least {} processes (the per-rank step and the program for each, more with their "
        "threads), but the process limit of this user (RLIMIT_NPROC, ulimit -u) is {}: raise it or start "
        "fewer ranks per node",
        ranks, processes, l.processes));
  }
  if (l.pid_max > 0) {
    const std::uint64_t free_ids = l.pid_max > l.tasks_now ? l.pid_max - l.tasks_now : 0;
    if (processes > free_ids) {
      out.push_back(fmt::format(
          "{} need at least {} processes, but kernel.pid_max is {} and {} are in use, so at most {} more "
          "can exist: start fewer ranks per node",
          ranks, processes, l.pid_max, l.tasks_now, free_ids));
    }
  }
  return out;
}

}  // namespace tnt::launcher
