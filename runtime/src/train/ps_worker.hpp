// What the fit loop asks of the parameter-server strategy (FitOptions::strategy =
// parameter_server): its entry point and a worker's four calls. Declared here, below the
// strategy, and implemented in ps/ (ps/parameter_server.hpp), so that train/ does not depend
// on ps/.
#pragma once

#include "tarantella/model.hpp"

#include <functional>

namespace tnt::detail {

// Collective over every rank (each calls fit with the same options): servers serve until
// every worker is done, workers train; then every rank, servers included, ends with the same
// variables, optimizer state, buffers (the first worker's), global step and History.
History fit_parameter_server(Model& model, const Dataset& data, FitOptions options);

class PsWorker {
 public:
  virtual ~PsWorker() = default;
  virtual void pull() = 0;       // before a step: the servers' current variables into the model
  virtual void push() = 0;       // after backward: the gradients to the servers
  // Leaving the epoch's steps (its data done, max_steps, a stop request): until its next
  // push the servers hold no other worker's pull back for this one, which may now wait for
  // them in the epoch's collectives.
  virtual void pause() = 0;
  // The epoch's batches: this worker's own part (`own`, `own_steps` batches), then the parts
  // of lost workers that the first server's ledger hands it (`part(owner)`: that worker's
  // batches of the epoch, from the first). Ends when the ledger says the epoch is over.
  virtual NextBatch epoch_batches(NextBatch own, int64_t own_steps, std::function<NextBatch(int owner)> part) = 0;
  // Variables and optimizer state, for validation and checkpoints; the epoch's staleness
  // into logs: staleness_mean and staleness_max over the workers' pulls (how many updates
  // the puller was ahead of the slowest worker). Collective over the workers. Called inside
  // end_epoch's `work`, which may run it more than once.
  virtual void epoch_end(Logs& logs) = 0;
  // The job's training rate: every worker's own samples per second summed (the workers do
  // not step in lockstep, and after a loss fewer of them train). Collective over the
  // workers, inside end_epoch's `work`.
  virtual double job_rate(double own_samples_per_second) = 0;
  // The epoch's end up to its callbacks (`work`: the metrics' allreduce, epoch_end,
  // validation; it must start from the same state each time). A worker lost meanwhile is
  // named by the first server; the workers left leave the collective it blocks, make their
  // communicator again without it, and run `work` again.
  virtual void end_epoch(const std::function<void()>& work) = 0;
};

}  // namespace tnt::detail
