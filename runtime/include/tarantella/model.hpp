// tnt::Model: the data-parallel training wrapper with Keras' interface.
//
//   auto net = std::make_shared<tnt::Sequential>(...);
//   tnt::Model model(net, /*seed=*/42);
//   model.compile(std::make_shared<tnt::Adam>(1e-3), std::make_shared<tnt::SoftmaxCrossEntropy>(),
//                 {std::make_shared<tnt::Accuracy>()});
//   tnt::FitOptions fit;  fit.batch_size = 128;  fit.epochs = 5;  fit.validation_data = test;
//   tnt::History history = model.fit(train, fit);
//
// Semantics, identical on 1 or p ranks:
// - The user gives the GLOBAL batch size B. With distribute_dataset (default) each rank
//   takes its contiguous slice of every global batch (sizes differ by one when p does not
//   divide B). The loss of a step is the sum of per-sample losses over the global batch
//   divided by the number of real samples in it, so each rank's gradient is already its
//   share of the serial gradient: the allreduced SUM is the serial gradient, whatever the
//   micro-batch sizes. A last partial batch is padded (zero-weight samples, default) or
//   dropped (FitOptions::remainder). A batch larger than data of known size is cut to that
//   size, max(samples, p), as Keras does (fit warns; evaluate and predict give the same
//   results either way); with remainder drop such a fit has no step and is refused.
// - distribute_dataset=false: each rank's dataset yields its own micro-batches; their counts
//   must be equal (known counts are compared before the first step, unless max_steps ends
//   training first).
// - Local batch sizes (Tarantella's micro_batch_size, to scale the global batch with the
//   ranks): with batch_size = 0 and micro_batch_size = m, fit, evaluate and predict batch the
//   unbatched dataset with the global batch m x p themselves (every rank takes m samples a
//   step), and FitOptions::validation_micro_batch_size does the same for the validation
//   data. Given both, micro_batch_size must be this rank's share of batch_size (the ranks
//   check that together, so a mismatch is an InputError on every rank); neither is an
//   InputError naming both.
// - Before the first step the master broadcasts every parameter and buffer; all ranks then
//   apply identical updates, so replicas never diverge. BatchNorm statistics stay local.
// - Gradients reach the optimizer through the Reducer (fusion buckets, allreduced while
//   backward continues).
// - Logged metrics are global: each rank's sums are allreduced before any callback sees them.
// - Sample weights (Keras' sample_weight and class_weight): an element {inputs..., target,
//   sample_weight} (weight f32 ()) weights its sample's loss; FitOptions::class_weight and
//   EvaluateOptions::class_weight weight it by its label (Loss::sample_classes); given both,
//   the two multiply (as in Keras). The loss stays sum(w_i * l_i) / global real samples
//   (loss.hpp), in fit, in evaluate and in the logged "loss"; so weights of 1 equal none and
//   p ranks equal one. Metrics are NOT weighted (as Keras' `metrics`, unlike its
//   `weighted_metrics`). Validation in fit uses the validation data's own sample weights,
//   never the training class_weight (Keras). A weight that is negative or not finite, a
//   class_weight key for a class the predictions do not have (Loss::class_count), a
//   class_weight on a loss without class labels, or weights on a loss that does not support
//   them is an InputError on every rank; while weights are in use the ranks agree on that
//   once a step (one small allgather).
// - Device I/O of a step (CUDA): the next batch is copied to the device from page-locked
//   memory on a second stream while the current step computes (TNT_PINNED_STAGING=0: plain
//   copies; the results are bitwise the same), and the step's device results (the loss, the
//   metrics' counts, label checks, the loss scaler's overflow flag) come back to the host in
//   ONE copy at its end. A bad label or target found by the loss or a metric (on any
//   device) does not stop that step's update (every rank applies it, so replicas stay
//   equal); it is an InputError on every rank when the step's logs are agreed, right after
//   the step (in evaluate: after the last step).
#pragma once

