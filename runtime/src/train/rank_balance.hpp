// Which rank the others wait for. In synchronous training every step ends with the ranks
// meeting (the gradients' allreduce, the metrics' allreduce), so the job runs at the pace of
// its slowest rank: a rank on a busier or slower host, with a slower input pipeline or GPU,
// or with callbacks the others do not run (rank 0's) makes every rank wait at each step.
// Nothing else says which rank that is: each rank only sees its own wait for gradients.
//
// Each rank measures, for every step, its own time: from the moment the ranks last met
// (the previous step's metrics) to the end of its backward, its waits inside collectives
// (a token-level loss's count) left out, plus its update (from the gradients' arrival to
// the metrics' allreduce). That is what the others wait for. It comes in three parts: the
// wait for its batch (input), its callbacks and the loop's own work between steps (other),
// and forward with the loss, backward and the update (compute). On a GPU rank own time is
// the GPU's: from the end of the previous step's update to the end of this step's backward,
// less the GPU's time inside the step's collectives, plus this step's update, all on the
// compute stream (CUDA events read a step later, or at the epoch's end: nothing waits
// inside a step); compute is then what is left after the host's parts, and the host's time
// queuing forward, backward and update is kept beside it (a host too busy to feed its GPU
// makes the GPU's time longer too). At each epoch's end (every rank, one small allgather)
// the means are compared: where the slowest rank needed at least kStragglerRatio times the
// other ranks' median, the gap is at least kStragglerShare of the step and
// kStragglerMinGapS, over kStragglerMinSteps steps, the master names it, its host and the
// part that made the difference. Synchronous training on several ranks only.
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
  double own_s = 0;      // from the ranks' last meeting to its backward's end, and its update
  double input_s = 0;    // of which waiting for its batch
  double other_s = 0;    // its callbacks and the loop's own work
  double compute_s = 0;  // forward, loss, backward, update (GPU: own_s - input_s - other_s, >= 0)
  double queue_s = 0;    // the host's time in them (CPU: compute_s; GPU: queuing)
  double period_s = 0;   // from one step's batch wait to the next's
  int64_t steps = 0;     // steps counted
  bool gpu = false;      // own time is a GPU's
  // The wait after its backward for the gradients' allreduce (GPU: the GPU's, from its
  // events), not part of own time.
  double exposed_s = 0;
};

enum class LagCause { input, other, compute, spread };

struct Straggler {
  int rank = -1;           // the slowest
  std::vector<int> ranks;  // every rank that stands out as it does (it among them), ascending
  RankWork slow;           // its means
  RankWork typical;        // the other ranks' medians, part by part (those not named)
  double lag_s = 0;        // slow.own_s - typical.own_s: what the other ranks waited a step
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

// The ranks the others waited for, where the slowest stands out: the thresholds above
// against "typical", the median of the ranks not named (found from the faster half's median
// first, so that two slow ranks of three are both named rather than one measured against
// the other; the lowest rank among equals). The same answer on every rank from the same
// numbers.
std::optional<Straggler> find_straggler(const std::vector<RankWork>& ranks);
// The slowest rank's own time against typical (1 for one rank or no steps): the median of
// the other ranks where none stands out; typical: that median.
double slowest_ratio(const std::vector<RankWork>& ranks, int* slowest = nullptr, double* typical = nullptr);
// The warning's text: "epoch 3: rank 2 (host h3) held the other 3 ranks back: ...". hosts:
// by rank, empty where all ranks are on one host.
std::string describe_straggler(int epoch, const Straggler& s, const std::vector<std::string>& hosts, int ranks);
// Whether `now` names the ranks `warned` did, as far as news goes: each one's slowest is among
// the other's named ranks, and at most one rank differs: one fewer, or one more on a host
// the warning named another rank on (hosts: by rank; all empty on one host, where any one
// rank more or fewer is no news).
bool same_stragglers(const Straggler& warned, const Straggler& now, const std::vector<std::string>& hosts);
// Once warned, a straggler is forgotten only after an epoch of enough steps whose slowest
// rank is under this ratio (an epoch around kStragglerRatio does not make it come and go).
inline constexpr double kStragglerForgetRatio = 1.15;

// Communication that backward does not hide. After its backward every rank waits for the
// gradients' allreduce to finish; at each step the rank that waits least (the slowest, which
// waits for no other) waits for communication alone. The mean over the steps of that least
// wait (each step's minimum over the ranks: one allreduce of the steps' waits at the
// epoch's end) is communication no rank's compute explains. Where it is at least kCommShare
// of the step and kCommMinS, communication limits the job.
struct CommBound {
  double exposed_s = 0;    // the mean over steps of the least wait over the ranks
  double share = 0;        // of the median step period
  bool gpu = false;        // measured on GPUs
  bool one_host = false;   // every rank on one host: no network between them
};
inline constexpr double kCommShare = 0.20;
inline constexpr double kCommMinS = 1e-3;
inline constexpr double kCommForgetShare = 0.10;
// The verdict from the steps' least waits (least_s) and the ranks' means (their periods).
std::optional<CommBound> find_comm_bound(double least_s, const std::vector<RankWork>& ranks, bool one_host);
// "epoch 3: after its backward every rank waited at least 12.3 ms a step for ...".
// threshold_bytes: the Reducer's fusion threshold now; automatic: chosen by
// --fusion-threshold auto.
std::string describe_comm_bound(int epoch, const CommBound& c, int64_t threshold_bytes, bool automatic);

struct EpochBalance {
  std::optional<Straggler> straggler;
  std::optional<CommBound> comm;
  double slowest_ratio = 1.0;
  double exposed_share = 0;  // the steps' least wait after backward, of the step
  bool judged = false;       // enough steps, as many on every rank
};

class RankBalance;
// At the epoch's end, on every rank (collective): every rank's means, into timing's
// slowest_* fields; the rank the others waited for where one stands out.
EpochBalance epoch_balance(RankBalance& balance, Communicator& comm, EpochTiming& timing);

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
  void wait_begin(double t);      // a collective inside the step begins (left out of own time)
  void wait_end(double t);        // ... and returns
  void backward_end(double t);    // backward has run (GPU: queued; an event marks its end)
  void update_begin(double t);    // the gradients are there (after the Reducer's finalize)
  void update_done();             // the update is queued (GPU: an event marks its end)
  void step_end(double t);        // before the metrics' allreduce: the step's own work is done
  void met(double t);             // the metrics' allreduce returned: the next step's reference
  // An epoch's first step has no reference (the ranks have not met in it yet) and is not
  // counted, on CPU and GPU ranks alike: every rank counts the same steps.

