#include "plan.hpp"

#include "error.hpp"
#include "slurm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace tnt::launcher {

HostSelection select_hosts(const Options& options, const Environment& env) {
  HostSelection s;
  if (options.hostfile) {
    HostList list = read_hostfile(*options.hostfile);
    s.source = fmt::format("hostfile '{}'", *options.hostfile);
    s.hosts = std::move(list.hosts);
    s.warnings = std::move(list.warnings);
  } else if (options.hosts) {
    HostList list = parse_host_list(*options.hosts);
    s.source = "-H";
    s.hosts = std::move(list.hosts);
    s.warnings = std::move(list.warnings);
  } else if (auto slurm = slurm_allocation(env)) {
    s.source = fmt::format("SLURM job {}", slurm->job_id);
    for (const auto& node : slurm->nodes) s.hosts.push_back({node, std::nullopt, "SLURM_JOB_NODELIST", std::nullopt});
    s.slurm_tasks = std::move(slurm->tasks_per_node);
  } else {
    s.source = "this machine";
    s.hosts.push_back({"localhost", std::nullopt, "default", std::nullopt});
    s.this_machine = true;
  }
  return s;
}

std::optional<std::vector<int>> place_by_slot(int total, const std::vector<int>& slots, bool oversubscribe) {
  std::vector<int> ranks(slots.size(), 0);
  long long left = total;
  for (size_t i = 0; i < slots.size() && left > 0; ++i) {
    ranks[i] = static_cast<int>(std::min<long long>(slots[i], left));
    left -= ranks[i];
  }
  if (left == 0) return ranks;
  if (!oversubscribe || slots.empty()) return std::nullopt;
  const long long hosts = static_cast<long long>(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    ranks[i] += static_cast<int>(left / hosts + (static_cast<long long>(i) < left % hosts ? 1 : 0));
  }
  return ranks;
}

namespace {

// "a 4, b 2" for the first few hosts of a long list.
std::string list_hosts(const std::vector<std::string>& items) {
  constexpr size_t shown = 8;
  std::string out;
  for (size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > shown) out += fmt::format(" and {} more", items.size() - shown);
  return out;
}

}  // namespace

bool is_local_host(const std::string& name, const std::string& this_host) {
  if (name == "localhost" || name == "127.0.0.1" || name == this_host) return true;
  // "node1" and "node1.cluster" name the same machine.
  auto short_name = [](const std::string& n) { return n.substr(0, n.find('.')); };
  return !this_host.empty() && short_name(name) == short_name(this_host);
}

std::string device_name(DeviceKind kind, int local_rank, int gpus) {
  if (kind == DeviceKind::gpu && gpus > 0) return fmt::format("cuda:{}", local_rank % gpus);
  return "cpu";
}