#include "tarantella/callbacks.hpp"
#include "tarantella/dataset.hpp"
#include "tarantella/graph.hpp"
#include "tarantella/loss.hpp"
#include "tarantella/metrics.hpp"
#include "tarantella/optim.hpp"
#include "tarantella/precision.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

class Reducer;

namespace detail {
// A pass over this rank's batches: a distributed dataset, or the user's own micro-batches
// (distribute_dataset = false) whose global size is summed every step.
using NextBatch = std::function<std::optional<Batch>()>;
class PassTotals;  // loss and metric sums of one pass (model.cpp)
class PsWorker;    // a worker's side of parameter-server training (train/ps_worker.hpp)
struct PsAccess;   // the parameter-server strategy's way to a Model's insides
class InputStager;  // input batches staged on a CUDA device (train/staging.hpp)
class CallbackList;  // the callbacks that run on this rank (model.cpp)
class ScalingProfiler;  // TNT_PROFILE_SCALING (train/scaling_profiler.hpp)
class RankBalance;  // which rank the others wait for (train/rank_balance.hpp)
}  // namespace detail

// How the ranks train together (docs/parameter_server.md).
enum class Strategy {
  synchronous,       // every rank a replica; gradients allreduced every step (the default)
  parameter_server,  // server ranks (TNT_PS_SERVERS) hold the variables; workers pull, push
};
Strategy parse_strategy(const std::string& text);  // "synchronous" | "parameter_server"
const char* strategy_name(Strategy strategy);

struct FitOptions {
  int epochs = 1;                      // train until this epoch index (exclusive)
  int initial_epoch = 0;               // start here (resume)
  // GLOBAL batch size; 0: micro_batch_size x ranks (one of the two is required with
  // distribute_dataset; see "Local batch sizes" above).
  int64_t batch_size = 0;
  std::vector<CallbackPtr> callbacks;
  std::optional<Dataset> validation_data;  // unbatched, like the training data
  // Or validation data already distributed (a pipeline that decodes after distribute());
  // at most one of the two.
  std::optional<DistributedDataset> distributed_validation_data;
  // Or, as Keras: hold out the LAST fraction (in (0, 1)) of the training data, in the order
  // the dataset yields it, and validate on it. The split is of the global data set (the same
  // samples whatever the number of ranks): floor(n * (1 - split)) samples train, the rest
  // validate. The dataset must have a known size and the same order every epoch (no
  // shuffle() in it: the held-out part would change). Not with validation_data or
  // distributed_validation_data, nor with distribute_dataset=false or a DistributedDataset.
  double validation_split = 0.0;
  // Global; 0: validation_micro_batch_size x ranks when that is given, else batch_size.
  int64_t validation_batch_size = 0;
  int validation_freq = 1;             // validate after epochs k*freq (1-based), and after the last
  int verbose = 1;                     // 0 silent, 1 progress bar, 2 one line per epoch
  // true: each rank takes its slice of every global batch. false: the dataset already
  // yields this rank's micro-batches (the user sharded by tnt::rank()/tnt::size()).
  bool distribute_dataset = true;
  // Per rank. Alone (batch_size 0) it sets the global batch, micro_batch_size x ranks; with
  // batch_size it must be this rank's share of it; with distribute_dataset=false it must
  // equal the size of every micro-batch the data yield.
  int64_t micro_batch_size = 0;
  int64_t validation_micro_batch_size = 0;  // as micro_batch_size, for the validation data
  Remainder remainder = Remainder::pad;
  int prefetch = 2;                    // micro-batches prepared ahead on a background thread
  ClassWeight class_weight;            // class -> loss weight (absent classes: 1); see above
  // Training ends once global_step() reaches this (the whole run's steps, a resumed run's
  // included); 0 = no limit. The progress bar counts the steps that will run.
  int64_t max_steps = 0;
  // The steps of initial_epoch already trained: a checkpoint written when fit stopped inside
  // an epoch (max_steps, stop_training) says how many (Model::checkpoint_epoch_step). The
  // epoch's first initial_step global batches are skipped (without building them where the
  // source is random-access), so the run sees the batches an uninterrupted one would have.
  // Not with strategy=parameter_server. Those steps are of the checkpoint's global batch: a
  // fit with another one is refused (it would skip other samples).
  int64_t initial_step = 0;
  // For the progress display only, when a program calls fit in pieces (fit to epoch 3, an
  // evaluation of its own, fit from 3 to 6, ...): the whole run's epochs, so that the count
  // reads 1/6 ... 6/6 over the pieces rather than 1/3 then 4/6. 0: epochs.
  int total_epochs = 0;
  // parameter_server: the ranks of TNT_PS_SERVERS (the launcher's --parameter-servers; rank 0
  // when unset) hold shards of the variables and the optimizer state and apply each push;
  // the others train on the dataset split among them (batch_size is their global batch) and
  // end with identical replicas on every rank, servers included, as synchronous fit does.
  // global_step() (and so max_steps and a checkpoint's step) counts the servers' updates.
  Strategy strategy = Strategy::synchronous;
  // parameter_server only: how many updates a worker may be ahead of the slowest. nullopt:
  // no bound (fully asynchronous: every push is applied on arrival); N >= 1: a worker's pull
  // waits while it is more than N updates ahead; 0: the servers sum every worker's gradient
  // of a step and apply it once, which is synchronous training (same losses, up to the
  // order of the sum).
  std::optional<int64_t> max_staleness;
};

