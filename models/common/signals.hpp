// The training programs and the signals a batch system sends ahead of the end of a job.
#pragma once

#include <string>

namespace tnt_models {

// SIGUSR1 and SIGUSR2, which tarantella passes on to every rank (SLURM's --signal=B:USR1@120
// warning before the time limit, say), would end a program by default: the epoch under way
// lost, and under tarantella --max-restarts a restart spent. The programs keep training
// instead, and the master says once per signal what a later --resume continues from.
// Only a signal whose handling is the default is taken (one the user ignores stays so).
// Call after tnt::init (the master's rank is known).
void go_on_at_warning_signals(const std::string& program, bool writes_checkpoints);

}  // namespace tnt_models
