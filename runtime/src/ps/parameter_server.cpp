// Parameter-server training. The idea, and why it is built this way:
//
// - Roles are fixed for the job (TNT_PS_SERVERS); every rank builds the same Model, so every
//   rank can compute the same shard plan and nobody sends it.
// - Servers answer MPI point-to-point messages from any worker (MPI_ANY_SOURCE, one tag per
//   kind of message) on a communicator of their own, in one loop that never waits for a
//   particular worker: a pull it may not answer yet (staleness) is kept and answered when it
//   may. Replies are sent nonblocking, so a slow reader never stops the loop.
// - Workers run the ordinary fit loop over a communicator of the workers only, swapped into
//   the runtime context for the fit: the dataset's distribution, metrics, validation,
//   callbacks and checkpoints work on the workers as they do on all ranks in synchronous
//   training, with the first worker as their master.
// - max_staleness 0 is synchronous training: a server sums the pushes of one step from
//   every worker and applies the sum once, so the result equals the allreduce's up to the
//   order of the sum. Otherwise each push is one update of its own.
// - The end of the fit is a collective over every rank again: each server broadcasts its
//   shard of the variables and of the optimizer state, so that afterwards every rank holds
//   the same model and checkpoints have synchronous training's names and layout.
// - A worker lost at an epoch's end (its metrics, validation) would block the others in a
//   collective until TNT_COLLECTIVE_TIMEOUT. Each worker's watch thread beats to the first
//   server there, and cancels the workers' communicator when the first server names a lost
//   worker (kGone); the workers left make it again without it and run that part of the
//   epoch's end again (Worker::end_epoch), within about TNT_PS_WORKER_TIMEOUT.
#include "ps/parameter_server.hpp"

#include "core/clock.hpp"
#include "core/context.hpp"
#include "io/timeline.hpp"
#include "ps/server.hpp"
#include "ps/shards.hpp"
#include "ps/worker.hpp"
#include "train/same_network.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"

#include <mpi.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <charconv>
#include <list>
#include <map>
#include <set>
#include <limits>
#include <functional>
#include <thread>

namespace tnt {

namespace detail {

// A Model's insides that the strategy uses (model.hpp befriends this).
struct PsAccess {
  static Network& network(Model& m) { return *m.network_; }
  static Optimizer& optimizer(Model& m) { return *m.optimizer_; }
  static void reset_reducer(Model& m) { m.reducer_.reset(); }
  // The master's variables and buffers on every rank, through host memory: a server
  // computes on the CPU (it needs no GPU) while the workers' tensors may be on a GPU, and a
  // collective must see the same kind of buffer on every rank.
  static void sync_weights(Model& m) {
    if (m.weights_synced_) return;
    Communicator& comm = communicator();
    detail::require_same_network(comm, *m.network_, "parameter-server fit: sharing the master's weights");
    for (auto& p : m.network_->named_parameters()) broadcast_via_host(comm, p.param->value, master_rank());
    for (auto& b : m.network_->named_buffers()) broadcast_via_host(comm, b.param->value, master_rank());
    m.weights_synced_ = true;
  }
  static bool mixed(const Model& m) { return m.precision_.mixed(); }
  static void set_worker(Model& m, PsWorker* w) { m.ps_ = w; }
  static int64_t& global_step(Model& m) { return m.global_step_; }
  static bool& stop_requested(Model& m) { return m.stop_requested_; }
};

}  // namespace detail

Strategy parse_strategy(const std::string& text) {
  if (text == "synchronous" || text == "sync") return Strategy::synchronous;
  if (text == "parameter_server" || text == "ps") return Strategy::parameter_server;
  TNT_INPUT_ERROR("strategy '{}' is not synchronous or parameter_server", text);
}

const char* strategy_name(Strategy strategy) {
  return strategy == Strategy::parameter_server ? "parameter_server" : "synchronous";
}

namespace detail {

std::vector<int> parse_server_ranks(const std::string& text, int size) {
  if (text.empty()) {
    TNT_INPUT_CHECK(size >= 2,
                    "fit: strategy=parameter_server needs at least 2 ranks (a server and a worker); this job has 1 "
                    "(run it with tarantella -np N --parameter-servers K)");
    return {0};
  }
  std::set<int> ranks;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string word = text.substr(at, comma - at);
    int r = -1;
    auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), r);
    TNT_INPUT_CHECK(!word.empty() && ec == std::errc() && ptr == word.data() + word.size() && r >= 0 && r < size,
                    "TNT_PS_SERVERS='{}': '{}' is not a rank of this job (0 to {})", text, word, size - 1);
    TNT_INPUT_CHECK(ranks.insert(r).second, "TNT_PS_SERVERS='{}': rank {} is named twice", text, r);
    at = comma + 1;
  }
  TNT_INPUT_CHECK(static_cast<int>(ranks.size()) < size,
                  "TNT_PS_SERVERS='{}' makes all {} ranks servers: no worker is left to train", text, size);
  return {ranks.begin(), ranks.end()};
}