struct EvaluateOptions {
  int64_t batch_size = 0;              // GLOBAL; 0: micro_batch_size x ranks
  bool distribute_dataset = true;
  int64_t micro_batch_size = 0;        // as FitOptions::micro_batch_size
  int verbose = 0;                     // 1: announced, with a progress bar; 2: announced, a result line
  ClassWeight class_weight;            // as FitOptions::class_weight
};

// Which ranks get predict's outputs.
enum class Gather {
  master,  // the master returns all of them; the other ranks an undefined Tensor
  all,     // every rank returns all of them
};

struct PredictOptions {
  int64_t batch_size = 0;          // GLOBAL; 0: micro_batch_size x ranks
  int64_t micro_batch_size = 0;    // as FitOptions::micro_batch_size
  // true: each rank predicts its slice of every global batch (as evaluate), and the outputs
  // are gathered in the dataset's order. false: the dataset yields this rank's own batches,
  // predicted here alone (no collective once the master's weights were broadcast, which the
  // model's first fit, evaluate or predict does on every rank: then callable on one rank);
  // batch_size and micro_batch_size must then be 0, and gather is not used.
  bool distribute_dataset = true;
  Gather gather = Gather::all;
};

// Per-epoch timing of the step and of gradient communication (from the Reducer).
struct EpochTiming {
  int64_t steps = 0;
  int64_t global_batch = 0;         // samples a step over all ranks (0: not known)
  double samples = 0;               // this rank's real samples trained in the epoch
  // Parameter servers: the workers' own rates summed (their steps are not in lockstep);
  // 0 elsewhere (the rate is global_batch / step_seconds).
  double job_samples_per_second = 0;
  double step_seconds = 0;          // mean wall time of a training step
  double input_seconds = 0;         // mean time the loop waited for a step's batch, before it
  double backward_seconds = 0;      // mean time of backward
  double comm_seconds = 0;          // mean time gradient buckets were in flight
  double hidden_comm_seconds = 0;   // ... of which while backward was still running
  double exposed_comm_seconds = 0;  // mean time the step waited for communication after backward
  // Parameter-server training (no allreduce): mean time of a step's pull and push.
  bool parameter_server = false;
  double pull_seconds = 0;
  double push_seconds = 0;
  // Synchronous training on several ranks (docs/observability.md, "Which rank the others
  // wait for"): each rank's own work a step (from the ranks' meeting to the end of its
  // backward, and its update), gathered at the epoch's end: the slowest rank, its time and
  // the other ranks' median. slowest_rank is -1 where nothing was measured.
  int slowest_rank = -1;
  double slowest_own_seconds = 0;
  double typical_own_seconds = 0;
  double hidden_fraction() const { return comm_seconds > 0 ? hidden_comm_seconds / comm_seconds : 1.0; }
  // The share of the loop's time spent waiting for batches: input / (input + step).
  double input_fraction() const {
    const double period = input_seconds + step_seconds;
    return period > 0 ? input_seconds / period : 0.0;
  }
  void finish();  // sums over the epoch's steps -> means
};
// The line fit prints after an epoch with verbose 2 (or TNT_LOG_LEVEL=INFO): "epoch 3:
// 41.2 ms/step, backward 20.1 ms; gradient allreduce 8.0 ms a step, 75% of it while backward
// ran; after backward the step waited 2.5 ms for its gradients". On one rank there is no
// allreduce, and the line says so; with parameter servers it gives the pull and the push.
// Where the loop waited for its batches 5% of the time or more, the line says so after the
// backward: "; waited 12.0 ms a step for its batch (23%: the input is too slow)".
std::string describe_epoch_timing(int epoch, const EpochTiming& timing, int ranks);
inline constexpr double kInputBoundFraction = 0.05;

