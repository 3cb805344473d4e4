// Host names, looked up before anything starts. A name that does not resolve would
// otherwise surface as ssh's "Could not resolve hostname" among Open MPI's account of
// daemons it could not start; the launcher names the host and where it was listed instead.
// Each lookup is bounded in time (a resolver that does not answer must not hold the launch
// up), and the lookup itself is a parameter, so that the rule is tested without a network.
#pragma once

#include "plan.hpp"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct NameLookup {
  enum class Result {
    found,
    unknown,  // the resolver says no such name (or a name without an address)
    failed,   // no answer: the resolver is unreachable or failed, or the time ran out
  };
  Result result = Result::found;
  std::string detail;  // the resolver's reason, for messages
};

using NameResolver = std::function<NameLookup(const std::string& name)>;

// getaddrinfo (IPv4 and IPv6 addresses of a TCP service).
NameLookup resolve_name(const std::string& name);

inline constexpr std::chrono::milliseconds host_lookup_limit{5000};

// Looks up every host of `hosts` that the plan does not place on this machine (`plan` was
// made from `hosts`: its hosts are theirs, in order), a few at a time, for at most `limit`
// in all. Throws InputError naming each unknown host and where it was listed (the hostfile
// line, the -H item, the SLURM node list). Returns warnings for names that could not be
// looked up (the job may still reach them; mpirun then says so).
std::vector<std::string> check_host_names(const HostSelection& hosts, const LaunchPlan& plan,
                                          const NameResolver& resolve,
                                          std::chrono::milliseconds limit = host_lookup_limit);

}  // namespace tnt::launcher
