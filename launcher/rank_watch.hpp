// Watching the ranks through their steps' reports (report.hpp) for the ways a job hangs
// that neither mpirun nor the runtime notices. Open MPI's MPI_Init waits for every rank,
// and the runtime's collective timeout starts only at the first collective, so:
//
// - a rank that never starts (its daemon or step never ran, mpirun gave up launching after
//   an error of its own), or whose program is stopped (SIGSTOP, SIGTSTP) at start, keeps
//   every other rank waiting forever. Start timeout: by this long after the launch every
//   rank must have reported that its program started, and none may be stopped. Later, while
//   the runtime says ranks wait in MPI_Init and none has got through it, a rank stopped for
//   as long keeps them waiting as surely: it ends the job too.
// - a rank whose program exits 0 before MPI_Init (or without MPI at all) leaves the others
//   waiting for it forever. Exit timeout: once any rank's program has ended, the job must
//   end within this long. The same bound covers mpirun itself when a rank failed and
//   mpirun, which should then stop the job within seconds, does not.
// - the same, known at once: when the runtime says that a rank is waiting in MPI_Init
//   (joining, not yet joined) and no rank has got through it, a rank whose program ended
//   without ever joining can never be waited for. MPI_Init returns on no rank until every
//   rank has entered it, so "some rank joined" means that every rank entered: a rank whose
//   word was lost is never taken for one that left.
//
// When a limit passes, the launcher names the ranks (rank, host, local rank) and ends the
// job it started. Pure: time is passed in, so the rules are unit-tested without processes.
#pragma once

#include "lifeline.hpp"
#include "report.hpp"
#include "watch_limits.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct RankSlot {
  int rank = 0;
  std::string host;
  int local_rank = 0;
};

class RankWatch {
 public:
  enum class Reason {
    start,     // ranks did not start (or were stopped) in time
    exit,      // a rank exited 0 and others did not end in time
    teardown,  // a rank failed (or every rank ended) and mpirun did not end in time
    left,      // a rank ended without joining while others wait for it in MPI_Init
  };
  struct Verdict {
    Reason reason;
    std::string message;  // names the ranks and the limit
  };

  RankWatch(std::vector<RankSlot> ranks, WatchLimits limits, Clock::time_point launched);

  // Ranks whose failure the job survives (a parameter-server job's workers, which the
  // others go on without): their failed end starts no exit or teardown timer.
  void tolerate(std::vector<int> ranks) { tolerated_ = std::move(ranks); }

  // Reports from ranks the plan does not have are ignored.
  void record(const RankReport& report, Clock::time_point now);
  // A rank that is gone without a report (lifeline.hpp): ended, and a failure.
  void record_lost(const LostRank& lost, Clock::time_point now);

  // The verdict, once, when a limit has passed with the job still running; nullopt
  // otherwise. Call it at (or after) next_check() and after every report.
  std::optional<Verdict> check(Clock::time_point now);

  // When check() may next have something to say; max() when never.
  Clock::time_point next_check() const;

  // The launcher was not running for `gap` (stopped by SIGSTOP or SIGTSTP, its machine
  // suspended): the limits count only the time it ran, so every timer moves on by `gap`.
  void paused(Clock::duration gap);

  // While ranks wait in MPI_Init (none has got through it) for running ranks that have not
  // entered it: one line naming both and how long the first has waited, and that wait's
  // start; nullopt otherwise. No limit applies (a program may work long before tnt::init),
  // so the launcher says it once after a while, and when the job is interrupted.
  struct InitWait {
    std::string message;
    Clock::time_point since;
  };
  std::optional<InitWait> init_wait(Clock::time_point now) const;
  // The same at the other end: ranks in MPI_Finalize (their program is done) wait for
  // running ranks that have not reached it (a master still writing, or a rank stuck after
  // the last collective). Said after a while and at an interrupt; no limit applies. Not for
  // jobs with tolerated ranks (parameter servers), whose ranks end apart by design.
  std::optional<InitWait> finalize_wait(Clock::time_point now) const;
  // "rank 1 (host h2, local rank 0, stopped by SIGSTOP) is stopped (45 s the longest): ...",
  // for an interrupt; nullopt when no running rank is stopped.
  std::optional<std::string> stopped_ranks(Clock::time_point now) const;

  // Ended reports that were failures, in arrival order: the first failed first.
  const std::vector<RankReport>& failures() const { return failures_; }

 private:
  // The exit timeout, cut to failure_teardown_s once a rank failed.
  Seconds exit_limit() const {
    return first_failure_ ? std::min(limits_.exit, Seconds(failure_teardown_s)) : limits_.exit;
  }
  struct State {
    bool started = false, ended = false, stopped = false;
    bool joining = false, joined = false, finalizing = false;
    Clock::time_point joining_at{};     // the joining report
    Clock::time_point finalizing_at{};  // the finalizing report
    int stop_signal = 0;
    Clock::time_point stopped_at{};  // the last stopped report
    int exit_code = 0;  // ended: the code (or signal) it reported
    bool signaled = false;
  };
  // Ranks that ended without joining, and ranks waiting in MPI_Init; both empty unless
  // the `left` rule holds.
  void left_early(std::vector<int>& left, std::vector<int>& waiting) const;
  // Ranks waiting in MPI_Init (joining, not ended) while none has joined; empty otherwise.
  std::vector<int> waiting_in_init() const;
  std::string describe(const std::vector<int>& ranks) const;

  std::vector<RankSlot> slots_;
  std::vector<State> state_;
  WatchLimits limits_;
  Clock::time_point launched_;
  std::optional<Clock::time_point> first_end_;      // the first ended report, any status
  int first_end_rank_ = -1;
  std::optional<Clock::time_point> first_failure_;  // the exit timer restarts at a failure
  bool start_checked_ = false;
  std::optional<Clock::time_point> left_found_;  // when the `left` rule first held
  bool decided_ = false;
  std::vector<RankReport> failures_;
  std::vector<int> tolerated_;
};

}  // namespace tnt::launcher
