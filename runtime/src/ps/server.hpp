// A server's side of parameter-server training (ps/parameter_server.hpp has the idea).
#pragma once

#include "ps/shards.hpp"

#include <optional>

namespace tnt {
class Communicator;
}

namespace tnt::ps {

// Serves shard `index` of `shards` to `workers` (ranks of `comm`) until every worker is done:
// pulls, pushes (applied with the model's optimizer as they arrive, or summed per step when
// staleness is 0), learning-rate changes, pauses and aborts. `servers` is the servers' own
// communicator (for their timeline).
void serve(Shards& shards, MPI_Comm comm, int index, const std::vector<int>& workers, std::optional<int64_t> staleness,
           Communicator& servers);

}  // namespace tnt::ps
