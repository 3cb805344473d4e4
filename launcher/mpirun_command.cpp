#include "mpirun_command.hpp"

#include <algorithm>
#include <cctype>

#include "error.hpp"

#include <fmt/format.h>

namespace tnt::launcher {

std::vector<std::string> rank_step_arguments(const RankStepArgs& step) {
  std::vector<std::string> out{rank_step_flag};
  if (step.pin != PinMode::none) {
    out.push_back("--pin");
    out.push_back(pin_mode_name(step.pin));
  }
  if (step.device == DeviceKind::gpu) out.push_back("--gpu");
  out.push_back("--");
  out.insert(out.end(), step.program.begin(), step.program.end());
  return out;
}

RankStepArgs parse_rank_step_arguments(const std::vector<std::string>& args) {
  RankStepArgs step;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "--gpu") {
      step.device = DeviceKind::gpu;
    } else if (args[i] == "--pin" && i + 1 < args.size()) {
      const std::string& mode = args[++i];
      if (mode == pin_mode_name(PinMode::socket)) {
        step.pin = PinMode::socket;
      } else if (mode == pin_mode_name(PinMode::socket_strict)) {
        step.pin = PinMode::socket_strict;
      } else {
        throw InputError(fmt::format("per-rank step: unknown pin mode '{}'", mode));
      }
    } else {
      throw InputError(fmt::format("per-rank step: unexpected argument '{}'", args[i]));
    }
  }
  if (i == args.size() || i + 1 == args.size()) throw InputError("per-rank step: no program after '--'");
  step.program.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  return step;
}

std::vector<std::string> mpirun_command(const CommandSpec& spec) {
  std::vector<std::string> cmd{spec.mpirun};
  if (spec.as_root) cmd.push_back("--allow-run-as-root");

  int total = 0;
  std::string host_list, rank_hosts;
  for (const auto& h : spec.hosts) {
    total += h.ranks;
    if (!host_list.empty()) host_list += ',';
    host_list += fmt::format("{}:{}", h.name, h.ranks);
    for (int r = 0; r < h.ranks && rank_hosts.size() <= kMaxRankHostList; ++r) {
      rank_hosts += (rank_hosts.empty() ? "" : ",") + h.name;
    }
  }
  // Open MPI 4.1 maps its own node first: launched on c with --host a:1,b:1,c:1, rank 0 runs
  // on c, not on a as the plan says (and the master's files with it). On several hosts each
  // rank's host is therefore listed in rank order and mapped in sequence, which keeps the
  // order as given; only a list too long for one argument falls back to the slots.
  if (spec.hosts.size() > 1 && rank_hosts.size() <= kMaxRankHostList) {
    cmd.insert(cmd.end(), {"--host", rank_hosts, "-np", std::to_string(total), "--map-by", "seq", "--bind-to", "none"});
  } else {
    cmd.insert(cmd.end(),
               {"--host", host_list, "-np", std::to_string(total), "--map-by", "slot", "--bind-to", "none"});
  }
  // Open MPI 4.1 cuts a host name at its first dot (foo.example.org -> foo) unless told not
  // to, and then starts its daemon there by the short name: where only the full names
  // resolve, or ~/.ssh/config names them, the job would not start. IP addresses are kept.
  const bool full_names = std::any_of(spec.hosts.begin(), spec.hosts.end(), [](const auto& h) {
    return h.name.find('.') != std::string::npos &&
           std::any_of(h.name.begin(), h.name.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
  });
  if (full_names) cmd.insert(cmd.end(), {"--mca", "orte_keep_fqdn_hostnames", "1"});
  if (spec.launch_agent) cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", *spec.launch_agent});
  for (const auto& name : spec.pass_by_name) cmd.insert(cmd.end(), {"-x", name});
  for (const auto& [name, value] : spec.exports) cmd.insert(cmd.end(), {"-x", name + "=" + value});
  cmd.insert(cmd.end(), spec.mpi_args.begin(), spec.mpi_args.end());
  cmd.push_back(spec.self);
  auto step = rank_step_arguments(spec.step);
  cmd.insert(cmd.end(), step.begin(), step.end());
  return cmd;
}

}  // namespace tnt::launcher
