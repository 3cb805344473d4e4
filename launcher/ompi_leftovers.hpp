// What Open MPI's mpirun leaves on this host when it ends without cleaning up (killed, or
// aborted by a second signal: a terminal's Ctrl-C reaches it and the launcher's stop
// follows): its session directory <tmp>/ompi.<host>.<uid>/pid.<mpirun pid>/ and the shared
// memory of its ranks here, /dev/shm/vader_segment.<host>.<uid>.<job id>.<local rank>
// (4 MiB each). On a shared node they pile up. The launcher removes them once it has
// reaped its mpirun: by that mpirun's process ID and the job family in its contact.txt,
// nothing of another job.
#pragma once

#include <string>
#include <sys/types.h>

namespace tnt::launcher {

// Removes what mpirun `pid` left; returns how many entries went (0 after a clean end).
// tmp_dir and shm_dir: where to look (Open MPI's TMPDIR, default /tmp; /dev/shm); host:
// this host's name (a session directory of another host's name is not touched).
int remove_ompi_leftovers(pid_t pid, const std::string& tmp_dir, const std::string& shm_dir, const std::string& host);

// The same, in the places Open MPI uses on this host.
int remove_ompi_leftovers(pid_t pid);

}  // namespace tnt::launcher
