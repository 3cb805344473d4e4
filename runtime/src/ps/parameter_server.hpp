// Parameter-server training (FitOptions::strategy = parameter_server): the server ranks hold
// the variables, sharded (ps/shard_plan.hpp), with their optimizer state, and apply each
// worker's gradients as they arrive; the workers train the usual Model::fit loop over their
// own communicator (the dataset split among them), pulling the variables before a step and
// pushing the gradients after it. docs/parameter_server.md has the protocol and its limits.
#pragma once

#include "train/ps_worker.hpp"

#include <string>
#include <vector>

namespace tnt::detail {

// The server ranks named by `text` (TNT_PS_SERVERS: "0,1"; empty: rank 0) in a job of
// `size` ranks, ascending. InputError naming TNT_PS_SERVERS when one is not a rank, is
// repeated, or no worker is left.
std::vector<int> parse_server_ranks(const std::string& text, int size);

}  // namespace tnt::detail
