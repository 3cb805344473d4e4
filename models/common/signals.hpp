// The training programs and the signals a batch system sends ahead of the end of a job.
#pragma once

#include <tarantella/model.hpp>

#include <string>

namespace tnt_models {

// SIGUSR1 and SIGUSR2, which tarantella passes on to every rank (SLURM's --signal=B:USR1@120
// warning before the time limit, say), would end a program by default: the epoch under way
// lost, and under tarantella --max-restarts a restart spent. A run that writes checkpoints
// (stop_with_checkpoint) stops instead after the current step, on every rank
// (tnt::request_stop_after_step), and its checkpoint holds that step, inside its epoch:
// --resume (or --resume=auto) continues from there. A run without checkpoints trains on
// (stopping would save nothing). The master says once per signal which it is. Only a signal
// whose handling is the default is taken (one the user ignores stays so). Call after
// tnt::init (the master's rank is known).
void take_warning_signals(const std::string& program, bool stop_with_checkpoint);

// Call first in main: a warning that comes while the program starts (MPI_Init, reading its
// flags and data; tarantella holds one back until the ranks enter MPI_Init) is kept for
// take_warning_signals instead of ending the program by the signal's default action.
void hold_warning_signals();

// After fit: whether it stopped on such a signal; the master then says so, where the
// checkpoint is and how to continue. The program should end then, without its final
// evaluation or export: time is short.
bool stopped_on_warning_signal(const tnt::Model& model, const std::string& program, const std::string& checkpoint);

}  // namespace tnt_models