namespace {

using timeline::Lane;
using Span = timeline::Span;

using ps::Shards;
using ps::wait_servers;
using namespace ps;  // the message tags (ps/shards.hpp)

// The workers' communicator in the runtime context for the fit, the job's back after it.
class WorkerContext {
 public:
  explicit WorkerContext(std::unique_ptr<Communicator> workers) : ctx_(*context_or_null()) {
    saved_rank_ = ctx_.rank;
    saved_size_ = ctx_.size;
    ctx_.rank = workers->rank();
    ctx_.size = workers->size();
    saved_ = std::move(ctx_.comm);
    ctx_.comm = std::move(workers);
  }
  ~WorkerContext() {
    ctx_.comm = std::move(saved_);
    ctx_.rank = saved_rank_;
    ctx_.size = saved_size_;
  }
  WorkerContext(const WorkerContext&) = delete;
  WorkerContext& operator=(const WorkerContext&) = delete;

  // The workers' communicator again, without lost workers.
  void replace(std::unique_ptr<Communicator> workers) {
    ctx_.rank = workers->rank();
    ctx_.size = workers->size();
    ctx_.comm = std::move(workers);
  }

 private:
  RuntimeContext& ctx_;
  std::unique_ptr<Communicator> saved_;
  int saved_rank_ = 0, saved_size_ = 1;
};

std::string history_json(const History& h) {
  nlohmann::json j;
  j["epochs"] = h.epochs;
  j["history"] = h.history;
  return j.dump();
}

void history_from_json(History& h, const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  h.epochs = j.at("epochs").get<std::vector<int>>();
  h.history = j.at("history").get<std::map<std::string, std::vector<double>>>();
}

// The job's communicator from now on: the ranks left after workers were lost.
void adopt_ranks_left(std::unique_ptr<Communicator> left) {
  RuntimeContext& ctx = *context_or_null();
  ctx.rank = left->rank();
  ctx.size = left->size();
  ctx.comm = std::move(left);
  ctx.ranks_lost = true;
}

// Every rank ends with every server's shard of the variables and the optimizer state
// (`servers`: their ranks in `comm`).
// Returns the servers' update count.
int64_t gather_everywhere(Shards& shards, MPI_Comm comm, const std::vector<int>& servers) {
  int64_t step_count = 0;
  int me = 0;
  MPI_Comm_rank(comm, &me);
  for (size_t s = 0; s < servers.size(); ++s) {
    const int si = static_cast<int>(s);
    const bool mine = me == servers[s];
    std::vector<float> values =
        mine ? shards.gather(si, false) : std::vector<float>(static_cast<size_t>(shards.shard_elements(si)));
    auto [floats, ints] = mine ? shards.gather_state(si)
                               : std::pair<std::vector<float>, std::vector<int64_t>>{
                                     std::vector<float>(values.size() * shards.slots()),
                                     std::vector<int64_t>(shards.pieces_of_count(si) + 1)};
    TNT_MPI_CHECK(MPI_Bcast(values.data(), static_cast<int>(values.size()), MPI_FLOAT, servers[s], comm));
    TNT_MPI_CHECK(MPI_Bcast(floats.data(), static_cast<int>(floats.size()), MPI_FLOAT, servers[s], comm));
    TNT_MPI_CHECK(MPI_Bcast(ints.data(), static_cast<int>(ints.size()), MPI_INT64_T, servers[s], comm));
    shards.scatter(si, values.data(), false);
    shards.scatter_state(si, floats.data(), ints.data());
    if (s == 0) step_count = ints.back();  // every server applies every step: theirs are equal
  }
  shards.write_values();
  shards.write_state(step_count);
  return step_count;
}

}  // namespace

