// The command line of `tarantella [options] -- PROGRAM [ARGS...]`, parsed and checked for
// everything that can be judged without looking at the machine (the program's existence,
// mpirun and the topology are checked by main before anything starts; with --dry-run a
// missing program is only a warning).
#pragma once

#include "binding.hpp"
#include "environment.hpp"
#include "watch_limits.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt::launcher {

struct Options {
  std::optional<std::string> hostfile;
  std::optional<std::string> hosts;   // -H list, unparsed (hostfile.hpp parses it)
  std::optional<int> ranks_per_node;  // -n / --n-per-node / --devices-per-node / --npernode
  std::string ranks_flag = "-n";      // which of them the user wrote, for messages
  // mpirun's and horovodrun's -np N: N ranks in all, placed over the hosts by their slots
  // (plan.hpp). Not together with ranks per node.
  std::optional<int> total_ranks;
  std::string total_ranks_flag = "-np";  // -np or --np, as written
  bool oversubscribe = false;            // -np may exceed the hosts' slots
  bool no_gpu = false;
  std::optional<int> parameter_servers;  // --parameter-servers K (ps_plan.hpp)
  std::vector<std::string> ps_hosts;     // --ps-hosts, split
  std::optional<std::uint64_t> fusion_threshold_kb;
  bool fusion_threshold_auto = false;  // --fusion-threshold auto (docs/scaling.md)
  PinMode pin = PinMode::none;
  std::vector<std::pair<std::string, std::string>> exports;  // -x, in the order given
  std::optional<std::string> log_level;                      // DEBUG|INFO|WARNING|ERROR
  bool output_on_all_devices = false;
  bool log_on_all_devices = false;
  std::optional<double> start_timeout_s;  // --start-timeout (rank_watch.hpp resolves the default)
  std::optional<double> exit_timeout_s;   // --exit-timeout
  std::optional<double> heartbeat_timeout_s;  // --heartbeat-timeout (lifeline.hpp resolves the default)
  int max_restarts = 0;                   // --max-restarts
  bool requeue = false;                   // --requeue (requeue.hpp)
  std::optional<std::string> launch_agent;  // --launch-agent: Open MPI's plm_rsh_agent
  std::optional<std::string> mpirun;
  std::vector<std::string> mpi_args;  // --mpi-args, split into words
  bool dry_run = false;
  bool skip_host_lookup = false;  // --skip-host-lookup: names only the launch agent knows
  std::optional<std::string> topology;  // --topology, only with --dry-run
  bool help = false;
  bool version = false;
  std::vector<std::string> program;  // PROGRAM ARGS... (everything after "--")
  std::vector<std::string> warnings;  // printed before the launch (plan.hpp takes them)
};

// `args` excludes argv[0]. Throws InputError with a message meant for the user.
Options parse_command_line(const std::vector<std::string>& args);

std::string help_text();

// --start-timeout, else TNT_START_TIMEOUT, else the default; the same for the exit and
// heartbeat timeouts. Throws InputError naming the variable and its value.
WatchLimits watch_limits(const Options& options, const Environment& env);


}  // namespace tnt::launcher
