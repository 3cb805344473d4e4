// What this machine allows, checked against the plan before anything starts. mpirun forks
// every local rank itself and holds descriptors for each; when it runs out it prints "The
// system limit on number of pipes a process can open was reached" and then hangs, so a
// plan this machine cannot hold is refused up front with the limit and the number named.
// Only the launching machine is checked: a remote host's limits are its own daemon's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tnt::launcher {

struct SystemLimits {
  static constexpr std::uint64_t unlimited = UINT64_MAX;
  std::uint64_t open_files = unlimited, open_files_hard = unlimited;  // RLIMIT_NOFILE
  std::uint64_t processes = unlimited;                                // RLIMIT_NPROC
  bool privileged = false;  // euid 0: the kernel does not apply RLIMIT_NPROC
  std::uint64_t pid_max = 0;    // kernel.pid_max; 0 when unknown
  std::uint64_t tasks_now = 0;  // processes and threads on the machine now (/proc/loadavg)
};

SystemLimits current_limits();

// Open MPI 4.1's mpirun holds about 4 descriptors per local rank (the pseudo-terminal of
// the rank's stdout, pipes for its stderr and stdin/diagnostics, the rank's PMIx
// connection), and briefly more while it forks the next rank. Measured here: with
// `ulimit -n` 64, 128, 256 and 512, at most 9, 25, 53 and 123 MPI ranks started. 5 per
// rank plus 32 for mpirun itself stays below every one of those.
inline constexpr std::uint64_t mpirun_files_per_rank = 5;
inline constexpr std::uint64_t mpirun_files_base = 32;
// Each local rank is two processes (the per-rank step and the program), before the
// program's own threads, which count against the same limits.
inline constexpr std::uint64_t processes_per_rank = 2;

// The launcher itself holds one descriptor per rank of the whole job (its lifeline,
// lifeline.hpp) besides these few of its own.
inline constexpr std::uint64_t launcher_files_base = 64;

// Makes sure this process may open `files` descriptors, raising its soft RLIMIT_NOFILE up to
// the hard limit when needed (what mpirun inherits grows too, which only helps). False
// when even the hard limit is too low.
bool reserve_files(std::uint64_t files);

// One line per limit that `local_ranks` ranks on this machine would exceed; empty when
// the plan fits.
std::vector<std::string> limit_problems(std::uint64_t local_ranks, const SystemLimits& limits);

}  // namespace tnt::launcher
