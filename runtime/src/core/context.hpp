// The one runtime context object (created by tnt::init). Internal: programs use the free
// functions of tarantella/runtime.hpp.
#pragma once

#include "tarantella/config.hpp"
#include "tarantella/device.hpp"

#include <memory>

namespace tnt {

class Communicator;  // tarantella/comm.hpp (comm/): made by tnt::init, held here

namespace timeline {
class Events;
}

namespace detail {
struct LayerTypeRegistry;  // nn/serialize.cpp
}

struct RuntimeContext {
  Config config;
  int rank = 0;
  int size = 1;
  // The job's rank and size as the launcher numbers them, for the tags of output and log
  // lines: rank/size above follow the communicator in use (a parameter-server fit's workers
  // number themselves 0..W-1, and a server would share a worker's tag).
  int job_rank = 0;
  int job_size = 1;
  int local_rank = 0;
  int local_size = 1;
  Device device;
  int num_threads = 1;
  int rank_cores = 1;  // tnt::rank_cores
  bool we_initialized_mpi = false;
  int join_fd = -1;  // the launcher's pipe (TNT_JOIN_FD): 'f' is said on it at finalize
  // The job went on without lost ranks (a parameter-server job's dropped workers): its
  // communicator is that of the ranks left, and MPI_Finalize is not called (see finalize).
  bool ranks_lost = false;
  std::unique_ptr<Communicator> comm;
  std::shared_ptr<timeline::Events> timeline;  // while a timeline records (io/timeline.hpp's Recorder)
  bool timeline_started = false;               // one was, in this process (finalize's warning)
  std::shared_ptr<detail::LayerTypeRegistry> layer_types;  // tnt::register_layer_type's (layer_config.hpp)
};

RuntimeContext* context_or_null();

// Tells the launcher (its join pipe, when it started this rank) that the program stopped
// training on a stop request: tarantella --requeue requeues only a job that did.
void tell_launcher_stop_requested();
// A parameter-server worker enters (true) or leaves parameter-server training: the launcher
// survives its loss only in there.
void tell_launcher_ps_training(bool begins);

}  // namespace tnt
