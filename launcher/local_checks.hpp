// What the launcher checks and adds for this machine before mpirun starts: Open MPI would
// otherwise fail on these with its own text (exit 1, which a restart repeats), or run
// slowly without a word.
#pragma once

#include "environment.hpp"
#include "mpirun_command.hpp"

#include <cstdint>

namespace tnt::launcher {

// The working directory exists and can be read (mpirun starts the ranks in it); TMPDIR,
// where set and there, is a directory this user can create files in (Open MPI's session
// files; a missing one Open MPI makes).
// Throws InputError.
void check_local_environment(const Environment& env);

// Adds to spec.mpi_args (before the user's, which may override; a setting in the
// environment or --mpi-args wins): mpi_yield_when_idle 1 when more than this machine's
// usable cores run ranks here; /bin/false as the remote shell of a job on this machine
// alone where neither ssh nor rsh is on PATH (Open MPI refuses to start without one).
void add_local_mca(CommandSpec& spec, const Environment& env, std::uint64_t local_ranks, bool remote,
                   bool launch_agent_given);

}  // namespace tnt::launcher
