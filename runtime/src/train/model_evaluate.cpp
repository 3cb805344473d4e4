// Model::evaluate (model.hpp): a pass of test_step over every rank's share, its results
// global. test_step itself is with train_step in model.cpp.
#include "comm/agreement.hpp"
#include "comm/collective_scope.hpp"
#include "tarantella/model.hpp"

#include "tarantella/runtime.hpp"
#include "train/batch_sources.hpp"
#include "train/callback_list.hpp"
#include "train/pass_totals.hpp"
#include "train/same_network.hpp"
#include "train/staging.hpp"

#include <memory>
#include <optional>
#include <vector>

namespace tnt {

using detail::distributed_source;
using detail::global_batch_of;
using detail::NextBatch;
using detail::stager_for;
using detail::user_source;
using detail::with_sample_weights;
using detail::with_staging;

Logs Model::evaluate(const Dataset& data, EvaluateOptions options) {
  check_compiled("evaluate");
  const detail::CollectiveLabel label("evaluate");  // messages say "... in evaluate"
  EvalParams eval;
  eval.verbose = options.verbose;
  std::vector<CallbackPtr> bar;
  if (options.verbose > 0) bar.push_back(std::make_shared<ProgressBar>());
  detail::CallbackList callbacks(bar, this, TrainParams{});
  if (!options.distribute_dataset) {
    eval.steps = data.cardinality();  // the ranks' own micro-batches: one a step
    return run_evaluate(user_source(data, 0, options.micro_batch_size), options.class_weight, eval,
                        &callbacks);
  }
  const int64_t global = detail::batch_within_data(
      "evaluate", "batch_size",
      global_batch_of("evaluate", "batch_size", options.batch_size, "micro_batch_size", options.micro_batch_size),
      data.cardinality(), false);
  // A loss over no samples would read as 0, a perfect model.
  TNT_INPUT_CHECK(data.cardinality() != 0, "evaluate: the dataset is empty (no sample to evaluate)");
  DistributedDataset distributed = data.distribute(global, rank(), size(), Remainder::pad);
  detail::require_same_pass(communicator(), "evaluate",
                            {fmt::format("{} samples", data.cardinality()), fmt::format("global batch {}", global)});
  eval.steps = distributed.steps();
  eval.batch_size = global;
  eval.samples = data.cardinality();
  return run_evaluate(distributed_source(distributed, 0), options.class_weight, eval, &callbacks);
}

Logs Model::evaluate(const DistributedDataset& data, EvaluateOptions options) {
  check_compiled("evaluate");
  const detail::CollectiveLabel label("evaluate");
  TNT_INPUT_CHECK(options.distribute_dataset,
                  "evaluate: distribute_dataset=false with a dataset already distributed (pass the unbatched "
                  "Dataset to evaluate each rank's own micro-batches)");
  TNT_INPUT_CHECK(options.batch_size <= 0 || options.batch_size == data.global_batch_size(),
                  "evaluate: batch_size={} but the distributed dataset was cut into global batches of {}",
                  options.batch_size, data.global_batch_size());
  TNT_INPUT_CHECK(options.micro_batch_size <= 0 || options.micro_batch_size == data.micro_batch_size(),
                  "evaluate: micro_batch_size={} but the distributed dataset gives rank {} {} samples",
                  options.micro_batch_size, rank(), data.micro_batch_size());
  EvalParams eval;
  eval.verbose = options.verbose;
  eval.steps = data.steps();
  eval.batch_size = data.global_batch_size();
  std::vector<CallbackPtr> bar;
  if (options.verbose > 0) bar.push_back(std::make_shared<ProgressBar>());
  detail::CallbackList callbacks(bar, this, TrainParams{});
  return run_evaluate(distributed_source(data, 0), options.class_weight, eval, &callbacks);
}

// callbacks: on_test_begin, on_test_batch_end (empty logs: no collective per step) and
// on_test_end (the global results) with eval as their EvalParams.
Logs Model::run_evaluate(const NextBatch& source, const ClassWeight& class_weight, const EvalParams& eval,
                         detail::CallbackList* callbacks) {
  detail::check_class_weight_for("evaluate", class_weight, class_count());
  if (!weights_synced_) {
    broadcast_weights();
  } else if (!ps_) {
    // Each rank trained its own running statistics: the evaluation is of the master's, the
    // model a checkpoint saves (parameter servers' workers keep their own).
    detail::share_master_buffers(communicator(), *network_);
  }
  RunContext rc;
  rc.training = false;
  rc.seed = seed_;
  rc.step = global_step_;
  rc.device = network_->device();
  const std::shared_ptr<detail::InputStager> stager = stager_for(rc.device);
  detail::PassTotals totals(metrics_, /*restore=*/true, rc.device, stager.get());
  NextBatch next =
      with_staging(with_sample_weights(source, network_->inputs().size(), loss_, class_weight, class_count(), "evaluate"), stager);
  const Logs none;
  auto each = [&](auto&& f) {
    if (callbacks) callbacks->each(f);
  };
  each([&](Callback& c) {
    c.set_eval_params(eval);
    c.on_test_begin(none);
  });
  for (int64_t step = 0; std::optional<Batch> batch = next(); ++step) {
    test_step(*batch, rc, totals);
    each([&](Callback& c) { c.on_test_batch_end(step, none); });
  }
  if (stager) stager->end_pass();
  Logs logs = totals.global();
  each([&](Callback& c) { c.on_test_end(logs); });
  return logs;
}

}  // namespace tnt
