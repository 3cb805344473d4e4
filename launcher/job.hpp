// Running the mpirun command and standing by until it ends. The launcher stops the job
// exactly once when it gets SIGINT, SIGTERM, SIGHUP or SIGQUIT: mpirun stops every rank on
// one SIGTERM, but on a second signal it exits at once and leaves its ranks behind. So a
// signal that the terminal sent (Ctrl-C reaches the whole foreground process group, mpirun
// included) is not passed on again; one sent to the launcher alone is passed on as SIGTERM.
// mpirun stays in the launcher's process group so that it can still read a terminal's
// input for rank 0. If mpirun has not finished 3 s later it is killed; the ranks' own steps
// then stop their programs (rank_setup.hpp). mpirun also gets SIGTERM should the launcher
// itself die. The launcher is a subreaper: whatever mpirun leaves running when it ends (a
// launch agent still trying to reach a host, a rank's step still ending its program) is
// re-parented to it and ended, SIGTERM then SIGKILL, before run_job returns. Meanwhile the launcher collects the ranks' reports (report.hpp) and, with a
// RankWatch (rank_watch.hpp), ends the job the same way when ranks do not start, or do
// not end, in time: it never waits forever on a job that cannot finish. With lifelines
// (lifeline.hpp) it also ends the job when ranks are lost (mpirun is given 3 s to do it
// first: it notices a dead daemon itself) or unreachable (at once: mpirun would wait for
// a cut-off host forever). mpirun's standard error reaches the user through the launcher,
// without Open MPI's restatement of a failure the launcher names itself (mpirun_output.hpp).
#pragma once

#include "lifeline.hpp"
#include "mpirun_output.hpp"
#include "output_relay.hpp"
#include "rank_watch.hpp"
#include "report.hpp"

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tnt::launcher {

struct JobResult {
  int mpirun_status = 0;            // as from waitpid
  std::optional<int> interrupted_by;  // SIGINT, SIGTERM, SIGHUP or SIGQUIT received by the launcher
  std::optional<int> warned_by;       // the first SIGUSR1 or SIGUSR2 passed on to the ranks
  bool stop_requested = false;        // a rank's program stopped training on a stop request
  size_t failures_before_interrupt = 0;  // how many of `failures` had arrived by then
  // The first of those that failed on its own: not killed by a stop signal (SIGINT, SIGTERM,
  // SIGHUP, SIGQUIT, SIGKILL), which may be the interrupt's own, come through mpirun.
  const RankReport* failed_before_interrupt() const;
  std::optional<RankWatch::Verdict> verdict;  // the watch ended the job (already printed)
  std::vector<RankReport> failures;  // in the order they were reported; the first failed first
  // The ranks whose programs were stopped (SIGSTOP, SIGTSTP) when the first failure came, by
  // their stopped reports: a rank that waited for a stopped one fails on its collective
  // timeout, and the stopped rank is the one to look at.
  std::vector<RankReport> stopped_at_first_failure;
  // Failures the job survived (expendable ranks, see run_job), in the order reported.
  std::vector<RankReport> dropped;
  std::vector<RankReport> ends;  // every rank's end report, in the order reported
  struct Loss {
    LostRank rank;
    size_t failures_before = 0;  // how many of `failures` had arrived when it was found
    // Found after the launcher had begun to end the job (after another rank was lost or
    // unreachable, a watch verdict, the user's signal): the launcher's own stop took it.
    bool in_stop = false;
  };
  std::vector<Loss> lost;  // lost or unreachable ranks, in the order found
  std::set<int> started;   // ranks whose program started (exec succeeded), from their reports
  std::set<int> reported;  // ranks that sent any report at all: evidence that their step ran
  // What mpirun wrote about the failure that the launcher reports itself (the MPI_ABORT
  // banner and the like, mpirun_output.hpp): held back from the user's terminal, to be
  // printed when the launcher has no account of its own.
  std::string mpirun_messages;
  // Hosts that the launch agent could not reach, as it said (mpirun_output.hpp), and
  // whether Open MPI said that it could not start its daemons.
  std::vector<HostProblem> host_problems;
  bool daemons_failed = false;
  // The rank Open MPI said "exited improperly" and ended the job for (mpirun_output.hpp).
  std::optional<int> improper_exit_rank;
  // The reader of the launcher's standard output went away (output_relay.hpp); whether
  // that came before any failure, loss or verdict (then it is why the job ended).
  bool output_closed = false;
  bool output_closed_first = false;
  int output_error = 0;  // not a reader gone: a write that failed with this errno (ENOSPC)
  // The launcher itself was stopped (SIGSTOP, SIGTSTP) for longer than the heartbeat
  // timeout, so the ranks took it for gone and ended their programs; whether that came
  // before any failure, loss or verdict (then it is why the job ended, not the ranks).
  double stopped_s = 0;
  bool stopped_first = false;

  // A loss is news (a cause, not a consequence) when it came before any reported failure
  // and before the launcher began to end the job, or when the rank was unreachable (no
  // teardown makes a host unreachable).
  std::vector<LostRank> news() const;
  // The ranks whose lifelines closed while the launcher was ending the job: taken down by
  // that stop, not a cause of it.
  std::vector<LostRank> stopped_with_job() const;
  // Whether the first failure of the job was a loss.
  bool lost_first() const {
    return !lost.empty() && lost.front().failures_before == 0 &&
           (!lost.front().in_stop || lost.front().rank.kind == LostRank::Kind::unreachable);
  }
};

// The exit code of a usage error: a command line or input refused before any work, by
// the training programs (models/common/flags.hpp), by tarantella itself, and by convention
// (getopt tools, shells). A restart gets the same command line and fails the same way.
inline constexpr int usage_exit_code = 2;

// Why starting the job again after it ended as `result` says would only fail the same way:
// the first failure is a rank that exited with usage_exit_code, or one whose program never
// started (exec failed: not found or not executable on its host, 127 or 126; the rank's
// setup failed, 1).
// "" when a restart may help (a crash, a signal, a lost host, a timeout, any other code).
// Pure, for tests.
std::string restart_futility(const JobResult& result);

// `server` may be null (no reports); `watch` and `lifelines` may be null (nothing watched),
// and are only useful with a server. Throws SystemError when mpirun cannot be started.
// `expendable`: ranks whose failure the job survives (a parameter-server job's workers;
// mpirun then runs with --enable-recovery and ends nothing itself). Such a rank killed by a
// signal is said at once and kept in `dropped` (the job ends when every one is); any other
// failure ends the job at once, as mpirun would have.
// `ranks`: the job's rank count. SIGUSR1 and SIGUSR2 (a batch system's warning) are passed on
// to the ranks once each has entered MPI_Init, ended, or run its program for `warning_hold`
// (by its reports; a program that does not use the runtime never enters it through us), and
// a minute after the signal at the latest: before, a program may still be starting, and the
// signal's default action would end it (a program of models/ takes it from main's start on).
JobResult run_job(const std::vector<std::string>& command, ReportServer* server, RankWatch* watch,
                  Lifelines* lifelines = nullptr, const std::vector<int>& expendable = {}, int ranks = 0,
                  std::chrono::milliseconds warning_hold = std::chrono::seconds(3));

}  // namespace tnt::launcher
