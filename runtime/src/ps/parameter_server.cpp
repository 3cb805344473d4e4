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

#include "comm/comm_state.hpp"
#include "core/clock.hpp"
#include "core/context.hpp"
#include "io/timeline.hpp"
#include "ps/server.hpp"
#include "ps/shards.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"

#include <mpi.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <list>
#include <map>
#include <mutex>
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
    for (auto& p : m.network_->named_parameters()) broadcast_on_host(comm, p.param->value, master_rank());
    for (auto& b : m.network_->named_buffers()) broadcast_on_host(comm, b.param->value, master_rank());
    m.weights_synced_ = true;
  }
  static void broadcast_on_host(Communicator& comm, Tensor& t, int root) {
    if (t.device().is_cpu()) {
      comm.broadcast(t, root);
      return;
    }
    Tensor host = t.to(Device::cpu());
    comm.broadcast(host, root);
    t.copy_from(host);
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

// ---------------------------------------------------------------------------------------
// The worker

class Worker final : public PsWorker {
 public:
  // global_step: the model's, set at every pull to the servers' update count (as the
  // global step variable of TensorFlow's parameter servers), so that max_steps and the
  // checkpoints' step count updates of the whole job.
  // stop_requested, max_steps: the model's, agreed at every epoch's end (see epoch_end).
  // on_lost: the ledger said that these workers (world ranks, all lost so far) are gone; the
  // workers' communicator must be made again without them before the epoch's collectives.
  Worker(Shards& shards, MPI_Comm comm, const std::vector<int>& servers, int64_t* global_step, bool* stop_requested,
         int64_t max_steps, std::function<void(const std::vector<int>&)> on_lost)
      : on_lost_(std::move(on_lost)),
        shards_(shards),
        comm_(comm),
        servers_(servers),
        global_step_(global_step),
        stop_requested_(stop_requested),
        max_steps_(max_steps),
        schedule_(&shards.optimizer().schedule()),
        described_(shards.optimizer().schedule().describe()),
        factor_(shards.optimizer().lr_factor()),
        floor_(shards.optimizer().lr_floor()) {
    for (size_t s = 0; s < servers_.size(); ++s) {
      outbox_.emplace_back(static_cast<size_t>(shards_.shard_elements(static_cast<int>(s))));
    }
    push_requests_.assign(servers_.size(), MPI_REQUEST_NULL);
  }

  ~Worker() override { stop_watch(); }

  // The watch thread (see the file's head), when workers are dropped at all and MPI allows
  // a second thread to call it. `workers`: the workers' communicator, cancelled on a loss.
  void start_watch(double timeout_s, Communicator& workers) {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (timeout_s <= 0 || level != MPI_THREAD_MULTIPLE) return;
    arm(workers);
    watch_ = std::thread([this, timeout_s] { watch(timeout_s); });
  }
  void stop_watch() {
    if (!watch_.joinable()) return;
    stop_ = true;
    watch_.join();
  }

  void pull() override { pull_from_servers(false); }

  void push() override {
    Span span(Lane::communication, "push");
    shards_.read_grads();
    wait_pushes();
    send_schedule_changes();
    for (size_t s = 0; s < servers_.size(); ++s) {
      outbox_[s] = shards_.gather(static_cast<int>(s), true);
      outbox_[s].push_back(static_cast<float>(epoch_));
      TNT_MPI_CHECK(MPI_Isend(outbox_[s].data(), static_cast<int>(outbox_[s].size()), MPI_FLOAT, servers_[s], kPush,
                              comm_, &push_requests_[s]));
    }
    ++clock_;
  }

  // The epoch's steps end only when the ledger says so: a worker that leaves them early
  // (max_steps, a callback's stop) says it is stopping, and waits for the others.
  void pause() override {
    while (!epoch_over_) ask_ledger(true);
  }

  NextBatch epoch_batches(NextBatch own, int64_t own_steps, std::function<NextBatch(int owner)> part) override {
    own_steps_ = own_steps;
    epoch_over_ = false;
    struct State {
      NextBatch current;
      int64_t left = -1;  // batches left of a granted part; -1: the own part, to its end
    };
    auto state = std::make_shared<State>();
    state->current = std::move(own);
    return [this, state, part = std::move(part)]() -> std::optional<Batch> {
      while (!epoch_over_) {
        if (state->left != 0) {
          std::optional<Batch> b = state->current();
          if (b) {
            if (state->left > 0) --state->left;
            return b;
          }
        }
        const std::optional<Part> grant = ask_ledger(false);
        if (!grant) break;
        state->current = part(static_cast<int>(grant->owner));
        for (int64_t i = 0; i < grant->first; ++i) {
          TNT_CHECK(state->current(), "parameter-server training: worker {}'s part has no batch {}", grant->owner, i);
        }
        state->left = grant->end - grant->first;
      }
      return std::nullopt;
    };
  }

  void epoch_end(Logs& logs) override {
    pull_from_servers(true);
    Communicator& workers = communicator();  // the workers' own during the fit
    // Workers stop on their own view (max_steps against the count their last pull saw, a
    // callback's request), so one may end its epoch early and another go on into the next
    // epoch, where the first would never join its collectives: they stop together here.
    // Run again after a loss: the stop request of the first try may be in already.
    if (!stop_seen_) stop_seen_ = *stop_requested_;
    const bool stop = stop_seen_ || (max_steps_ > 0 && *global_step_ >= max_steps_);
    *stop_requested_ = workers.allreduce_max(stop ? 1.0 : 0.0) > 0;
    const std::vector<double> sums = workers.allreduce_sum(std::vector<double>{lead_sum_, lead_count_});
    logs["staleness_mean"] = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    logs["staleness_max"] = workers.allreduce_max(lead_max_);
  }

  void end_epoch(const std::function<void()>& work) override {
    for (;;) {
      try {
        work();
        break;
      } catch (const CommError&) {
        const std::vector<int> gone = await_loss();
        if (gone.empty()) throw;
        tnt::log_warning("parameter-server training: worker rank(s) {} lost at the end of epoch {} of the fit (its "
                         "metrics or validation); the workers left do it again without them",
                         fmt::join(gone, ", "), epoch_);
        meet_survivors(gone);
        apply_lost(gone);
      }
    }
    stop_seen_ = false;
    lead_sum_ = lead_count_ = lead_max_ = 0;
    ++epoch_;
  }

  // The workers the first server dropped that the workers' communicator still holds
  // (world ranks): a collective on it may never end. Empty when there are none.
  std::vector<int> unapplied_loss() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int> out;
    for (int r : reported_) {
      if (!applied_.count(r)) out.push_back(r);
    }
    return out;
  }
  int64_t epoch() const { return epoch_; }

  // Returns the workers lost during the fit (world ranks), as the first server decided.
  std::vector<int> finish(int workers) {
    wait_pushes();
    send_schedule_changes();  // the last epoch's end may have changed it: the servers end alike
    const int64_t zero = 0;
    std::vector<MPI_Request> reqs(servers_.size() + 1);
    for (size_t s = 0; s < servers_.size(); ++s) {
      TNT_MPI_CHECK(MPI_Isend(&zero, 1, MPI_INT64_T, servers_[s], kDone, comm_, &reqs[s]));
    }
    std::vector<int64_t> final(static_cast<size_t>(workers) + 1);
    TNT_MPI_CHECK(MPI_Irecv(final.data(), static_cast<int>(final.size()), MPI_INT64_T, servers_[0], kFinal, comm_,
                            &reqs.back()));
    std::vector<int> peer = servers_;
    peer.push_back(servers_[0]);
    wait_servers(reqs, peer, "this worker's end of training");
    return {final.begin() + 1, final.begin() + 1 + final[0]};
  }

  // Best effort: the servers learn why this worker stops, and stop too.
  void abort(const std::string& message, bool input) noexcept {
    const std::string text = (input ? "I" : "E") + message;
    for (int server : servers_) {
      MPI_Request r;
      if (MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, server, kAbort, comm_, &r) == MPI_SUCCESS) {
        MPI_Request_free(&r);
      }
    }
  }

 private:
  // A callback's change of the learning rate on the workers (ReduceLROnPlateau's factor,
  // set_learning_rate's constant rate, as LearningRateScheduler does) reaches the servers,
  // which apply the optimizer, before the next push it applies to (messages from one worker
  // arrive in order). Every worker makes the same change (their callbacks see the same
  // global logs); the servers apply it as often as it comes.
  void send_schedule_changes() {
    const Optimizer& o = shards_.optimizer();
    // A new schedule object may reuse a freed one's address: its description tells them apart.
    const bool replaced = &o.schedule() != schedule_ || o.schedule().describe() != described_;
    if (!replaced && o.lr_factor() == factor_ && o.lr_floor() == floor_) return;
    schedule_ = &o.schedule();
    described_ = o.schedule().describe();
    factor_ = o.lr_factor();
    floor_ = o.lr_floor();
    // set_learning_rate folds the factor into the rate and sets it to 1: the rate is the
    // schedule's at any step.
    const double msg[4] = {replaced ? 1.0 : 0.0, replaced ? o.schedule().lr(0) : 0.0, factor_, floor_};
    std::vector<MPI_Request> reqs(servers_.size());
    for (size_t s = 0; s < servers_.size(); ++s) {
      TNT_MPI_CHECK(MPI_Isend(msg, 4, MPI_DOUBLE, servers_[s], kSchedule, comm_, &reqs[s]));
    }
    wait_servers(reqs, servers_, "this worker's learning-rate change");
  }

  void wait_pushes() { wait_servers(push_requests_, servers_, fmt::format("this worker's push of update {}", clock_)); }

  struct Part {
    int64_t owner = 0, first = 0, end = 0;
  };

  // The end of this worker's batches: the servers stop holding pulls back for it, and the
  // first server's ledger answers with a part of a lost worker's batches, or with the end
  // of the epoch (when every worker left has asked and nothing is left).
  std::optional<Part> ask_ledger(bool stopping) {
    std::vector<MPI_Request> reqs(servers_.size() + 2);
    for (size_t s = 0; s < servers_.size(); ++s) {
      TNT_MPI_CHECK(MPI_Isend(&epoch_, 1, MPI_INT64_T, servers_[s], kPause, comm_, &reqs[s]));
    }
    const int64_t ask[3] = {epoch_, stopping ? 1 : 0, own_steps_};
    TNT_MPI_CHECK(MPI_Isend(ask, 3, MPI_INT64_T, servers_[0], kLedger, comm_, &reqs[servers_.size()]));
    std::vector<int64_t> answer(static_cast<size_t>(size_of_world()) + 4);
    TNT_MPI_CHECK(MPI_Irecv(answer.data(), static_cast<int>(answer.size()), MPI_INT64_T, servers_[0], kPart, comm_,
                            &reqs.back()));
    std::vector<int> peer = servers_;
    peer.insert(peer.end(), 2, servers_[0]);
    wait_servers(reqs, peer, fmt::format("this worker's end of epoch {} of the fit", epoch_));
    if (answer[0] == 1) return Part{answer[1], answer[2], answer[3]};
    epoch_over_ = true;
    std::vector<int> lost(answer.begin() + 2, answer.begin() + 2 + answer[1]);
    if (lost != lost_) apply_lost(lost);
    return std::nullopt;
  }

  // The workers' communicator made again without `lost` (with those lost before).
  void apply_lost(const std::vector<int>& lost) {
    std::set<int> all(lost_.begin(), lost_.end());
    all.insert(lost.begin(), lost.end());
    lost_.assign(all.begin(), all.end());
    on_lost_(lost_);
    std::lock_guard<std::mutex> lock(mutex_);
    applied_ = all;
    bool pending = false;
    for (int r : reported_) pending = pending || !applied_.count(r);
    cancel_ = pending;
    if (watch_.joinable()) arm(communicator());
  }

  void arm(Communicator& workers) { detail::impl_of(workers).cancel = &cancel_; }

  // Before the workers left make a communicator (MPI_Comm_create_group, which waits without
  // a limit): each tells the others it is here for this epoch. One that does not come has
  // finished the collective the lost worker died halfway through, and went on: an error
  // naming it after TNT_COLLECTIVE_TIMEOUT, not a hang.
  void meet_survivors(const std::vector<int>& gone) {
    int me = 0, world = 0;
    MPI_Comm_rank(comm_, &me);
    MPI_Comm_size(comm_, &world);
    std::vector<int> others;
    for (int r = 0; r < world; ++r) {
      const bool out = r == me || std::binary_search(servers_.begin(), servers_.end(), r) ||
                       std::find(gone.begin(), gone.end(), r) != gone.end() ||
                       std::find(lost_.begin(), lost_.end(), r) != lost_.end();
      if (!out) others.push_back(r);
    }
    std::vector<int64_t> epochs(others.size());
    std::vector<MPI_Request> reqs(2 * others.size());
    for (size_t i = 0; i < others.size(); ++i) {
      TNT_MPI_CHECK(MPI_Isend(&epoch_, 1, MPI_INT64_T, others[i], kRedo, comm_, &reqs[2 * i]));
      TNT_MPI_CHECK(MPI_Irecv(&epochs[i], 1, MPI_INT64_T, others[i], kRedo, comm_, &reqs[2 * i + 1]));
    }
    const double limit = config().collective_timeout_s;
    const double start = detail::now_s();
    for (;;) {
      int done = 0;
      TNT_MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
      if (done) break;
      if (limit > 0 && detail::now_s() - start > limit) {
        std::vector<int> silent;
        for (size_t i = 0; i < others.size(); ++i) {
          if (reqs[2 * i + 1] != MPI_REQUEST_NULL) silent.push_back(others[i]);
        }
        throw CommError(fmt::format(
            "parameter-server training: worker rank(s) {} lost at the end of epoch {} of the fit, and worker rank(s) "
            "{} did not come to do it again without them within {} s (TNT_COLLECTIVE_TIMEOUT): they finished the "
            "collective it died in and went on",
            fmt::join(gone, ", "), epoch_, fmt::join(silent, ", "), limit));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (size_t i = 0; i < others.size(); ++i) {
      TNT_CHECK(epochs[i] == epoch_,
                "parameter-server training: worker rank {} redoes the end of epoch {} of the fit, this one of epoch {}",
                others[i], epochs[i], epoch_);
    }
  }

  // After a collective failed: the loss the first server reported, waiting for its word as
  // long as it may take to decide (a collective may fail on the loss before it is named).
  std::vector<int> await_loss() {
    if (!watch_.joinable()) return {};
    const double until = detail::now_s() + 2 * config().ps_worker_timeout_s + 1;
    for (;;) {
      if (std::vector<int> gone = unapplied_loss(); !gone.empty() || detail::now_s() > until) return gone;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // The watch thread: beats to the first server four times per timeout, and takes its
  // word on lost workers. Its MPI calls are its own (MPI_THREAD_MULTIPLE); it ends with the
  // fit, a send still pending freed (the first server receives it or is gone).
  void watch(double timeout_s) {
    const double interval = timeout_s / 4;
    static const int64_t zero = 0;  // outlives a send freed at the end
    MPI_Request beat = MPI_REQUEST_NULL;
    double next = 0;
    int me = 0;
    MPI_Comm_rank(comm_, &me);
    while (!stop_) {
      const double now = detail::now_s();
      int flag = 0;
      if (beat != MPI_REQUEST_NULL) MPI_Test(&beat, &flag, MPI_STATUS_IGNORE);
      if (now >= next && beat == MPI_REQUEST_NULL) {
        MPI_Isend(&zero, 1, MPI_INT64_T, servers_[0], kBeat, comm_, &beat);
        next = now + interval;
      }
      MPI_Status st;
      flag = 0;
      MPI_Iprobe(servers_[0], kGone, comm_, &flag, &st);
      if (flag) {
        int count = 0;
        MPI_Get_count(&st, MPI_INT64_T, &count);
        std::vector<int64_t> gone(static_cast<size_t>(count));
        MPI_Recv(gone.data(), count, MPI_INT64_T, servers_[0], kGone, comm_, MPI_STATUS_IGNORE);
        if (std::find(gone.begin(), gone.end(), me) != gone.end()) {
          // Stopped (or hung) past the timeout and now running again: its part is the
          // others' now, and the servers ignore it. It ends as a lost worker does (a signal:
          // the launcher then lets the job go on) before it trains or writes anything.
          std::fprintf(stderr,
                       "warning: parameter-server training: worker rank %d was dropped while it was silent (stopped "
                       "or hung for TNT_PS_WORKER_TIMEOUT); the others went on without it, and it ends now\n",
                       me);
          std::fflush(stderr);
          ::raise(SIGKILL);
        }
        std::lock_guard<std::mutex> lock(mutex_);
        for (int64_t r : gone) {
          reported_.insert(static_cast<int>(r));
          if (!applied_.count(static_cast<int>(r))) cancel_ = true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (beat != MPI_REQUEST_NULL) MPI_Request_free(&beat);
  }

  static int size_of_world() {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }

  void pull_from_servers(bool with_state) {
    Span span(Lane::communication, with_state ? "pull with optimizer state" : "pull");
    const size_t k = servers_.size();
    const int64_t request[4] = {clock_, with_state ? 1 : 0, epoch_, own_steps_};
    std::vector<std::vector<float>> values(k), state(k);
    std::vector<std::vector<int64_t>> steps(k);
    std::vector<MPI_Request> reqs;
    std::vector<int> peer;
    for (size_t s = 0; s < k; ++s) {
      const int si = static_cast<int>(s);
      peer.insert(peer.end(), with_state ? 4 : 2, servers_[s]);
      reqs.emplace_back();
      TNT_MPI_CHECK(MPI_Isend(request, 4, MPI_INT64_T, servers_[s], kPull, comm_, &reqs.back()));
      values[s].resize(static_cast<size_t>(shards_.shard_elements(si)) + 3);
      reqs.emplace_back();
      TNT_MPI_CHECK(MPI_Irecv(values[s].data(), static_cast<int>(values[s].size()), MPI_FLOAT, servers_[s], kValues,
                              comm_, &reqs.back()));
      if (with_state) {
        state[s].resize(values[s].size() * shards_.slots());
        steps[s].resize(shards_.pieces_of_count(si) + 1);
        reqs.emplace_back();
        TNT_MPI_CHECK(MPI_Irecv(state[s].data(), static_cast<int>(state[s].size()), MPI_FLOAT, servers_[s], kState,
                                comm_, &reqs.back()));
        reqs.emplace_back();
        TNT_MPI_CHECK(MPI_Irecv(steps[s].data(), static_cast<int>(steps[s].size()), MPI_INT64_T, servers_[s],
                                kStateSteps, comm_, &reqs.back()));
      }
    }
    wait_servers(reqs, peer, fmt::format("this worker's pull after update {}", clock_));
    double lead = 0;
    for (size_t s = 0; s < k; ++s) {
      shards_.scatter(static_cast<int>(s), values[s].data(), false);
      const size_t n = values[s].size();
      lead = std::max(lead, static_cast<double>(values[s][n - 3]));
      if (s == 0) {
        *global_step_ = (static_cast<int64_t>(values[s][n - 2]) << 24) + static_cast<int64_t>(values[s][n - 1]);
      }
    }
    shards_.write_values();
    if (!with_state) {
      lead_sum_ += lead;
      lead_count_ += 1;
      lead_max_ = std::max(lead_max_, lead);
    }
    if (with_state) {
      for (size_t s = 0; s < k; ++s) shards_.scatter_state(static_cast<int>(s), state[s].data(), steps[s].data());
      shards_.write_state(steps[0].back());
    }
  }

  std::function<void(const std::vector<int>&)> on_lost_;
  std::vector<int> lost_;   // as the ledger or the first server's kGone last said, applied
  bool stop_seen_ = false;  // a stop request of this epoch, before epoch_end's agreement
  // The watch thread and what it shares with the fit's thread (under mutex_).
  std::thread watch_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> cancel_{false};  // the workers' communicator's: a loss not applied yet
  std::mutex mutex_;
  std::set<int> reported_, applied_;  // world ranks: named lost by the first server; not in the communicator
  bool epoch_over_ = true;  // the ledger ended this epoch's steps
  int64_t own_steps_ = -1;  // batches of this worker's own part of an epoch
  Shards& shards_;
  MPI_Comm comm_;
  std::vector<int> servers_;
  int64_t* global_step_;
  bool* stop_requested_;
  int64_t max_steps_;
  const LearningRateSchedule* schedule_;  // the optimizer's, as last told to the servers
  std::string described_;
  double factor_, floor_;
  int64_t clock_ = 0;  // pushes sent
  int64_t epoch_ = 0;  // epochs this fit has ended (epoch_end)
  double lead_sum_ = 0, lead_count_ = 0, lead_max_ = 0;  // this epoch's pulls
  std::vector<std::vector<float>> outbox_;
  std::vector<MPI_Request> push_requests_;
};

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
    lost = ps::serve(shards, comm, index, workers, servers, options.max_staleness, *worker_comm, processes);
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
    Worker worker(shards, comm, servers, &PsAccess::global_step(model), &PsAccess::stop_requested(model),
                  options.max_steps, on_lost);
    worker.start_watch(config().ps_worker_timeout_s, communicator());
    options.strategy = Strategy::synchronous;  // the loop is the ordinary one, over the workers
    PsAccess::set_worker(model, &worker);
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
  for (auto& b : PsAccess::network(model).named_buffers()) PsAccess::broadcast_on_host(all, b.param->value, first_worker);
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
