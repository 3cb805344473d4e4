// The runtime context: created once by tnt::init (MPI, configuration, device choice, the
// job's Communicator), destroyed by tnt::finalize. It is the only mutable global.
#pragma once

#include "tarantella/config.hpp"
#include "tarantella/device.hpp"

#include <functional>

namespace tnt {

class Communicator;

// Initialises MPI (thread level MULTIPLE) unless already initialised, reads the
// configuration, picks this rank's device and creates the job's Communicator.
void init(int* argc = nullptr, char*** argv = nullptr);
void finalize();
bool initialized();

int rank();
int size();
int local_rank();
int local_size();
constexpr int master_rank() { return 0; }
bool is_master_rank();

const Config& config();  // the resolved configuration (from the environment before init)
Device default_device();  // this rank's device (TNT_DEVICE or the default rule)
int num_threads();        // CPU compute threads this rank uses
// The cores this rank can use without taking them from the other ranks on its node: the
// CPUs of its affinity mask, each held by k local ranks' masks counted as 1/k (rounded
// down, at least 1). 16 for a rank pinned to 16 cores of its own; 4 for each of 4 unpinned
// ranks on a 16-core node. What a program sizes its own threads by (resnet50's data workers).
int rank_cores();
Communicator& communicator();

// Asks the fit under way to stop after its current step, on every rank: the request travels
// with the step's metrics allreduce, so all ranks stop after the same step even when it
// reached some of them only (a signal that arrives at slightly different times). The epoch
// is then unfinished: ModelCheckpoint saves it so, and FitOptions::initial_step resumes it.
// Model::stopped_on_request() says the fit ended so (the request is then cleared).
// Async-signal-safe: for a signal handler (a batch system's warning before its time limit).
// Not with strategy=parameter_server (its workers do not meet every step).
void request_stop_after_step() noexcept;
bool stop_after_step_requested() noexcept;  // on this rank, not yet honoured
void clear_stop_request() noexcept;

// The exit status of a rank whose input was refused (tnt::InputError), the same as that of a
// refused command line; any other error exits 1.
inline constexpr int kExitInputError = 2;

// Runs body between init and finalize, and turns an exception into a message on stderr
// ("error: ...") and a non-zero exit: kExitInputError for an InputError, 1 otherwise. When the job has several ranks and only some fail,
// MPI_Abort ends the others so that nothing hangs. Use from a program's main:
//   int main(int argc, char** argv) { return tnt::run_main(argc, argv, [&] { ... }); }
int run_main(int argc, char** argv, const std::function<void()>& body);

}  // namespace tnt
