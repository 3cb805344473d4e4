// The per-rank step's view of its rank: Open MPI's variables read, and the variables the
// step sets for the program (rank_setup.hpp).
#include "rank_setup.hpp"

#include "env_names.hpp"
#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tnt::launcher {

namespace {

int read_int(const Environment& env, const char* name) {
  auto v = lookup(env, name);
  if (!v) {
    throw InputError(fmt::format("{} is not set: the per-rank step runs only under Open MPI's mpirun, "
                                 "started by tarantella", name));
  }
  auto n = parse_unsigned(*v);
  if (!n || *n > 100'000'000) throw InputError(fmt::format("{}='{}' is not a rank number", name, *v));
  return static_cast<int>(*n);
}

}  // namespace

RankIdentity rank_identity(const Environment& env) {
  RankIdentity id;
  id.rank = read_int(env, env::ompi_rank);
  id.size = read_int(env, env::ompi_size);
  id.local_rank = read_int(env, env::ompi_local_rank);
  id.local_size = read_int(env, env::ompi_local_size);
  if (id.rank >= id.size || id.local_rank >= id.local_size) {
    throw InputError(fmt::format("inconsistent Open MPI rank variables: rank {} of {}, local rank {} of {}", id.rank,
                                 id.size, id.local_rank, id.local_size));
  }
  return id;
}

std::vector<std::pair<std::string, std::string>> rank_variables(const RankIdentity& id, const std::string& device,
                                                                 const std::optional<RankBinding>& binding) {
  std::vector<std::pair<std::string, std::string>> v{
      {env::rank, std::to_string(id.rank)},
      {env::size, std::to_string(id.size)},
      {env::local_rank, std::to_string(id.local_rank)},
      {env::local_size, std::to_string(id.local_size)},
      {env::device, device},
      {env::launcher, "1"},
  };
  if (binding) {
    v.emplace_back(env::numa_node, std::to_string(binding->numa_node));
    v.emplace_back(env::num_threads, std::to_string(binding->cores));
  }
  return v;
}

bool is_ps_server(const std::string& ps_servers, int rank) {
  size_t at = 0;
  while (at <= ps_servers.size()) {
    const size_t comma = std::min(ps_servers.find(',', at), ps_servers.size());
    if (ps_servers.substr(at, comma - at) == std::to_string(rank)) return true;
    at = comma + 1;
  }
  return false;
}

}  // namespace tnt::launcher
