// tnt_rank_info: an MPI program that shows what each rank was given -- rank, size, local
// rank, host, device, CPU affinity, memory policy, NUMA node and TNT_* environment -- one
// line per rank in rank order, printed by rank 0. It is what `scripts/demo` runs before a
// training program exists, and what the launcher's integration tests check the plan
// against (`--json`: one JSON object per line). It depends on MPI and libnuma only.
#include <mpi.h>
#include <numaif.h>
#include <sched.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

extern char** environ;

namespace {

std::string cpu_list(const cpu_set_t& set) {
  std::string out;
  int c = 0;
  while (c < CPU_SETSIZE) {
    if (!CPU_ISSET(c, &set)) {
      ++c;
      continue;
    }
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) ++e;
    if (!out.empty()) out += ',';
    out += e == c ? fmt::format("{}", c) : fmt::format("{}-{}", c, e);
    c = e + 1;
  }
  return out;
}

int cpu_count(const cpu_set_t& set) { return CPU_COUNT(&set); }

// "default", "preferred:0", "bind:0-1", "interleave:0-3", "local", as numactl --show says.
std::string memory_policy() {
  int mode = -1;
  unsigned long mask[16] = {};
  if (get_mempolicy(&mode, mask, sizeof(mask) * 8, nullptr, 0) != 0) return "unknown";
  const int flags = (1 << 15) | (1 << 14) | (1 << 13);
  mode &= ~flags;
  std::string nodes;
  for (unsigned n = 0; n < sizeof(mask) * 8; ++n) {
    if (((mask[n / 64] >> (n % 64)) & 1UL) == 0) continue;
    if (!nodes.empty()) nodes += ',';
    nodes += std::to_string(n);
  }
  switch (mode) {
    case MPOL_DEFAULT: return "default";
    case MPOL_PREFERRED: return nodes.empty() ? "local" : "preferred:" + nodes;
    case MPOL_BIND: return "bind:" + nodes;
    case MPOL_INTERLEAVE: return "interleave:" + nodes;
    case MPOL_LOCAL: return "local";
    default: return fmt::format("mode{}:{}", mode, nodes);
  }
}

nlohmann::json describe(int rank, int size, int local_rank, int local_size) {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);

  std::map<std::string, std::string> tnt;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "TNT_", 4) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) tnt[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  auto env_or = [&](const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : fallback);
  };
  nlohmann::json j;
  j["rank"] = rank;
  j["size"] = size;
  j["local_rank"] = local_rank;
  j["local_size"] = local_size;
  j["host"] = std::string(host, static_cast<size_t>(len));
  j["pid"] = static_cast<long>(getpid());
  j["device"] = env_or("TNT_DEVICE", "-");
  j["cpus"] = cpu_list(set);
  j["cpu_count"] = cpu_count(set);
  j["mempolicy"] = memory_policy();
  j["numa_node"] = env_or("TNT_NUMA_NODE", "-");
  j["env"] = tnt;
  return j;
}

void print_table(const std::vector<nlohmann::json>& ranks) {
  fmt::print("{:>4}  {:>4}  {:>5}  {:<16}  {:<8}  {:<12}  {:<14}  {:>4}  {}\n", "rank", "size", "local", "host",
             "device", "cpus", "memory", "numa", "TNT_* environment");
  for (const auto& j : ranks) {
    std::string env;
    for (const auto& [k, v] : j["env"].items()) env += fmt::format("{}{}={}", env.empty() ? "" : " ", k, v.get<std::string>());
    fmt::print("{:>4}  {:>4}  {:>5}  {:<16}  {:<8}  {:<12}  {:<14}  {:>4}  {}\n", j["rank"].get<int>(),
               j["size"].get<int>(), j["local_rank"].get<int>(), j["host"].get<std::string>(),
               j["device"].get<std::string>(), j["cpus"].get<std::string>(), j["mempolicy"].get<std::string>(),
               j["numa_node"].get<std::string>(), env);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "-h" || a == "--help") {
      std::puts("usage: tnt_rank_info [--json]\n"
                "Prints each rank's place, device, CPU affinity, memory policy and TNT_* environment,\n"
                "one line per rank in rank order (--json: one JSON object per line).");
      return 0;
    } else {
      std::fprintf(stderr, "tnt_rank_info: unknown argument '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }

  MPI_Init(&argc, &argv);
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  const std::string mine = describe(rank, size, local_rank, local_size).dump();
  int mine_len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Gather(&mine_len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[static_cast<size_t>(r)] = total;
    total += lens[static_cast<size_t>(r)];
  }
  std::string all(static_cast<size_t>(rank == 0 ? total : 0), '\0');
  MPI_Gatherv(mine.data(), mine_len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD);

  if (rank == 0) {
    std::vector<nlohmann::json> ranks;
    for (int r = 0; r < size; ++r) {
      ranks.push_back(nlohmann::json::parse(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                                                       static_cast<size_t>(lens[static_cast<size_t>(r)]))));
    }
    if (json) {
      for (const auto& j : ranks) std::puts(j.dump().c_str());
    } else {
      print_table(ranks);
    }
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
