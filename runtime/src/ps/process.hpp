// A rank's process as the other ranks know it, so that the first server of parameter-server
// training can end a dropped worker on its own host: a stopped one would hold the job's end
// (mpirun waits for every process) and act as a worker again if resumed.
#pragma once

#include <cstdint>

namespace tnt::ps {

// start: the process's start time in clock ticks since boot (/proc/PID/stat), which tells
// it from a later process with the same id; -1 where unknown (then it is never signalled).
struct Process {
  int64_t pid = 0, start = -1, host = 0;  // host: a hash of the host name
};

Process this_process();

// SIGKILLs dropped worker `rank`'s process `p` if it runs on the host of `here` and is
// still the process it was (not gone, not a zombie, its id not reused), and says so.
void end_dropped_worker(int rank, const Process& p, const Process& here);

}  // namespace tnt::ps
