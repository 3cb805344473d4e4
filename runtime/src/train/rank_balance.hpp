// Which rank the others wait for. In synchronous training every step ends with the ranks
// meeting (the gradients' allreduce, the metrics' allreduce), so the job runs at the pace of
// its slowest rank: a rank on a busier or slower host, with a slower input pipeline or GPU,
// or with callbacks the others do not run (rank 0's) makes every rank wait at each step.
// Nothing else says which rank that is: each rank only sees its own wait for gradients.
//
// Each rank measures, for every step, its own time: from the moment the ranks last met
// (the previous step's metrics) to the end of its backward, its waits inside collectives
// (a token-level loss's count) left out. That is what the others wait for. It comes in three
// parts: the wait for its batch (input), its callbacks and the loop's own work between
// steps (other), and forward with the loss plus backward (compute). On a GPU rank own time
// is the GPU's: from the end of the previous step's update to the end of this step's
// backward on the compute stream (CUDA events read a step later, or at the epoch's end:
// nothing waits inside a step), and compute is what is left of it after the host's parts;
// the host's time queuing forward and backward is kept beside it (a host too busy to feed
// its GPU makes the GPU's time longer too).
// At each epoch's end (every rank, one small allgather) the means are compared: where the
// slowest rank needed at least kRatio times the other ranks' median and the gap is at least
// kShare of the step (and kMinGapS), the master names it, its host and the part that
// made the difference. Synchronous training on several ranks only.
#pragma once

#include "io/timeline_gpu.hpp"
#include "tarantella/comm.hpp"

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tnt {
struct EpochTiming;
}

namespace tnt::detail {

// One rank's means over an epoch's counted steps (seconds).
struct RankWork {
  double own_s = 0;      // from the ranks' last meeting to the end of this rank's backward
  double input_s = 0;    // of which waiting for its batch
  double other_s = 0;    // its callbacks and the loop's own work
  double compute_s = 0;  // forward, loss and backward (GPU: own_s - input_s - other_s, at least 0)
  double queue_s = 0;    // the host's time in forward and backward (CPU: compute_s; GPU: queuing)
  double period_s = 0;   // the step from batch wait to batch wait (input + step)
  int64_t steps = 0;     // steps counted
};

enum class LagCause { input, other, compute, spread };

struct Straggler {
  int rank = -1;
  RankWork slow;     // its means
  RankWork typical;  // the other ranks' medians, part by part
  double lag_s = 0;  // slow.own_s - typical.own_s: what every other rank waited a step
  double share = 0;  // lag_s / the median step period
  LagCause cause = LagCause::spread;
};

inline constexpr double kStragglerRatio = 1.25;   // own time against the others' median
inline constexpr double kStragglerShare = 0.10;   // the gap against the step
inline constexpr double kStragglerMinGapS = 1e-3;
inline constexpr int64_t kStragglerMinSteps = 5;
// A part is named as the cause where its excess over the others' median is at least this
// share of the gap.
inline constexpr double kCauseShare = 0.5;

// The rank the others waited for, where one stands out (the thresholds above; the lowest
// rank among equals). The same answer on every rank from the same numbers.
std::optional<Straggler> find_straggler(const std::vector<RankWork>& ranks);
// The slowest rank's own time against the others' median (1 for one rank or no steps).
double slowest_ratio(const std::vector<RankWork>& ranks, int* slowest = nullptr);
// The warning's text: "epoch 3: rank 2 (host h3) held the other 3 ranks back: ...". host:
// empty where all ranks are on one host. gpu: own time is the GPU's.
std::string describe_straggler(int epoch, const Straggler& s, const std::string& host, int ranks, bool gpu);

class RankBalance;
// At the epoch's end, on every rank (collective): every rank's means, into timing's
// slowest_* fields; the rank the others waited for where one stands out.
std::optional<Straggler> epoch_balance(RankBalance& balance, Communicator& comm, EpochTiming& timing);

// The loop's measurements of one rank (synchronous training, several ranks), in a step's
// order; times are host seconds (detail::now_s).
class RankBalance {
 public:
  // events: CUDA's on a GPU rank (or a stand-in in tests); null on a CPU rank.
  explicit RankBalance(std::unique_ptr<timeline::DeviceEvents> events);
  explicit RankBalance(Device device);
  ~RankBalance();
  RankBalance(const RankBalance&) = delete;
  RankBalance& operator=(const RankBalance&) = delete;

  void epoch_begin();
  void step_begin(double t);      // before the wait for its batch
  void input_done(double t);      // the batch is there
  void compute_begin(double t);   // the step's forward begins
  void waited(double seconds);    // a collective inside the step (left out of own time)
  void backward_end(double t);    // backward has run (GPU: queued; an event marks its end)
  void update_done();             // after the update (GPU: the next step's reference event)
  void met(double t);             // the step's metrics allreduce returned: the ranks met
  // The step period (input + step), for the share; once a step.
  void step_done(double period_s);

  // Collective, at the epoch's end on every rank: gathers every rank's means (and, once,
  // their host names). Returns them, rank by rank.
  std::vector<RankWork> gather(Communicator& comm);
  const std::string& host(int rank) const;  // after gather; "" where all ranks share one host
  bool gpu() const { return events_ != nullptr; }
  RankWork local() const;  // this rank's means so far
  // Whether the master warns about s now: the first time, and again only where the rank or
  // the part changed, or the lag grew or shrank by half, since the last warning (a job of 90
  // epochs with one slow host says so once). An epoch without a straggler starts afresh.
  bool worth_warning(const std::optional<Straggler>& s);

 private:
  struct Pair {
    void* ref = nullptr;  // the previous step's update end
    void* end = nullptr;  // this step's backward end
  };
  void* event();
  void release(void* e);
  void read_complete(bool wait);
  void clear_events();

  std::unique_ptr<timeline::DeviceEvents> events_;
  std::vector<void*> free_, all_;
  std::deque<Pair> pending_;
  void* ref_event_ = nullptr;  // the last step's update end (GPU)

  double ref_t_ = -1;  // when the ranks last met; < 0: not in this epoch
  double input_t_ = 0, compute_t_ = 0, input_s_ = 0, waited_s_ = 0;
  bool counted_ = false;  // this step has a reference
  // Sums over the epoch's counted steps.
  double own_ = 0, input_ = 0, other_ = 0, queue_ = 0, period_ = 0;
  int64_t steps_ = 0, gpu_steps_ = 0, periods_ = 0;
  std::vector<std::string> hosts_;
  bool hosts_known_ = false;
  std::optional<Straggler> warned_;  // the last one warned about
};

}  // namespace tnt::detail
