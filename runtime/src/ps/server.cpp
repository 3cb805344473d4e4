// The server loop of parameter-server training: answers any worker's message as it comes,
// holds back a pull that max_staleness does not allow yet, never waits for one worker.
//
// Lost workers. The first server keeps the epoch's sample ledger: every worker trains its
// own part of the epoch (the dataset's static distribution, `own steps` batches), then asks
// the ledger for more. A worker that sends nothing for TNT_PS_WORKER_TIMEOUT while it is
// expected to (it is stepping, or another worker already waits at the epoch's end) is
// dropped: the batches of its part that no push of it has covered (pushes of one worker
// arrive in order, so the count of its pushes in the epoch says exactly which) go to the
// pool, and the workers that ask get them in chunks. The epoch ends when every worker left
// waits and the pool is empty; the answer names the lost workers, so the survivors can make
// a communicator without them. In the next epochs a lost worker's whole part goes to the
// pool. Only the first server decides; it tells the others (kLost), and at the end every
// rank (kFinal), so that every rank agrees on who is lost.
//
// Between epochs (metrics, validation, callbacks) the workers run collectives that one lost
// worker blocks, and send the servers nothing but their watch threads' beats (kBeat). A
// worker whose beats stop for TNT_PS_WORKER_TIMEOUT is dropped as above, and the workers
// left are told at once (kGone): they leave the blocked collective (PsWorker::end_epoch).
#include "ps/server.hpp"

#include "ps/ledger.hpp"

#include "core/clock.hpp"
#include "core/context.hpp"
#include "io/timeline.hpp"
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
#include <cstdio>
#include <list>
#include <map>
#include <set>
#include <limits>
#include <thread>

namespace tnt::ps {
namespace {
using timeline::Lane;
using Span = timeline::Span;

class Server {
 public:
  Server(Shards& shards, MPI_Comm comm, int index, const std::vector<int>& workers, const std::vector<int>& server_ranks,
         std::optional<int64_t> staleness, const std::vector<Process>& processes, int64_t steps_before)
      : steps_before_(steps_before),
        processes_(processes),
        shards_(shards),
        comm_(comm),
        index_(index),
        workers_(workers),
        server_ranks_(server_ranks),
        staleness_(staleness),
        timeout_(config().ps_worker_timeout_s),
        ledger_(workers.size()) {
    for (size_t i = 0; i < workers_.size(); ++i) worker_index_[workers_[i]] = static_cast<int>(i);
    const size_t n = workers_.size();
    pushes_.assign(n, 0);
    in_round_.assign(n, false);
    done_.assign(n, false);
    paused_.assign(n, -1);
    lost_.assign(n, false);
    stepping_.assign(n, false);
    last_heard_.assign(n, detail::now_s());
    last_beat_.assign(n, -1.0);
    std::set<int> owned;
    for (int i : shards_.plan().pieces_of(index_)) owned.insert(shards_.plan().pieces[static_cast<size_t>(i)].variable);
    for (int v : owned) {
      owned_.push_back(shards_.vars()[static_cast<size_t>(v)]);
      owned_index_.push_back(v);
    }
    accum_.assign(static_cast<size_t>(shards_.shard_elements(index_)), 0.0f);
    shards_.read_values();
    shards_.read_state();
  }

