// Parameter-server training (FitOptions::strategy = parameter_server): the server ranks hold
// the variables, sharded (ps/shard_plan.hpp), with their optimizer state, and apply each
// worker's gradients as they arrive; the workers train the usual Model::fit loop over their
// own communicator (the dataset split among them), pulling the variables before a step and
// pushing the gradients after it. docs/parameter_server.md has the protocol and its limits.
#pragma once

#include "tarantella/model.hpp"

#include <memory>
#include <string>
#include <vector>

namespace tnt::detail {

// Collective over every rank (each calls fit with the same options): servers serve until
// every worker is done, workers train; then every rank, servers included, ends with the same
// variables, optimizer state, buffers (the first worker's), global step and History.
History fit_parameter_server(Model& model, const Dataset& data, FitOptions options);

// The server ranks named by `text` (TNT_PS_SERVERS: "0,1"; empty: rank 0) in a job of
// `size` ranks, ascending. InputError naming TNT_PS_SERVERS when one is not a rank, is
// repeated, or no worker is left.
std::vector<int> parse_server_ranks(const std::string& text, int size);

class PsWorker {
 public:
  virtual ~PsWorker() = default;
  virtual void pull() = 0;       // before a step: the servers' current variables into the model
  virtual void push() = 0;       // after backward: the gradients to the servers
  // Leaving the epoch's steps (its data done, max_steps, a stop request): until its next
  // push the servers hold no other worker's pull back for this one, which may now wait for
  // them in the epoch's collectives.
  virtual void pause() = 0;
  // Variables and optimizer state, for validation and checkpoints; the epoch's staleness
  // into logs: staleness_mean and staleness_max over the workers' pulls (how many updates
  // the puller was ahead of the slowest worker). Collective over the workers.
  virtual void epoch_end(Logs& logs) = 0;
};

}  // namespace tnt::detail