  // Collective, at the epoch's end on every rank: gathers every rank's means (and, once,
  // their host names). Returns them, rank by rank.
  std::vector<RankWork> gather(Communicator& comm);
  // Collective, after gather: the mean over the epoch's counted steps of each step's least
  // wait after backward over the ranks. Every rank must have counted the same steps.
  double least_exposed(Communicator& comm);
  // The steps' waits kept for it: every step, or every 2^k-th once an epoch has more than
  // kMaxExposedSamples steps (the same steps on every rank).
  static constexpr size_t kMaxExposedSamples = 4096;
  const std::vector<double>& exposed_samples() const { return exposed_samples_; }
  bool one_host() const;  // after gather
  bool gpu() const { return events_ != nullptr; }
  RankWork local() const;  // this rank's means so far
  // Whether the master warns about this epoch's straggler now: the first time, and again
  // only where the ranks named (same_stragglers) or the part changed, or the lag grew by half or shrank by a third,
  // since the last warning (a job of 90 epochs with one slow host says so once; so do fits
  // in a row on one Model). A judged epoch whose slowest rank is under kStragglerForgetRatio
  // starts afresh.
  bool worth_warning(const EpochBalance& e);
  // The same for communication: the first time, and again where its share of the step grew
  // by half or shrank by a third; a judged epoch under kCommForgetShare starts afresh.
  bool worth_comm_warning(const EpochBalance& e);
  // The master's warnings for this epoch, where worth it (both kinds).
  void warn(int epoch, const EpochBalance& e, int64_t threshold_bytes, bool automatic);

 private:
  // A GPU step's events, each this step's own: own time = (ref, end) - the waits +
  // (update, update_end). ref is recorded at the step before's met().
  struct Step {
    void* ref = nullptr;
    void* end = nullptr;         // its backward's end
    void* update = nullptr;      // the gradients there
    void* update_end = nullptr;  // its update's end: the last event of the step
    std::vector<std::pair<void*, void*>> waits;  // around each collective inside the step
  };
  void* event();
  void release(void* e);
  void release(Step& st);
  void read_complete(bool wait);
  void add_exposed(double seconds);

  std::unique_ptr<timeline::DeviceEvents> events_;
  std::vector<void*> free_, all_;
  Step current_;               // the step being queued (GPU)
  std::deque<Step> pending_;   // queued steps not yet read (GPU)
  void* ref_event_ = nullptr;  // recorded at the last met(): the next step's ref (GPU)

  double ref_t_ = -1;       // when the ranks last met; < 0: not since the last step began
  double step_ref_t_ = -1;  // this step's: the meeting before it
  double begin_t_ = -1;  // the last step's batch wait began (for the period)
  bool counted_ = false;  // this step has a reference
  double input_t_ = 0, compute_t_ = 0, input_s_ = 0, wait_t_ = 0, waited_s_ = 0, backward_t_ = 0, update_t_ = 0;
  // Sums over the epoch's counted steps.
  double own_ = 0, input_ = 0, other_ = 0, queue_ = 0, period_ = 0, exposed_ = 0;
  int64_t steps_ = 0, gpu_steps_ = 0, periods_ = 0;
  std::vector<double> exposed_samples_;
  int64_t exposed_seen_ = 0, exposed_stride_ = 1;
  std::vector<std::string> hosts_;  // by rank, of the communicator they were gathered over
  std::optional<Straggler> warned_;  // the last one warned about
  std::optional<CommBound> comm_warned_;
};

}  // namespace tnt::detail