  // servers: the servers' own communicator (for their timeline).
  void run(Communicator& servers) {
    // With a timeline, the servers' apply spans go to a trace of their own beside the
    // workers' ("trace.json" -> "trace.servers.json"), its window counting updates.
    std::string path = config().timeline;
    if (!path.empty()) {
      const bool json = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
      path = json ? path.substr(0, path.size() - 5) + ".servers.json" : path + ".servers";
      timeline::start_from_config(servers, path);
    }
    int idle = 0;
    double checked = 0;
    while (!finished()) {
      progress_sends();
      if (first() && timeout_ > 0 && detail::now_s() - checked > 0.05) {
        checked = detail::now_s();
        check_silence(checked);
      }
      progress_incoming();
      MPI_Status st;
      if (!probe(st)) {
        // Nothing to do: yield the core to the workers (ranks often share cores) after a
        // short spin, so a busy server still answers within microseconds.
        if (++idle > 200 && incoming_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      idle = 0;
      handle(st);
      progress_incoming();  // a push just posted often completes at once
      answer_pulls();
    }
    if (first()) {
      TNT_CHECK(std::count(lost_.begin(), lost_.end(), true) < static_cast<long>(lost_.size()),
                "parameter-server training: every worker was lost (none sent anything for {} s, "
                "TNT_PS_WORKER_TIMEOUT); nothing is left to train",
                timeout_);
      // Every other rank learns the final list of the lost (a worker waits for it after its
      // last message, a server before it ends).
      std::vector<int64_t> final{static_cast<int64_t>(lost_ranks().size())};
      for (int r : lost_ranks()) final.push_back(r);
      for (size_t w = 0; w < workers_.size(); ++w) {
        if (!lost_[w]) send_ints(final, workers_[w], kFinal);
      }
      for (size_t s = 1; s < server_ranks_.size(); ++s) send_ints(final, server_ranks_[s], kFinal);
    }
    for (auto& o : outgoing_) {
      const bool lost = is_lost_rank(o.dest);
      if (!lost && !o.may_stay_unread) {
        TNT_MPI_CHECK(MPI_Wait(&o.request, MPI_STATUS_IGNORE));
        continue;
      }
      // A reply to a lost worker (read only if it was just stopped), or a kGone that crossed
      // the worker's kDone (its watch thread has ended), may never complete: left to MPI,
      // its buffer kept (a few bytes, never freed).
      int done = 0;
      MPI_Test(&o.request, &done, MPI_STATUS_IGNORE);
      if (done) continue;
      auto* kept = new Outgoing(std::move(o));
      if (!lost) MPI_Request_free(&kept->request);
    }
    outgoing_.clear();
    shards_.read_state();
    timeline::fit_end(servers);
  }

  std::vector<int> lost_ranks() const {
    std::vector<int> out;
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (lost_[w]) out.push_back(workers_[w]);
    }
    return out;
  }

 private:
  struct Outgoing {
    std::vector<float> floats;
    std::vector<int64_t> ints;
    int dest = -1;
    MPI_Request request = MPI_REQUEST_NULL;
    bool may_stay_unread = false;  // a kGone: the worker may be done before it reads it
  };
  bool first() const { return index_ == 0; }
  bool is_lost_rank(int rank) const {
    auto it = worker_index_.find(rank);
    return it != worker_index_.end() && lost_[static_cast<size_t>(it->second)];
  }
  // The first server ends when every worker is done or lost; the others when it says so
  // (kFinal) and every worker it did not drop is done.
  bool finished() const {
    const bool all = std::count(done_.begin(), done_.end(), true) == static_cast<long>(done_.size());
    return first() ? all : final_ && all;
  }
  struct Held {
    int source = 0;
    int64_t clock = 0;
    bool with_state = false;
    int64_t epoch = 0;
  };

  int worker_of(int source) const {
    auto it = worker_index_.find(source);
    TNT_CHECK(it != worker_index_.end(), "parameter server {}: a message from rank {}, which is no worker", index_,
              source);
    return it->second;
  }

  void handle(const MPI_Status& st) {
    int count = 0;
    if (st.MPI_TAG == kLost || st.MPI_TAG == kFinal) {  // from the first server
      MPI_Get_count(&st, MPI_INT64_T, &count);
      std::vector<int64_t> msg(static_cast<size_t>(count));
      TNT_MPI_CHECK(MPI_Recv(msg.data(), count, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, comm_, MPI_STATUS_IGNORE));
      if (st.MPI_TAG == kFinal) final_ = true;
      for (size_t i = st.MPI_TAG == kFinal ? 1 : 0; i < msg.size(); ++i) drop(worker_of(static_cast<int>(msg[i])));
      return;
    }
    const int w = worker_of(st.MPI_SOURCE);
    const auto wi = static_cast<size_t>(w);
    // A dropped worker is never probed again (probe()): if it was only stopped and still
    // sends, its part is someone else's now, and it ends at its own timeout, unanswered.
    // A beat comes from the worker's watch thread, not from its training: it does not
    // count as the worker's sign of life while it is expected to step.
    if (st.MPI_TAG != kBeat) last_heard_[wi] = detail::now_s();
    switch (st.MPI_TAG) {
      case kPull: {
        int64_t msg[4] = {0, 0, 0, -1};
        TNT_MPI_CHECK(MPI_Recv(msg, 4, MPI_INT64_T, st.MPI_SOURCE, kPull, comm_, MPI_STATUS_IGNORE));
        held_.push_back({st.MPI_SOURCE, msg[0], msg[1] != 0, msg[2]});
        if (msg[1] == 0) stepping_[wi] = true;
        if (first()) ledger_.learn_steps(msg[3]);
        break;
      }
      case kPush: {
        // Received without blocking: a worker that dies while its push travels (over TCP)
        // leaves a receive that never completes. Until it does, nothing else of that worker
        // is probed (its messages are handled in order); the push counts when it arrives.
        Incoming& in = incoming_[w];
        in.grad = pool_.take();
        in.grad.resize(accum_.size() + 1);  // every element is received
        TNT_MPI_CHECK(MPI_Irecv(in.grad.data(), static_cast<int>(in.grad.size()), MPI_FLOAT, st.MPI_SOURCE, kPush,
                                comm_, &in.request));
        break;
      }
      case kDone: {
        int64_t zero = 0;
        TNT_MPI_CHECK(MPI_Recv(&zero, 1, MPI_INT64_T, st.MPI_SOURCE, kDone, comm_, MPI_STATUS_IGNORE));
        done_[wi] = true;
        stepping_[wi] = false;
        if (first_waiting_ < 0) first_waiting_ = detail::now_s();
        if (staleness_ && *staleness_ == 0) apply_complete_rounds();
        break;
      }
      case kLedger: {
        int64_t msg[3] = {0, 0, -1};
        TNT_MPI_CHECK(MPI_Recv(msg, 3, MPI_INT64_T, st.MPI_SOURCE, kLedger, comm_, MPI_STATUS_IGNORE));
        TNT_CHECK(first(), "parameter server {}: a ledger request from rank {}; only the first server keeps it", index_,
                  st.MPI_SOURCE);
        TNT_CHECK(msg[0] == ledger_.epoch(),
                  "parameter server: worker rank {} ended epoch {} of the fit, the ledger is at {}", st.MPI_SOURCE,
                  msg[0], ledger_.epoch());
        ledger_.learn_steps(msg[2]);
        ledger_.ask(wi, msg[1] != 0);
        stepping_[wi] = false;
        if (first_waiting_ < 0) first_waiting_ = detail::now_s();
        serve_ledger();
        break;
      }
      case kSchedule: {
        double msg[4] = {0, 0, 1, 0};
        TNT_MPI_CHECK(MPI_Recv(msg, 4, MPI_DOUBLE, st.MPI_SOURCE, kSchedule, comm_, MPI_STATUS_IGNORE));
        Optimizer& o = shards_.optimizer();
        if (msg[0] != 0) o.set_learning_rate(msg[1]);
        o.set_lr_factor(msg[2], msg[3]);
        break;
      }
      case kBeat: {
        int64_t zero = 0;
        TNT_MPI_CHECK(MPI_Recv(&zero, 1, MPI_INT64_T, st.MPI_SOURCE, kBeat, comm_, MPI_STATUS_IGNORE));
        last_beat_[wi] = detail::now_s();
        break;
      }
      case kPause: {
        int64_t epoch = 0;
        TNT_MPI_CHECK(MPI_Recv(&epoch, 1, MPI_INT64_T, st.MPI_SOURCE, kPause, comm_, MPI_STATUS_IGNORE));
        paused_[static_cast<size_t>(w)] = epoch;
        if (staleness_ && *staleness_ == 0) apply_complete_rounds();
        break;
      }
      case kAbort: {
        MPI_Get_count(&st, MPI_CHAR, &count);
        std::string text(static_cast<size_t>(count), '\0');
        TNT_MPI_CHECK(MPI_Recv(text.data(), count, MPI_CHAR, st.MPI_SOURCE, kAbort, comm_, MPI_STATUS_IGNORE));
        const bool input = !text.empty() && text[0] == 'I';
        const std::string message = text.size() > 1 ? text.substr(1) : "";
        if (input) TNT_INPUT_ERROR("{}", message);
        TNT_THROW("parameter server: worker rank {} failed: {}", st.MPI_SOURCE, message);
      }
      default:
        TNT_THROW("parameter server: unexpected message tag {} from rank {}", st.MPI_TAG, st.MPI_SOURCE);
    }
  }

  // Worker w is gone: it counts as done from now on (no pull waits for it, no round needs
  // its push), and what it had not pushed of this epoch goes to the pool.
  void drop(int w) {
    const auto wi = static_cast<size_t>(w);
    if (lost_[wi]) return;
    lost_[wi] = true;
    done_[wi] = true;
    // A push of it still being received may never complete: its buffer is kept for MPI.
    if (auto it = incoming_.find(w); it != incoming_.end()) {
      abandoned_.push_back(std::move(it->second));
      incoming_.erase(it);
    }
    held_.remove_if([&](const Held& h) { return h.source == workers_[wi]; });
    if (staleness_ && *staleness_ == 0) apply_complete_rounds();
  }

  void lose(int w, const std::string& why) {
    const auto wi = static_cast<size_t>(w);
    if (lost_[wi] || done_[wi]) return;
    drop(w);
    const int64_t left = ledger_.lose(wi);
    std::fprintf(stderr,
                 "warning: parameter-server training: worker rank %d dropped in epoch %lld of the fit (%s); the other "
                 "workers take over its %lld batch(es) left\n",
                 workers_[wi], static_cast<long long>(ledger_.epoch()), why.c_str(), static_cast<long long>(left));
    std::fflush(stderr);
    for (size_t s = 1; s < server_ranks_.size(); ++s) send_ints({workers_[wi]}, server_ranks_[s], kLost);
    // The workers left may be blocked in a collective with it (the epoch's end): they learn
    // now, not at the ledger's next answer. A worker that is done needs no word. The lost
    // one is told too: if it was only stopped and runs again, its watch thread ends it.
    for (size_t o = 0; o < workers_.size(); ++o) {
      if ((o == wi || (!lost_[o] && !done_[o])) && last_beat_[o] >= 0) {
        std::vector<int64_t> gone;
        for (int r : lost_ranks()) gone.push_back(r);
        send_ints(std::move(gone), workers_[o], kGone);
        outgoing_.back().may_stay_unread = true;
      }
    }
    end_if_here(workers_[wi]);
    serve_ledger();
    answer_pulls();
  }

  // A dropped worker still there (stopped, hung) holds the job's end (mpirun waits for it):
  // on this host it is ended here (SIGKILL: the launcher counts it as a lost worker, the job
  // goes on); elsewhere its watch thread ends it if it runs again.
  void end_if_here(int rank) {
    int me = 0;
    MPI_Comm_rank(comm_, &me);
    if (processes_.size() > static_cast<size_t>(std::max(rank, me))) {
      end_dropped_worker(rank, processes_[static_cast<size_t>(rank)], processes_[static_cast<size_t>(me)]);
    }
  }

  // A worker is expected to send while it steps (a push per batch), and once another
  // worker has ended the epoch (it should end its too). A worker whose pull is held here
  // waits for the server, not the other way round.
  void check_silence(double now) {
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (lost_[w] || done_[w] || ledger_.waiting(w)) continue;
      const bool held = std::any_of(held_.begin(), held_.end(), [&](const Held& h) { return h.source == workers_[w]; });
      if (held) continue;
      if (!stepping_[w] && first_waiting_ < 0) {
        // Between epochs (the epoch's metrics, validation, callbacks): its beats count. A
        // worker without a watch thread (no MPI_THREAD_MULTIPLE) is not judged here.
        if (last_beat_[w] < 0) continue;
        const double since = std::max(last_heard_[w], last_beat_[w]);
        if (now - since > timeout_) {
          const std::string where = ledger_.epoch() == 0
                                        ? std::string("before the first epoch's steps")
                                        : fmt::format("after the steps of epoch {}: in its metrics, validation or "
                                                      "callbacks",
                                                      ledger_.epoch() - 1);
          lose(static_cast<int>(w), fmt::format("no heartbeat from it for {:.1f} s {}; TNT_PS_WORKER_TIMEOUT={} s",
                                                now - since, where, timeout_));
        }
        continue;
      }
      const double since = stepping_[w] ? last_heard_[w] : std::max(last_heard_[w], first_waiting_);
      if (now - since > timeout_) {
        lose(static_cast<int>(w), fmt::format("nothing from it for {:.1f} s, TNT_PS_WORKER_TIMEOUT={} s", now - since,
                                              timeout_));
      }
    }
  }

