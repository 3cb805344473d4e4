// Roles of a parameter-server job (--parameter-servers K, --ps-hosts LIST): which ranks serve
// the variables and which train. Decided once from the launch plan, printed by --dry-run and
// passed to every rank as TNT_PS_SERVERS (the server ranks, "0,1"); the runtime reads it when
// a program trains with FitOptions::strategy = parameter_server (docs/parameter_server.md).
#pragma once

#include "plan.hpp"
#include "ps_flags.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct PsRoles {
  std::vector<int> servers;  // ascending rank numbers
  std::vector<int> workers;  // the other ranks, ascending
};

// nullopt without --parameter-servers. K servers: the first K ranks, or with --ps-hosts the
// ranks of the named hosts, taken in turn from each named host (its first ranks first), so
// that the servers spread over them. Throws InputError (exit 2, before anything starts) when
// K leaves no worker, a named host is not in the plan, the named hosts hold fewer than K
// ranks, or a named host would get no server (more hosts named than K).
std::optional<PsRoles> plan_ps_roles(const Options& options, const LaunchPlan& plan);

// "2 parameter servers: ranks 0, 1 (host a); 2 workers: ranks 2, 3 (host b)" and a line per
// rank with its role, for --dry-run.
std::string format_ps_roles(const PsRoles& roles, const LaunchPlan& plan);

// "parameter server, " for a server rank (a report names its role before its host), else "".
std::string ps_role_words(const std::optional<PsRoles>& roles, int rank);

// TNT_PS_SERVERS' value: "0,1".
std::string ps_servers_value(const PsRoles& roles);

}  // namespace tnt::launcher
