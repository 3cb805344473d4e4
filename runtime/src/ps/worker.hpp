// A worker's side of parameter-server training (ps/parameter_server.hpp has the idea): its
// pulls and pushes, its part of the sample ledger, and the watch thread that finds a worker
// lost at an epoch's end. Used by ps/parameter_server.cpp only.
#pragma once

#include "comm/comm_state.hpp"
#include "core/clock.hpp"
#include "core/context.hpp"
#include "io/timeline.hpp"
#include "ps/shards.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"
#include "train/ps_worker.hpp"

#include <mpi.h>
#include <fmt/ranges.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tnt::ps {


class Worker final : public detail::PsWorker {
  using Lane = timeline::Lane;
  using Span = timeline::Span;
  using NextBatch = detail::NextBatch;

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

  double job_rate(double own_samples_per_second) override {
    return communicator().allreduce_sum(std::vector<double>{own_samples_per_second})[0];
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

}  // namespace tnt::ps