LaunchPlan make_plan(const Options& options, const HostSelection& hosts, int gpus,
                     const NodeTopology* topology, const std::string& this_host) {
  LaunchPlan plan;
  plan.host_source = hosts.source;
  plan.gpus = gpus;
  plan.pin = options.pin;
  plan.warnings = options.warnings;
  plan.warnings.insert(plan.warnings.end(), hosts.warnings.begin(), hosts.warnings.end());

  // A host's slots: its ranks unless -n or -np says otherwise.
  std::vector<int> slots;
  for (size_t i = 0; i < hosts.hosts.size(); ++i) {
    const HostEntry& h = hosts.hosts[i];
    if (h.slots) {
      slots.push_back(*h.slots);
    } else if (!hosts.slurm_tasks.empty()) {
      slots.push_back(hosts.slurm_tasks[i]);
    } else {
      slots.push_back(gpus > 0 && !options.no_gpu ? gpus : 1);
    }
  }

  std::vector<int> counts = slots;
  if (options.total_ranks) {
    const int total = *options.total_ranks;
    const std::string& flag = options.total_ranks_flag;
    if (total <= 0) {
      throw InputError(fmt::format("{} {}: the number of ranks in all must be a positive integer", flag, total));
    }
    if (hosts.this_machine) {
      counts.assign(1, total);  // as mpirun -np N without hosts: all N here
    } else if (auto placed = place_by_slot(total, slots, options.oversubscribe)) {
      counts = std::move(*placed);
    } else {
      long long all = 0;
      std::vector<std::string> each;
      for (size_t i = 0; i < slots.size(); ++i) {
        all += slots[i];
        each.push_back(fmt::format("{} {}", hosts.hosts[i].name, slots[i]));
      }
      throw InputError(fmt::format(
          "{} {}: more ranks than the {} slot{} of the hosts from {} ({}); give at most {}, or --oversubscribe to "
          "spread the other {} over the hosts as well",
          flag, total, all, all == 1 ? "" : "s", hosts.source, list_hosts(each), all, total - all));
    }
  } else if (options.ranks_per_node) {
    counts.assign(hosts.hosts.size(), *options.ranks_per_node);
    const bool overridden = std::any_of(hosts.hosts.begin(), hosts.hosts.end(), [&](const HostEntry& h) {
      return h.slots && *h.slots != *options.ranks_per_node;
    });
    if (overridden) {
      plan.warnings.push_back(fmt::format("{} {} overrides the slots given for the hosts", options.ranks_flag,
                                          *options.ranks_per_node));
    }
  }

  for (size_t i = 0; i < hosts.hosts.size(); ++i) {  // Open MPI's cap holds for -n and --oversubscribe too
    const HostEntry& h = hosts.hosts[i];
    if (h.max_slots && counts[i] > *h.max_slots) {
      throw InputError(fmt::format("host '{}' ({}, {}) would get {} ranks, more than its max_slots={}", h.name,
                                   hosts.source, h.origin, counts[i], *h.max_slots));
    }
  }

  std::vector<std::string> idle;  // hosts that -np leaves without a rank
  for (size_t i = 0; i < hosts.hosts.size(); ++i) {
    const std::string& name = hosts.hosts[i].name;
    if (counts[i] == 0) {
      idle.push_back(name);
    } else {
      plan.hosts.push_back({name, counts[i], is_local_host(name, this_host)});
    }
  }
  if (!idle.empty()) {
    plan.warnings.push_back(fmt::format("{} {} fills the slots of {} of the {} hosts from {}; no rank on {}",
                                        options.total_ranks_flag, *options.total_ranks, plan.hosts.size(),
                                        hosts.hosts.size(), hosts.source, list_hosts(idle)));
  }

  int max_per_host = 0;
  for (const auto& h : plan.hosts) max_per_host = std::max(max_per_host, h.ranks);
  if (!options.no_gpu && gpus > 0) {
    if (max_per_host <= gpus) {
      plan.device = DeviceKind::gpu;
    } else {
      // As the original Tarantella: more ranks than GPUs means CPU ranks, not shared GPUs.
      plan.warnings.push_back(fmt::format(
          "{} ranks per node but this node has {} GPU{}: running CPU ranks (use -n {} for one rank per GPU)",
          max_per_host, gpus, gpus == 1 ? "" : "s", gpus));
    }
  }

  std::map<int, NodeBindings> bindings;  // by ranks per node, as hosts may differ
  if (options.pin != PinMode::none) {
    if (topology == nullptr) throw InputError("pinning needs the node topology");
    plan.topology_source = topology->source;
    for (const auto& h : plan.hosts) {
      if (bindings.count(h.ranks)) continue;
      auto b = plan_node_bindings(*topology, h.ranks);
      for (auto& w : b.warnings) {
        if (std::find(plan.warnings.begin(), plan.warnings.end(), w) == plan.warnings.end()) {
          plan.warnings.push_back(w);
        }
      }
      bindings.emplace(h.ranks, std::move(b));
    }
  }

  int rank = 0;
  for (const auto& h : plan.hosts) {
    for (int l = 0; l < h.ranks; ++l) {
      RankPlacement p;
      p.rank = rank++;
      p.host = h.name;
      p.local_rank = l;
      p.local_size = h.ranks;
      p.device = device_name(plan.device, l, gpus);
      if (options.pin != PinMode::none) p.binding = bindings.at(h.ranks).ranks[static_cast<size_t>(l)];
      plan.ranks.push_back(std::move(p));
    }
  }
  return plan;
}

std::string format_plan(const LaunchPlan& plan) {
  const int size = static_cast<int>(plan.ranks.size());
  std::string out;
  out += fmt::format("{} rank{} on {} host{} (hosts from {}); ", size, size == 1 ? "" : "s", plan.hosts.size(),
                     plan.hosts.size() == 1 ? "" : "s", plan.host_source);
  out += plan.device == DeviceKind::gpu ? fmt::format("GPU ranks ({} GPUs on this node)", plan.gpus) : "CPU ranks";
  switch (plan.pin) {
    case PinMode::none: out += "; not pinned\n"; break;
    case PinMode::socket: out += "; pinned to NUMA nodes, memory preferred there\n"; break;
    case PinMode::socket_strict: out += "; pinned to NUMA nodes, memory bound there\n"; break;
  }

  struct Row {
    std::string rank, host, local, device, numa, cpus;
  };
  std::vector<Row> rows{{"rank", "host", "local_rank", "device", "numa_node", "cores"}};
  for (const auto& r : plan.ranks) {
    Row row{std::to_string(r.rank), r.host, std::to_string(r.local_rank), r.device, "-", "all"};
    if (r.binding) {
      row.numa = std::to_string(r.binding->numa_node);
      row.cpus = fmt::format("{} (cpus {})", r.binding->cores, format_cpu_list(r.binding->cpus));
    }
    rows.push_back(std::move(row));
  }
  size_t w[5] = {};
  for (const auto& r : rows) {
    w[0] = std::max(w[0], r.rank.size());
    w[1] = std::max(w[1], r.host.size());
    w[2] = std::max(w[2], r.local.size());
    w[3] = std::max(w[3], r.device.size());
    w[4] = std::max(w[4], r.numa.size());
  }
  for (const auto& r : rows) {
    out += fmt::format("  {:>{}}  {:<{}}  {:>{}}  {:<{}}  {:>{}}  {}\n", r.rank, w[0], r.host, w[1], r.local, w[2],
                       r.device, w[3], r.numa, w[4], r.cpus);
  }
  if (plan.pin != PinMode::none) {
    const bool remote = std::any_of(plan.hosts.begin(), plan.hosts.end(), [](auto& h) { return !h.local; });
    out += fmt::format("  NUMA nodes and cores planned from {}{}\n", plan.topology_source,
                       remote ? "; each host applies the same rule to its own topology" : "");
  }
  return out;
}

}  // namespace tnt::launcher
