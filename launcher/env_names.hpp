// The environment contract between the launcher and the runtime. Every TNT_* name is
// spelled once, in runtime/include/tarantella/config_table.hpp (the runtime's knobs and the
// variables the launcher sets or reads); the launcher takes them from there.
#pragma once

#include "tarantella/config_table.hpp"

#include <array>
#include <string_view>

namespace tnt::launcher::env {

// Set by the per-rank step from Open MPI's view of the job (device and num_threads are
// knobs the step sets: "cpu" or "cuda:K"; numa_node and num_threads only when pinned),
// exported to every rank (launcher, always "1"; the knobs only when asked for), read by the
// launcher itself (the timeouts), per attempt (restart, run_id), or private (the report
// address, the join pipe): config_table.hpp says what each is.
using tnt::env::core_limit;
using tnt::env::device;
using tnt::env::exit_timeout;
using tnt::env::heartbeat_timeout;
using tnt::env::join_fd;
using tnt::env::launcher;
using tnt::env::local_rank;
using tnt::env::local_size;
using tnt::env::log_level;
using tnt::env::log_on_all_devices;
using tnt::env::num_threads;
using tnt::env::numa_node;
using tnt::env::output_on_all_devices;
using tnt::env::profile_scaling;
using tnt::env::ps_servers;
using tnt::env::ps_worker_timeout_s;
using tnt::env::rank;
using tnt::env::report_address;
using tnt::env::restart;
using tnt::env::run_id;
using tnt::env::scontrol;
using tnt::env::size;
using tnt::env::start_timeout;
using tnt::env::stdout_is_tty;
using tnt::env::timeline;
inline constexpr const char* fusion_threshold = tnt::env::fusion_threshold_kb;

// Open MPI's per-process variables the per-rank step reads.
inline constexpr const char* ompi_rank = "OMPI_COMM_WORLD_RANK";
inline constexpr const char* ompi_size = "OMPI_COMM_WORLD_SIZE";
inline constexpr const char* ompi_local_rank = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr const char* ompi_local_size = "OMPI_COMM_WORLD_LOCAL_SIZE";

inline constexpr std::string_view prefix = "TNT_";

// Names a user may not set with -x: the per-rank step owns them, and a stale value from
// an enclosing job must not leak into this one.
inline constexpr std::array<std::string_view, 13> reserved = {
    rank,    size,   local_rank, local_size, device,    launcher, report_address, stdout_is_tty,
    restart, run_id, join_fd,    core_limit, numa_node};

inline bool is_reserved(std::string_view name) {
  for (auto r : reserved) {
    if (r == name) return true;
  }
  return false;
}

}  // namespace tnt::launcher::env

namespace tnt::launcher {

// The largest fusion threshold taken (--fusion-threshold, tarantella predict; the runtime's
// TNT_FUSION_THRESHOLD check in core/config.cpp has the same bound): 16 GiB, more than any
// model's gradients. A value above it is almost always bytes (Horovod's unit) meant as KB.
inline constexpr long long kMaxFusionThresholdKb = 16LL * 1024 * 1024;

}  // namespace tnt::launcher