class Model {
 public:
  // Moves the network to this rank's device (tnt::default_device()) and sets its initial
  // weights from seed (identical on every rank; the master's are broadcast anyway).
  Model(std::shared_ptr<Network> network, uint64_t seed = 0);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // precision: f32 by default; bf16/f16 mixed precision with f32 master weights and, for
  // f16, dynamic loss scaling (tarantella/precision.hpp). Every rank must pass the same.
  void compile(std::shared_ptr<Optimizer> optimizer, LossPtr loss, std::vector<MetricPtr> metrics = {},
               Precision precision = {});
  bool compiled() const { return loss_ != nullptr; }
  const Precision& precision() const { return precision_; }
  const LossScaler& loss_scaler() const { return scaler_; }

  // Trains on an UNBATCHED dataset whose elements are {inputs..., target}.
  History fit(const Dataset& data, FitOptions options);
  // Trains on data already distributed: data.distribute(B) followed by per-sample maps
  // (decoding, augmentation) that then run only on this rank's samples. batch_size and
  // micro_batch_size of options, when given, must agree with it.
  History fit(const DistributedDataset& data, FitOptions options);

  // Global loss and metrics over the dataset: {"loss": ..., "accuracy": ...}.
  Logs evaluate(const Dataset& data, EvaluateOptions options);
  // ... on data already distributed (every rank must pass its own share of the same data).
  // verbose and class_weight as above; batch_size and micro_batch_size, when given, must
  // agree with the data's (as in fit); distribute_dataset=false is refused (the data is
  // distributed already).
  Logs evaluate(const DistributedDataset& data, EvaluateOptions options = {});
  // Outputs of the first network output for every element of an UNBATCHED dataset, in the
  // dataset's order, on the host: (N, ...). Distributed as evaluate (every rank must call
  // it): each rank runs its slice of every global batch, padding rows are dropped, and the
  // rows are gathered (one allgather of every rank's rows, in chunks) onto the master or onto
  // every rank (PredictOptions::gather). The rows equal one rank's predict on the same data,
  // bitwise on the CPU engines, where a row's output does not depend on the other rows of
  // its batch (tested); a GPU library may pick another algorithm for the smaller
  // micro-batches and change the last bits. InputError on every rank for an empty dataset.
  Tensor predict(const Dataset& data, PredictOptions options);
  // The local form: this rank alone predicts every element, in batches of batch_size (no
  // collective; what predict did before it was distributed). Equals
  // predict(data.batch(batch_size), {.distribute_dataset = false}).
  Tensor predict(const Dataset& data, int64_t batch_size);