  // The ledger's parts for waiting workers, or the end of the epoch (with the lost workers'
  // ranks, so that the ones left can make a communicator without them).
  void serve_ledger() {
    std::vector<bool> gone(workers_.size());
    for (size_t w = 0; w < workers_.size(); ++w) gone[w] = lost_[w] || done_[w];
    bool over = false;
    for (const Ledger::Answer& a : ledger_.serve(gone)) {
      if (a.part) {
        stepping_[a.worker] = true;
        last_heard_[a.worker] = detail::now_s();
        send_ints({1, a.part->owner, a.part->first, a.part->end}, workers_[a.worker], kPart);
        continue;
      }
      std::vector<int64_t> msg{0, static_cast<int64_t>(lost_ranks().size())};
      for (int r : lost_ranks()) msg.push_back(r);
      send_ints(std::move(msg), workers_[a.worker], kPart);
      over = true;
    }
    if (!over) return;
    std::fill(stepping_.begin(), stepping_.end(), false);
    first_waiting_ = -1;
  }

  // The pushes being received: applied as they complete; a failed one (its sender died
  // halfway) never happened, and its sender is lost.
  void progress_incoming() {
    for (auto it = incoming_.begin(); it != incoming_.end();) {
      int done = 0;
      const int w = it->first;
      if (MPI_Test(&it->second.request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        it = incoming_.erase(it);
        if (first()) lose(w, "its last push could not be received");
        continue;
      }
      if (!done) {
        ++it;
        continue;
      }
      std::vector<float> grad = std::move(it->second.grad);
      it = incoming_.erase(it);
      take_push(w, grad);
      pool_.give(std::move(grad));
      answer_pulls();
    }
  }

  void take_push(int w, std::vector<float>& grad) {
    const auto wi = static_cast<size_t>(w);
    last_heard_[wi] = detail::now_s();
    round_epoch_ = static_cast<int64_t>(grad.back());
    grad.pop_back();
    ++pushes_[wi];
    stepping_[wi] = true;
    ledger_.count_push(wi, round_epoch_);
    paused_[wi] = -1;
    if (staleness_ && *staleness_ == 0) {
      TNT_CHECK(!in_round_[wi], "parameter server: worker rank {} pushed twice in one round", workers_[wi]);
      in_round_[wi] = true;
      for (size_t i = 0; i < grad.size(); ++i) accum_[i] += grad[i];
      apply_complete_rounds();
    } else {
      apply(grad.data());
    }
  }

  // One message from a source that may send now: every worker that is not lost and has no
  // push being received, and the first server (to the others). Returns false if none.
  bool probe(MPI_Status& st) {
    const size_t n = workers_.size();
    for (size_t k = 0; k <= n; ++k) {
      const size_t i = (next_probe_ + k) % (n + 1);
      int source = -1;
      if (i < n) {
        if (lost_[i] || incoming_.count(static_cast<int>(i)) > 0) continue;
        source = workers_[i];
      } else {
        if (first()) continue;
        source = server_ranks_[0];
      }
      int flag = 0;
      TNT_MPI_CHECK(MPI_Iprobe(source, MPI_ANY_TAG, comm_, &flag, &st));
      if (flag) {
        next_probe_ = (i + 1) % (n + 1);  // the next probe starts after it: no source starves
        return true;
      }
    }
    return false;
  }

  void apply(const float* grad) {
    timeline::step_begin(steps_before_ + applied_ + 1, 0, detail::now_s());
    Span span(Lane::compute, "apply", [&] { return fmt::format(R"("update":{})", steps_before_ + applied_ + 1); });
    shards_.apply(index_, grad, owned_, owned_index_);
    ++applied_;
  }

  // Staleness 0: a step's round is complete when every worker has pushed it or is done.
  // A round is the pushes since the last update, at most one per worker (its next pull
  // waits for the update). Counting rounds by each worker's pushes would not do: a worker
  // that waits at the ledger misses rounds that the others complete without it.
  void apply_complete_rounds() {
    bool any = false, all = true;
    for (size_t w = 0; w < in_round_.size(); ++w) {
      if (in_round_[w]) {
        any = true;
      } else if (!done_[w] && paused_[w] < round_epoch_) {
        all = false;  // a worker that left this round's epoch early pushes nothing more in it
      }
    }
    if (!any || !all) return;
    apply(accum_.data());
    std::fill(accum_.begin(), accum_.end(), 0.0f);
    std::fill(in_round_.begin(), in_round_.end(), false);
  }

  // How many updates the puller is ahead of the slowest worker still stepping (0 alone).
  int64_t lead(const Held& h) const {
    int64_t slowest = std::numeric_limits<int64_t>::max();
    for (size_t w = 0; w < pushes_.size(); ++w) {
      if (!done_[w] && paused_[w] < h.epoch) slowest = std::min(slowest, pushes_[w]);
    }
    return slowest == std::numeric_limits<int64_t>::max() ? 0 : std::max<int64_t>(0, h.clock - slowest);
  }

  bool may_answer(const Held& h) const {
    if (!staleness_) return true;
    if (*staleness_ == 0) return !in_round_[static_cast<size_t>(worker_of(h.source))];
    return lead(h) <= *staleness_;
  }

  void answer_pulls() {
    for (auto it = held_.begin(); it != held_.end();) {
      if (!may_answer(*it)) {
        ++it;
        continue;
      }
      std::vector<float> values = shards_.gather(index_, false, pool_.take());
      values.push_back(static_cast<float>(lead(*it)));  // exact below 2^24 updates
      // The optimizer's step count, the job's global step, as two exact halves.
      const int64_t step = shards_.step_count();
      values.push_back(static_cast<float>(step >> 24));
      values.push_back(static_cast<float>(step & 0xffffff));
      send_floats(std::move(values), it->source, kValues);
      if (it->with_state) {
        shards_.read_state();
        auto [floats, ints] = shards_.gather_state(index_);
        send_floats(std::move(floats), it->source, kState);
        send_ints(std::move(ints), it->source, kStateSteps);
      }
      // A held pull is the server's wait, not the worker's silence: its clock starts now.
      last_heard_[static_cast<size_t>(worker_of(it->source))] = detail::now_s();
      it = held_.erase(it);
    }
  }

  void send_floats(std::vector<float> data, int dest, int tag) {
    Outgoing& o = outgoing_.emplace_back();
    o.dest = dest;
    o.floats = std::move(data);
    TNT_MPI_CHECK(
        MPI_Isend(o.floats.data(), static_cast<int>(o.floats.size()), MPI_FLOAT, dest, tag, comm_, &o.request));
  }
  void send_ints(std::vector<int64_t> data, int dest, int tag) {
    Outgoing& o = outgoing_.emplace_back();
    o.dest = dest;
    o.ints = std::move(data);
    TNT_MPI_CHECK(MPI_Isend(o.ints.data(), static_cast<int>(o.ints.size()), MPI_INT64_T, dest, tag, comm_, &o.request));
  }
  void progress_sends() {
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      int done = 0;
      TNT_MPI_CHECK(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
      if (done) pool_.give(std::move(it->floats));
      it = done ? outgoing_.erase(it) : std::next(it);
    }
  }

  int64_t steps_before_;  // the model's steps when this fit began: the timeline's numbers go on
  std::vector<Process> processes_;  // by rank of comm_
  Shards& shards_;
  MPI_Comm comm_;
  int index_;
  std::vector<int> workers_;
  std::vector<int> server_ranks_;
  std::map<int, int> worker_index_;  // world rank -> worker index
  std::optional<int64_t> staleness_;
  double timeout_;  // TNT_PS_WORKER_TIMEOUT; 0: no worker is ever dropped
  // Lost workers (decided by the first server, told to the others) and the first server's
  // view of who should be sending; see the file's head.
  std::vector<bool> lost_, stepping_;
  std::vector<double> last_heard_;
  std::vector<double> last_beat_;  // the worker's last kBeat; -1: none yet (it has no watch thread)
  bool final_ = false;  // the first server said the fit is over (kFinal)
  Ledger ledger_;  // the first server's (ps/ledger.hpp)
  double first_waiting_ = -1;  // when the first worker of the epoch reached the ledger (or ended)
  std::vector<int64_t> pushes_;
  std::vector<bool> in_round_;  // staleness 0: the worker's push is in accum_, not applied yet
  std::vector<bool> done_;
  std::vector<int64_t> paused_;  // the epoch whose steps a worker left (kPause) until its next push; -1
  int64_t round_epoch_ = 0;      // the epoch of the pushes being summed (staleness 0)
  int64_t applied_ = 0;
  std::vector<float> accum_;
  std::vector<NamedParameter> owned_;
  std::vector<int> owned_index_;
  std::list<Held> held_;
  struct Incoming {
    std::vector<float> grad;  // the shard's gradient, then the worker's epoch
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::map<int, Incoming> incoming_;  // by worker index
  std::list<Incoming> abandoned_;     // of lost workers: never completed, never freed
  size_t next_probe_ = 0;
  std::list<Outgoing> outgoing_;
  FloatPool pool_;  // message buffers to reuse
};

}  // namespace

std::vector<int> serve(Shards& shards, MPI_Comm comm, int index, const std::vector<int>& workers,
                       const std::vector<int>& server_ranks, std::optional<int64_t> staleness, Communicator& servers,
                       const std::vector<Process>& processes, int64_t steps_before) {
  Server server(shards, comm, index, workers, server_ranks, staleness, processes, steps_before);
  server.run(servers);
  return server.lost_ranks();
}

}  // namespace tnt::ps
