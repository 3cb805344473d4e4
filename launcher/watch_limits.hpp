// The limits the launcher watches a job's ranks with (rank_watch.hpp, lifeline.hpp): their
// defaults, shared by the help text (cli.cpp) and the watch.
#pragma once

#include "lifeline.hpp"

#include <chrono>
#include <string>

namespace tnt::launcher {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

// Long enough for Open MPI to start daemons over ssh on hundreds of nodes and for every step
// to exec its program; the start is the exec, not the program's own set-up.
inline constexpr double default_start_timeout_s = 120;
// Long enough for a master rank that writes files or evaluates alone after the others
// have ended; ranks that finish through MPI_Finalize end within moments of each other.
inline constexpr double default_exit_timeout_s = 300;
// After a rank failed, mpirun ends the job within about 2 s: one that has not after this
// long will not (its runtime broke: PMIx out of resources under a file-size limit waited on
// a lock for good), and the exit timeout is cut to it.
inline constexpr double failure_teardown_s = 20;

struct WatchLimits {
  Seconds start{default_start_timeout_s};  // 0: no limit
  Seconds exit{default_exit_timeout_s};    // 0: no limit
  Seconds heartbeat{default_heartbeat_timeout_s};  // lifelines (lifeline.hpp); 0: none
  bool any() const { return start.count() > 0 || exit.count() > 0; }
};

// "2", "0.5", "120": seconds as the messages write them.
std::string format_seconds(Seconds s);

}  // namespace tnt::launcher
