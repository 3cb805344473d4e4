// The server loop of parameter-server training: answers any worker's message as it comes,
// holds back a pull that max_staleness does not allow yet, never waits for one worker.
#include "ps/server.hpp"

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
#include <list>
#include <map>
#include <set>
#include <limits>
#include <thread>

namespace tnt::ps {
namespace {

using timeline::Lane;
using Span = timeline::Span;

// ---------------------------------------------------------------------------------------
// The server

class Server {
 public:
  Server(Shards& shards, MPI_Comm comm, int index, const std::vector<int>& workers, std::optional<int64_t> staleness)
      : shards_(shards), comm_(comm), index_(index), workers_(workers), staleness_(staleness) {
    for (size_t i = 0; i < workers_.size(); ++i) worker_index_[workers_[i]] = static_cast<int>(i);
    pushes_.assign(workers_.size(), 0);
    done_.assign(workers_.size(), false);
    paused_.assign(workers_.size(), -1);
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
    while (std::count(done_.begin(), done_.end(), true) < static_cast<long>(done_.size())) {
      progress_sends();
      int flag = 0;
      MPI_Status st;
      TNT_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &st));
      if (!flag) {
        // Nothing to do: yield the core to the workers (ranks often share cores) after a
        // short spin, so a busy server still answers within microseconds.
        if (++idle > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      idle = 0;
      handle(st);
      answer_pulls();
    }
    for (auto& o : outgoing_) TNT_MPI_CHECK(MPI_Wait(&o.request, MPI_STATUS_IGNORE));
    outgoing_.clear();
    shards_.read_state();
    timeline::fit_end(servers);
  }

 private:
  struct Outgoing {
    std::vector<float> floats;
    std::vector<int64_t> ints;
    MPI_Request request = MPI_REQUEST_NULL;
  };
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
    const int w = worker_of(st.MPI_SOURCE);
    int count = 0;
    switch (st.MPI_TAG) {
      case kPull: {
        int64_t msg[3] = {0, 0, 0};
        TNT_MPI_CHECK(MPI_Recv(msg, 3, MPI_INT64_T, st.MPI_SOURCE, kPull, comm_, MPI_STATUS_IGNORE));
        held_.push_back({st.MPI_SOURCE, msg[0], msg[1] != 0, msg[2]});
        break;
      }
      case kPush: {
        std::vector<float> grad(accum_.size() + 1);
        TNT_MPI_CHECK(MPI_Recv(grad.data(), static_cast<int>(grad.size()), MPI_FLOAT, st.MPI_SOURCE, kPush, comm_,
                               MPI_STATUS_IGNORE));
        round_epoch_ = static_cast<int64_t>(grad.back());
        grad.pop_back();
        ++pushes_[static_cast<size_t>(w)];
        paused_[static_cast<size_t>(w)] = -1;
        if (staleness_ && *staleness_ == 0) {
          for (size_t i = 0; i < grad.size(); ++i) accum_[i] += grad[i];
          apply_complete_rounds();
        } else {
          apply(grad.data());
        }
        break;
      }
      case kDone: {
        int64_t zero = 0;
        TNT_MPI_CHECK(MPI_Recv(&zero, 1, MPI_INT64_T, st.MPI_SOURCE, kDone, comm_, MPI_STATUS_IGNORE));
        done_[static_cast<size_t>(w)] = true;
        if (staleness_ && *staleness_ == 0) apply_complete_rounds();
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

  void apply(const float* grad) {
    timeline::step_begin(applied_ + 1, 0, detail::now_s());
    Span span(Lane::compute, "apply", [&] { return fmt::format(R"("update":{})", applied_ + 1); });
    shards_.apply(index_, grad, owned_, owned_index_);
    ++applied_;
  }

  // Staleness 0: a step's round is complete when every worker has pushed it or is done.
  void apply_complete_rounds() {
    while (true) {
      bool any = false, all = true;
      for (size_t w = 0; w < pushes_.size(); ++w) {
        if (pushes_[w] > applied_) {
          any = true;
        } else if (!done_[w] && paused_[w] < round_epoch_) {
          all = false;  // a worker that left this round's epoch early pushes nothing more in it
        }
      }
      if (!any || !all) return;
      apply(accum_.data());
      std::fill(accum_.begin(), accum_.end(), 0.0f);
    }
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
    if (*staleness_ == 0) return applied_ >= h.clock;
    return lead(h) <= *staleness_;
  }

  void answer_pulls() {
    for (auto it = held_.begin(); it != held_.end();) {
      if (!may_answer(*it)) {
        ++it;
        continue;
      }
      std::vector<float> values = shards_.gather(index_, false);
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
      it = held_.erase(it);
    }
  }

  void send_floats(std::vector<float> data, int dest, int tag) {
    Outgoing& o = outgoing_.emplace_back();
    o.floats = std::move(data);
    TNT_MPI_CHECK(
        MPI_Isend(o.floats.data(), static_cast<int>(o.floats.size()), MPI_FLOAT, dest, tag, comm_, &o.request));
  }
  void send_ints(std::vector<int64_t> data, int dest, int tag) {
    Outgoing& o = outgoing_.emplace_back();
    o.ints = std::move(data);
    TNT_MPI_CHECK(MPI_Isend(o.ints.data(), static_cast<int>(o.ints.size()), MPI_INT64_T, dest, tag, comm_, &o.request));
  }
  void progress_sends() {
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      int done = 0;
      TNT_MPI_CHECK(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
      it = done ? outgoing_.erase(it) : std::next(it);
    }
  }

  Shards& shards_;
  MPI_Comm comm_;
  int index_;
  std::vector<int> workers_;
  std::map<int, int> worker_index_;  // world rank -> worker index
  std::optional<int64_t> staleness_;
  std::vector<int64_t> pushes_;
  std::vector<bool> done_;
  std::vector<int64_t> paused_;  // the epoch whose steps a worker left (kPause) until its next push; -1
  int64_t round_epoch_ = 0;      // the epoch of the pushes being summed (staleness 0)
  int64_t applied_ = 0;
  std::vector<float> accum_;
  std::vector<NamedParameter> owned_;
  std::vector<int> owned_index_;
  std::list<Held> held_;
  std::list<Outgoing> outgoing_;
};

}  // namespace

void serve(Shards& shards, MPI_Comm comm, int index, const std::vector<int>& workers, std::optional<int64_t> staleness,
           Communicator& servers) {
  Server server(shards, comm, index, workers, staleness);
  server.run(servers);
}

}  // namespace tnt::ps
