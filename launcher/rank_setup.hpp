// The per-rank step: what mpirun actually starts on every rank (the launcher binary with
// the hidden first argument __tnt_rank_step). It reads the rank's place from Open MPI's
// variables, picks the device, binds CPUs and memory when asked, sets the TNT_* contract
// variables, and runs PROGRAM.
//
// PROGRAM runs as a child, not in place of the step, because the step has two more jobs
// that need it alive: tell the launcher when the program has started, stops, continues and
// ends, with its exact status (report.hpp), and make sure the program never outlives the
// job, nor anything the program started.
//
// For that the step is two processes. The front is what mpirun started: Open MPI signals
// the front's process group when it ends the job (SIGTERM, then SIGKILL 1 s later), and
// the front passes every signal on to the back and exits exactly as the back did. The back
// runs in a process group of its own, out of reach of that SIGKILL: it runs the program
// (the rank is set up before the split), reports, keeps the lifeline, and when the job ends (a signal, the
// front or mpirun gone, the launcher gone) gives the program SIGTERM and, 2 s later, its
// whole process group SIGKILL. The program leads its own process group and the back is a
// subreaper (abandoned processes are re-parented to it), so when the program ends,
// whatever it started and left running is ended too: a rank leaves nothing behind, even a
// child that ignores SIGTERM. The back then exits exactly as the program did (same code,
// or same signal), and so does the front, so mpirun sees no difference.
#pragma once

#include "binding.hpp"
#include "environment.hpp"
#include "mpirun_command.hpp"

#include <optional>
#include <string>

namespace tnt::launcher {

struct RankIdentity {
  int rank = 0, size = 0, local_rank = 0, local_size = 0;
};

// From OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}. Throws InputError when they are
// missing (the step was not started by Open MPI's mpirun).
RankIdentity rank_identity(const Environment& env);

// Whether TNT_PS_SERVERS' value ("0,3") names `rank`: a parameter server computes on the
// CPU and takes no GPU. Pure, for tests.
bool is_ps_server(const std::string& ps_servers, int rank);

// The variables this rank's program gets on top of what mpirun passed on, TNT_DEVICE
// included. Pure, for tests.
std::vector<std::pair<std::string, std::string>> rank_variables(const RankIdentity& id, const std::string& device,
                                                                 const std::optional<RankBinding>& binding);

// Runs the whole step from the words after __tnt_rank_step. Returns only when the rank
// could not be set up (the exit status to use, after printing why and reporting it to the
// launcher); once the program has started, the step exits the way the program did.
int rank_step_main(const std::vector<std::string>& args);

}  // namespace tnt::launcher