  // Weights only (parameters and buffers, PyTorch names). save_* are collective: the master
  // writes atomically and every rank learns whether it worked (a failure throws on every
  // rank); load_*: every rank reads and checks names, shapes and dtypes. save_* refuse (throw
  // tnt::Error on every rank, naming the tensor, and leave the file as it was) when any tensor
  // they would write holds a NaN or an infinity: a diverged model never replaces a good one.
  void save_weights(const std::string& path);
  void load_weights(const std::string& path);
  // Weights + optimizer state + epoch/step/seed (what ModelCheckpoint writes; resume with
  // load_checkpoint and FitOptions::initial_epoch = the returned epoch). epoch: the epochs
  // completed; epoch_step > 0: the checkpoint is inside epoch `epoch`, after that many of its
  // steps (resume with FitOptions::initial_step = checkpoint_epoch_step()).
  void save_checkpoint(const std::string& path, int epoch, int64_t epoch_step = 0);
  int load_checkpoint(const std::string& path);
  // The last loaded checkpoint's steps into its epoch (0: it was written at an epoch's end;
  // all of the epoch's steps: a stop on request at its last step left its validation to the
  // resume), and the global batch of those steps (0: not recorded). A fit resumed there
  // logs the whole epoch: the checkpoint keeps the epoch's loss and metric sums so far.
  int64_t checkpoint_epoch_step() const { return checkpoint_epoch_step_; }
  int64_t checkpoint_epoch_batch() const { return checkpoint_epoch_batch_; }
  // After fit: when its last epoch was cut short (max_steps, stop_training), the steps of
  // that epoch taken (initial_step's included); 0 when the epoch ran to its end.
  // ModelCheckpoint saves such an epoch as unfinished.
  int64_t partial_epoch_steps() const { return partial_epoch_steps_; }
  // After fit: it ended because tnt::request_stop_after_step() was called (on any rank).
  bool stopped_on_request() const { return stopped_on_request_; }
  // The global step at which this model last saved a checkpoint (save_checkpoint,
  // ModelCheckpoint); -1: none yet.
  int64_t last_checkpoint_step() const { return last_checkpoint_step_; }
  // Collective: the master alone reads the checkpoint (as load_checkpoint does), and every
  // rank gets its weights, buffers, optimizer state and training position from the master.
  // For a run directory that only the master's host has (a --model_dir on its own disk):
  // the other ranks read no file. A checkpoint the master refuses throws the same InputError
  // on every rank, and leaves every model as it was.
  int load_checkpoint_from_master(const std::string& path);
  // More metadata for every checkpoint this model writes (save_checkpoint, ModelCheckpoint):
  // e.g. a program's flags, as JSON text, for its resume to compare with the flags it is
  // given. A key the checkpoint writes itself (checkpoint_key, "precision", ...) or an empty
  // key is refused (InputError); an empty value removes the key.
  void set_checkpoint_metadata(const std::string& key, const std::string& value);

  // For callbacks. stop_training() from a callback that runs on some ranks only (the
  // master's), inside an epoch, stops every rank after the next step (the request travels
  // with its metrics); at an epoch's end, after that epoch.
  void stop_training() { stop_requested_ = true; }
  bool stop_requested() const { return stop_requested_; }
  double learning_rate() const;
  void set_learning_rate(double lr);
  int64_t global_step() const { return global_step_; }
  Network& network() { return *network_; }
  // Keras' model.summary(), as text (print it with tnt::print, on the master): the
  // network's table (Network::summary: each layer's name, type, output shape and parameter
  // count; total, trainable and non-trainable counts), then what compile() chose.
  std::string summary();
  Optimizer& optimizer();
  uint64_t seed() const { return seed_; }
  const EpochTiming& last_epoch_timing() const { return timing_; }

 private:
  friend struct detail::PsAccess;
  struct StepInputs {
    std::vector<Tensor> inputs;  // each (b, ...) on the model's device
    Tensor target;               // (b, ...)
    Tensor weights;              // (real) f32 on the device: Batch::sample_weights; undefined: none
  };

