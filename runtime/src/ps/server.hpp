// A server's side of parameter-server training (ps/parameter_server.hpp has the idea).
#pragma once

#include "ps/process.hpp"
#include "ps/shards.hpp"

#include <optional>

namespace tnt {
class Communicator;
}

namespace tnt::ps {


// Serves shard `index` of `shards` to `workers` (ranks of `comm`) until every worker is done
// or lost: pulls, pushes (applied with the model's optimizer as they arrive, or summed per
// step when staleness is 0), learning-rate changes, pauses and aborts. The first server
// (index 0) also keeps the epoch's sample ledger and decides which workers are lost (silent
// for TNT_PS_WORKER_TIMEOUT); it tells the other servers (`server_ranks`, ranks of `comm`).
// `servers` is the servers' own communicator (for their timeline); `processes`: every
// rank's, by rank of `comm`. `steps_before`: the model's steps when the fit began (a resumed
// run's), from which the timeline numbers this fit's updates, as the workers number their
// steps. Returns the lost workers' ranks, the same on every server and worker.
std::vector<int> serve(Shards& shards, MPI_Comm comm, int index, const std::vector<int>& workers,
                       const std::vector<int>& server_ranks, std::optional<int64_t> staleness, Communicator& servers,
                       const std::vector<Process>& processes, int64_t steps_before = 0);

}  // namespace tnt::ps