History fit_parameter_server(Model& model, const Dataset& data, FitOptions options) {
  const std::vector<int> servers = parse_server_ranks(config().ps_servers, size());
  TNT_INPUT_CHECK(!options.max_staleness || *options.max_staleness >= 0,
                  "fit: max_staleness={} must be 0 (synchronous), a positive number of updates, or unset (no bound)",
                  options.max_staleness.value_or(0));
  TNT_INPUT_CHECK(options.distribute_dataset,
                  "fit: strategy=parameter_server needs distribute_dataset=true: the workers split the data among "
                  "themselves, and micro-batches sharded by tnt::rank() would leave the servers' share untrained");
  TNT_INPUT_CHECK(!PsAccess::mixed(model),
                  "fit: strategy=parameter_server trains in f32 only; compile the model without mixed precision");
  const GradientClipping& clip = PsAccess::optimizer(model).clipping();
  TNT_INPUT_CHECK(servers.size() == 1 || !(clip.norm || clip.global_norm),
                  "fit: gradient clipping by norm ({}) needs every gradient in one place; with strategy="
                  "parameter_server use one server (TNT_PS_SERVERS) or clip by value",
                  clip.describe());
  std::vector<int> workers;
  for (int r = 0; r < size(); ++r) {
    if (!std::binary_search(servers.begin(), servers.end(), r)) workers.push_back(r);
  }
  const bool is_server = std::binary_search(servers.begin(), servers.end(), rank());
  if (is_master_rank() && options.verbose > 0) {
    tnt::print("Parameter-server training: {} server(s) (rank(s) {}), {} worker(s), max_staleness {}", servers.size(),
          fmt::join(servers, ", "), workers.size(),
          options.max_staleness ? std::to_string(*options.max_staleness) : std::string("unbounded"));
  }

  PsAccess::reset_reducer(model);  // one of an earlier synchronous fit spans every rank
  // A timeline of an earlier fit records over every rank; this fit's workers and servers
  // each record over their own communicator (its file written already at that fit's end).
  timeline::discard();
  PsAccess::sync_weights(model);   // every rank starts from the master's variables
  Shards shards(PsAccess::network(model), PsAccess::optimizer(model), static_cast<int>(servers.size()));
  // Every rank's process, for the first server to end a dropped worker on its host.
  const ps::Process mine = ps::this_process();
  std::vector<ps::Process> processes(static_cast<size_t>(size()));
  {
    const std::vector<int64_t> pids = communicator().allgather(mine.pid);
    const std::vector<int64_t> starts = communicator().allgather(mine.start);
    const std::vector<int64_t> hosts = communicator().allgather(mine.host);
    for (size_t r = 0; r < processes.size(); ++r) processes[r] = {pids[r], starts[r], hosts[r]};
  }
  MPI_Comm comm;
  TNT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::unique_ptr<Communicator> worker_comm = communicator().split(is_server ? 0 : 1);

  History history;
  std::vector<int> lost;  // workers lost during the fit (world ranks), the same on every rank left
  if (is_server) {
    const int index = static_cast<int>(std::lower_bound(servers.begin(), servers.end(), rank()) - servers.begin());
    // worker_comm: the servers' own here.
    lost = ps::serve(shards, comm, index, workers, servers, options.max_staleness, *worker_comm, processes,
                     PsAccess::global_step(model));
  } else {
    // The workers' communicator holds these (world ranks); after a loss it is made again
    // over the workers left, collectively over them only.
    std::vector<int> alive = workers;
    WorkerContext scope(std::move(worker_comm));
    auto on_lost = [&](const std::vector<int>& gone) {
      std::vector<int> keep, index;
      for (size_t i = 0; i < alive.size(); ++i) {
        if (std::find(gone.begin(), gone.end(), alive[i]) == gone.end()) {
          keep.push_back(alive[i]);
          index.push_back(static_cast<int>(i));
        }
      }
      if (keep.size() == alive.size()) return;
      scope.replace(communicator().subset(index, static_cast<int>(gone.size())));
      alive = keep;
    };
    ps::Worker worker(shards, comm, servers, &PsAccess::global_step(model), &PsAccess::stop_requested(model),
                  options.max_steps, on_lost);
    worker.start_watch(config().ps_worker_timeout_s, communicator());
    options.strategy = Strategy::synchronous;  // the loop is the ordinary one, over the workers
    PsAccess::set_worker(model, &worker);
    // From here to the fit's end the others drop this worker if it is lost (not before: they
    // would wait for it in the set-up's collectives), unless the worker timeout is off
    // (TNT_PS_WORKER_TIMEOUT=0, --heartbeat-timeout 0): nothing would tell the servers.
    const bool droppable = config().ps_worker_timeout_s > 0;
    if (droppable) tell_launcher_ps_training(true);
    struct LeftPs {
      bool told;
      ~LeftPs() {
        if (told) tell_launcher_ps_training(false);
      }
    } left_ps{droppable};
    try {
      history = model.fit(data, options);
      worker.stop_watch();
      lost = worker.finish(static_cast<int>(workers.size()));
    } catch (const InputError& e) {
      worker.stop_watch();
      PsAccess::set_worker(model, nullptr);
      worker.abort(e.what(), true);
      throw;
    } catch (const std::exception& e) {
      // A collective that a lost worker blocked outside the part of the epoch's end that
      // is done again (a callback's, a checkpoint's): this fit cannot go on without it, and
      // says so at once rather than at TNT_COLLECTIVE_TIMEOUT.
      const std::vector<int> gone = worker.unapplied_loss();
      worker.stop_watch();
      PsAccess::set_worker(model, nullptr);
      if (!gone.empty()) {
        // epoch(): the epochs whose metrics and validation are done; the loss is after them.
        const std::string when = worker.epoch() == 0 ? std::string("before the first epoch")
                                                     : fmt::format("at the end of epoch {}", worker.epoch() - 1);
        const std::string message = fmt::format(
            "parameter-server training: worker rank(s) {} lost {} of the fit, in a collective outside its metrics "
            "and validation (a callback's or a checkpoint's), which cannot be done again without them: {}",
            fmt::join(gone, ", "), when, e.what());
        worker.abort(message, false);
        throw CommError(message);
      }
      worker.abort(e.what(), false);
      throw;
    }
    PsAccess::set_worker(model, nullptr);
  }

  // Every rank left again: the servers' shards and update count, the first worker's
  // buffers, stop request and history. Without the lost workers, this job's communicator
  // from now on is one of the ranks left (a collective with a lost rank would never end).
  std::vector<int> ranks_left;
  for (int r = 0; r < size(); ++r) {
    if (std::find(lost.begin(), lost.end(), r) == lost.end()) ranks_left.push_back(r);
  }
  auto left_index = [&](int world) {
    return static_cast<int>(std::lower_bound(ranks_left.begin(), ranks_left.end(), world) - ranks_left.begin());
  };
  MPI_Comm all_comm = comm;
  if (!lost.empty()) {
    tnt::log_warning("parameter-server training went on without worker rank(s) {}; from now on the job has {} ranks",
                     fmt::join(lost, ", "), ranks_left.size());
    MPI_Group group, left;
    TNT_MPI_CHECK(MPI_Comm_group(comm, &group));
    TNT_MPI_CHECK(MPI_Group_incl(group, static_cast<int>(ranks_left.size()), ranks_left.data(), &left));
    TNT_MPI_CHECK(MPI_Comm_create_group(comm, left, 1, &all_comm));
    MPI_Group_free(&left);
    MPI_Group_free(&group);
    adopt_ranks_left(communicator().subset(ranks_left, 2));
  }
  std::vector<int> roots;
  for (int s : servers) roots.push_back(left_index(s));
  const int64_t updates = gather_everywhere(shards, all_comm, roots);
  int first_worker = -1;
  for (int w : workers) {
    if (first_worker < 0 && std::find(lost.begin(), lost.end(), w) == lost.end()) first_worker = left_index(w);
  }
  Communicator& all = communicator();
  for (auto& b : PsAccess::network(model).named_buffers()) detail::broadcast_via_host(all, b.param->value, first_worker);
  std::vector<int64_t> words{PsAccess::global_step(model), PsAccess::stop_requested(model) ? 1 : 0};
  Tensor w = Tensor::from_data(words.data(), {2});
  all.broadcast(w, first_worker);
  PsAccess::global_step(model) = updates;
  PsAccess::stop_requested(model) = w.data<int64_t>()[1] != 0;
  std::string text = all.rank() == first_worker ? history_json(history) : std::string();
  all.broadcast(text, first_worker);
  history_from_json(history, text);
  timeline::discard();  // written at the fit's end; a later fit records over every rank again
  if (all_comm != comm) MPI_Comm_free(&all_comm);
  // A communicator with a lost rank is left to MPI_Finalize.
  if (lost.empty()) MPI_Comm_free(&comm);
  return history;
}

}  // namespace detail
}  // namespace tnt
