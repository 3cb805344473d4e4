// The processes a job leaves behind, as the launcher and each rank's step see them. Both
// are subreapers (PR_SET_CHILD_SUBREAPER): whatever their descendants abandon is re-parented
// to them rather than to init, so "my children" is exactly what the job started here and
// is still running, and that is all they ever signal: by process ID, never by name.
#pragma once

#include <chrono>
#include <optional>
#include <sys/types.h>
#include <vector>

namespace tnt::launcher {

// What /proc/PID/stat says of a process: its state, parent and start time (which tells a
// process from a later one with the same PID).
struct ProcStat {
  char state = 0;
  long ppid = 0;
  unsigned long long start_time = 0;
};
std::optional<ProcStat> read_stat(pid_t pid);

// This process's children. /proc/self/task/TID/children lists them where the kernel
// offers it (CONFIG_PROC_CHILDREN); otherwise every process's parent is read from /proc.
std::vector<pid_t> own_children();

// Ends every child of this process and, when `group` > 0, that process group: SIGTERM
// (with SIGCONT, so that a stopped process can act on it), SIGKILL after `grace`, again
// each round (killing a process re-parents its children here, and those must go too).
// Processes that even SIGKILL does not end within another `grace` (stuck in the kernel)
// are left to the kernel rather than holding up the caller. Reaps what ends; the caller
// must have nothing of its own left to wait for.
void end_children(pid_t group, std::chrono::milliseconds grace);

}  // namespace tnt::launcher