  // The steps (Keras' train_step / test_step); the loops below run them.
  void check_ps_loss(const Tensor& target) const;
  void train_step(const Batch& batch, RunContext& rc, detail::PassTotals& totals);
  void test_step(const Batch& batch, const RunContext& rc, detail::PassTotals& totals);
  // train_step's parts, in its order (model.cpp says what each does).
  Tensor loss_gradient(const Batch& batch, const StepInputs& in, Tensor pred, detail::PassTotals& totals);
  std::pair<double, double> backward_and_reduce(const Tensor& grad_pred, RunContext& rc);
  bool read_step_results(detail::PassTotals& totals);
  void apply_update(bool overflow);
  // staging: the pass's stager when the batch was staged (its copies are taken), else null.
  StepInputs step_inputs(const Batch& batch, const char* what, detail::InputStager* staging) const;

  History run_fit(const std::function<detail::NextBatch(int64_t epoch, int64_t first_step)>& source, int64_t steps,
                  const std::optional<DistributedDataset>& validation, const FitOptions& options);
  Logs run_evaluate(const detail::NextBatch& source, const ClassWeight& class_weight = {}, const EvalParams& eval = {},
                    detail::CallbackList* callbacks = nullptr);
  std::optional<DistributedDataset> validation_set(const FitOptions& options) const;
  // This rank's outputs of the first network output for the real rows of every batch of
  // `next`, stacked (R, ...). global_real, when given: the global batches' real sample
  // counts are appended.
  Tensor predict_rows(const detail::NextBatch& next, const char* what, std::vector<int64_t>* global_real);
  void prepare_training();
  void check_ranks_agree();
  void broadcast_weights();
  void check_compiled(const char* what) const;
  int64_t class_count() const;  // of the network's one output (Loss::class_count), -1 unknown
  std::vector<NamedTensor> checkpoint_tensors(bool with_optimizer);
  void write_on_master(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

  std::shared_ptr<Network> network_;
  std::shared_ptr<Optimizer> optimizer_;
  LossPtr loss_;
  std::vector<MetricPtr> metrics_;
  std::unique_ptr<Reducer> reducer_;
  std::vector<NamedParameter> trainable_;  // in the graph hook's (and the Reducer's) order
  std::vector<Tensor> trainable_grads_;    // their gradients, same order
  std::vector<const Parameter*> reducer_params_;  // the parameters reducer_ was built over
  uint64_t seed_;
  std::map<std::string, std::string> checkpoint_metadata_;  // set_checkpoint_metadata's
  std::vector<double> epoch_sums_;             // the epoch fit cut short: its global loss and metric sums
  std::vector<double> checkpoint_epoch_sums_;  // the loaded checkpoint's (its metadata "epoch_sums")
  double epoch_seconds_ = 0;             // the epoch fit cut short: its seconds so far (a resumed one's earlier ones too)
  double checkpoint_epoch_seconds_ = 0;  // the loaded checkpoint's (its metadata "epoch_seconds")
  int64_t global_step_ = 0;
  int64_t checkpoint_epoch_step_ = 0;
  int64_t checkpoint_epoch_batch_ = 0;
  int64_t partial_epoch_steps_ = 0;
  int64_t fit_global_batch_ = 0;  // the last fit's (0: the ranks' own micro-batches)
  bool stopped_on_request_ = false;
  int64_t last_checkpoint_step_ = -1;
  bool stop_requested_ = false;
  bool weights_synced_ = false;
  EpochTiming timing_;
  std::unique_ptr<detail::ScalingProfiler> profiler_;  // TNT_PROFILE_SCALING, else null
  std::unique_ptr<detail::RankBalance> balance_;  // synchronous training on several ranks, else null
  Precision precision_;
  LossScaler scaler_;
  detail::PsWorker* ps_ = nullptr;  // while a parameter-server fit trains this worker
};

}  // namespace tnt
