// The Open MPI command that starts the job. Every host is given with its rank count
// (`--host a:4,b:4`), so Open MPI neither oversubscribes by accident nor refuses more
// ranks than cores; `--map-by slot` fills a host before the next; `--bind-to none`
// because binding is the per-rank step's job. mpirun does not start PROGRAM itself but
// this launcher's per-rank step, which sets the rank up and then runs PROGRAM.
#pragma once

#include "exports.hpp"
#include "plan.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

// The hidden first argument that turns the launcher binary into the per-rank step.
inline constexpr const char* rank_step_flag = "__tnt_rank_step";

struct RankStepArgs {
  PinMode pin = PinMode::none;
  DeviceKind device = DeviceKind::cpu;
  std::vector<std::string> program;
};

// `__tnt_rank_step [--pin socket|socket-strict] [--gpu] -- PROGRAM ARGS...`
std::vector<std::string> rank_step_arguments(const RankStepArgs& step);
// The inverse, given the words after the flag. Throws InputError.
RankStepArgs parse_rank_step_arguments(const std::vector<std::string>& args);

struct CommandSpec {
  std::string mpirun;
  bool as_root = false;                    // adds --allow-run-as-root
  std::vector<HostPlan> hosts;
  std::vector<EnvVar> exports;             // -x NAME=VALUE
  std::vector<std::string> pass_by_name;   // -x NAME: value from mpirun's own environment
  std::optional<std::string> launch_agent;  // --mca plm_rsh_agent AGENT
  std::vector<std::string> mpi_args;       // --mpi-args, verbatim, after ours so they can override
  std::string self;                        // absolute path of this launcher binary
  RankStepArgs step;
};

// The longest --host list of one entry per rank (Linux takes arguments of up to 128 KiB);
// beyond it the ranks are mapped by slot, and Open MPI may put its own node first.
inline constexpr size_t kMaxRankHostList = 100000;

std::vector<std::string> mpirun_command(const CommandSpec& spec);

}  // namespace tnt::launcher
