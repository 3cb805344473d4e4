#include "ps_plan.hpp"

#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

namespace tnt::launcher {

int parse_parameter_servers(const std::string& text) {
  const auto k = parse_unsigned(trim(text));
  if (!k || *k < 1 || *k > 1'000'000) {
    throw InputError(fmt::format("--parameter-servers {}: must be a positive integer (the number of server ranks; "
                                 "the other ranks train)",
                                 text));
  }
  return static_cast<int>(*k);
}

std::vector<std::string> parse_ps_hosts(const std::string& text) {
  std::vector<std::string> hosts;
  std::set<std::string> seen;
  for (std::string_view part : split(text, ',')) {
    const std::string name(trim(part));
    if (name.empty()) throw InputError(fmt::format("--ps-hosts '{}': an empty host name in the list", text));
    if (!seen.insert(name).second) {
      throw InputError(fmt::format("--ps-hosts '{}': host {} is named twice", text, name));
    }
    hosts.push_back(name);
  }
  return hosts;
}

std::optional<PsRoles> plan_ps_roles(const Options& options, const LaunchPlan& plan) {
  if (!options.parameter_servers) {
    if (!options.ps_hosts.empty()) {
      throw InputError(fmt::format("--ps-hosts {} without --parameter-servers K: say how many server ranks to place",
                                   fmt::join(options.ps_hosts, ",")));
    }
    return std::nullopt;
  }
  const int k = *options.parameter_servers;
  const int ranks = static_cast<int>(plan.ranks.size());
  if (k >= ranks) {
    throw InputError(fmt::format("--parameter-servers {} with {} rank{} leaves no worker: there must be fewer servers "
                                 "than ranks (give more ranks, or fewer servers)",
                                 k, ranks, ranks == 1 ? "" : "s"));
  }
  std::set<int> servers;
  if (options.ps_hosts.empty()) {
    for (int r = 0; r < k; ++r) servers.insert(r);
  } else {
    std::vector<std::string> plan_hosts;
    for (const auto& h : plan.hosts) plan_hosts.push_back(h.name);
    // Each named host's ranks, in rank order.
    std::vector<std::vector<int>> on_host;
    int available = 0;
    for (const auto& name : options.ps_hosts) {
      std::vector<int> list;
      for (const auto& r : plan.ranks) {
        if (r.host == name) list.push_back(r.rank);
      }
      if (std::find(plan_hosts.begin(), plan_hosts.end(), name) == plan_hosts.end()) {
        throw InputError(fmt::format("--ps-hosts: {} is not a host of this job (its hosts: {})", name,
                                     fmt::join(plan_hosts, ", ")));
      }
      available += static_cast<int>(list.size());
      on_host.push_back(std::move(list));
    }
    if (static_cast<int>(options.ps_hosts.size()) > k) {
      throw InputError(fmt::format("--ps-hosts names {} hosts but --parameter-servers {} places only {} server{}: "
                                   "name at most {} host{}",
                                   options.ps_hosts.size(), k, k, k == 1 ? "" : "s", k, k == 1 ? "" : "s"));
    }
    if (available < k) {
      throw InputError(fmt::format("--parameter-servers {}: the --ps-hosts {} hold only {} rank{}; name more hosts or "
                                   "give them more ranks",
                                   k, fmt::join(options.ps_hosts, ","), available, available == 1 ? "" : "s"));
    }
    // In turn from each named host, so that the servers spread over them.
    for (size_t round = 0; static_cast<int>(servers.size()) < k; ++round) {
      for (const auto& list : on_host) {
        if (round < list.size() && static_cast<int>(servers.size()) < k) servers.insert(list[round]);
      }
    }
  }
  PsRoles roles;
  roles.servers.assign(servers.begin(), servers.end());
  for (const auto& r : plan.ranks) {
    if (!servers.count(r.rank)) roles.workers.push_back(r.rank);
  }
  return roles;
}

namespace {

// "ranks 0, 1 (host a), 4 (host b)": the ranks grouped by host, in rank order.
std::string ranks_by_host(const std::vector<int>& ranks, const LaunchPlan& plan) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  std::string host;
  std::vector<int> group;
  auto flush = [&] {
    if (group.empty()) return;
    if (out.back() != ' ') out += ", ";
    out += fmt::format("{} (host {})", fmt::join(group, ", "), host);
    group.clear();
  };
  for (int r : ranks) {
    const std::string& h = plan.ranks.at(static_cast<size_t>(r)).host;
    if (h != host) flush();
    host = h;
    group.push_back(r);
  }
  flush();
  return out;
}

}  // namespace

std::string format_ps_roles(const PsRoles& roles, const LaunchPlan& plan) {
  const size_t k = roles.servers.size(), w = roles.workers.size();
  std::string out = fmt::format("roles: {} parameter server{}: {}; {} worker{}: {}\n", k, k == 1 ? "" : "s",
                                ranks_by_host(roles.servers, plan), w, w == 1 ? "" : "s",
                                ranks_by_host(roles.workers, plan));
  for (const auto& r : plan.ranks) {
    const bool server = std::binary_search(roles.servers.begin(), roles.servers.end(), r.rank);
    out += fmt::format("  rank {}  {}\n", r.rank, server ? "parameter server" : "worker");
  }
  return out;
}

std::string ps_role_words(const std::optional<PsRoles>& roles, int rank) {
  const bool server = roles && std::binary_search(roles->servers.begin(), roles->servers.end(), rank);
  return server ? "parameter server, " : "";
}

std::string ps_servers_value(const PsRoles& roles) { return fmt::format("{}", fmt::join(roles.servers, ",")); }

}  // namespace tnt::launcher
