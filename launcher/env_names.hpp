// The environment contract between the launcher and the runtime: every TNT_* name the
// launcher exports or sets per rank is spelled here and nowhere else, so a rename is one
// edit. The runtime declares the same names in runtime/include/tarantella/config.hpp.
#pragma once

#include <array>
#include <string_view>

namespace tnt::launcher::env {

// Set by the per-rank step from Open MPI's view of the job.
inline constexpr const char* rank = "TNT_RANK";
inline constexpr const char* size = "TNT_SIZE";
inline constexpr const char* local_rank = "TNT_LOCAL_RANK";
inline constexpr const char* local_size = "TNT_LOCAL_SIZE";
inline constexpr const char* device = "TNT_DEVICE";            // "cpu" or "cuda:K"
inline constexpr const char* numa_node = "TNT_NUMA_NODE";      // only when pinned
inline constexpr const char* num_threads = "TNT_NUM_THREADS";  // only when pinned

// Exported to every rank by the launcher (the last three only when asked for).
inline constexpr const char* launcher = "TNT_LAUNCHER";  // always "1"
inline constexpr const char* fusion_threshold = "TNT_FUSION_THRESHOLD";
inline constexpr const char* log_level = "TNT_LOG_LEVEL";
inline constexpr const char* output_on_all_devices = "TNT_OUTPUT_ON_ALL_DEVICES";
inline constexpr const char* log_on_all_devices = "TNT_LOG_ON_ALL_DEVICES";
// With --parameter-servers: the server ranks, "0,1" (ps_plan.hpp).
inline constexpr const char* ps_servers = "TNT_PS_SERVERS";

// Whether the launcher's stdout is a terminal ("1"/"0"): a rank's stdout under mpirun is a
// pseudo-terminal either way, so progress bars ask this instead of isatty().
inline constexpr const char* stdout_is_tty = "TNT_STDOUT_IS_TTY";

// Read by the launcher itself: how long it waits for every rank to start, and for the job
// to end once a rank has ended (seconds; --start-timeout and --exit-timeout override them).
inline constexpr const char* start_timeout = "TNT_START_TIMEOUT";
inline constexpr const char* exit_timeout = "TNT_EXIT_TIMEOUT";
// Seconds without a heartbeat after which a rank (or the launcher) counts as unreachable
// (lifeline.hpp; --heartbeat-timeout overrides it; 0: no lifelines).
inline constexpr const char* heartbeat_timeout = "TNT_HEARTBEAT_TIMEOUT";

// Set by the launcher for every rank of every attempt: which attempt this is (0 for the
// first, n for the n-th restart of --max-restarts), and an identifier of the launcher run
// that stays the same across its restarts, so that a program can tell its own earlier
// attempt's output from another run's (models/common: prepare_model_dir).
inline constexpr const char* restart = "TNT_RESTART";
inline constexpr const char* run_id = "TNT_RUN_ID";

// Private to the launcher: where a rank's step reports a failed program. Removed from
// the program's environment before it starts.
inline constexpr const char* report_address = "TNT_LAUNCHER_REPORT";

// Set by the per-rank step for the program: a pipe's write end (a file descriptor number)
// on which the runtime writes 'e' as it enters MPI_Init and 'j' once it has left it
// (runtime/src/core/context.cpp). A rank that ends without having entered, while others
// wait in MPI_Init for it, can then be named at once (rank_watch.hpp).
inline constexpr const char* join_fd = "TNT_JOIN_FD";

// Open MPI's per-process variables the per-rank step reads.
inline constexpr const char* ompi_rank = "OMPI_COMM_WORLD_RANK";
inline constexpr const char* ompi_size = "OMPI_COMM_WORLD_SIZE";
inline constexpr const char* ompi_local_rank = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr const char* ompi_local_size = "OMPI_COMM_WORLD_LOCAL_SIZE";

inline constexpr std::string_view prefix = "TNT_";

// Names a user may not set with -x: the per-rank step owns them, and a stale value from
// an enclosing job must not leak into this one.
inline constexpr std::array<std::string_view, 11> reserved = {
    rank, size, local_rank, local_size, device, launcher, report_address, stdout_is_tty, restart, run_id, join_fd};

inline bool is_reserved(std::string_view name) {
  for (auto r : reserved) {
    if (r == name) return true;
  }
  return false;
}

}  // namespace tnt::launcher::env
