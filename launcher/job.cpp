#include "job.hpp"

#include "env_names.hpp"
#include "error.hpp"
#include "mpirun_output.hpp"
#include "ompi_leftovers.hpp"
#include "processes.hpp"
#include "rank_watch.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <map>
#include <set>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tnt::launcher {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
bool is_stop_signal(int sig) { return std::count(std::begin(stop_signals), std::end(stop_signals), sig) > 0; }
// Passed on to mpirun, which passes them on to the ranks (as mpirun alone does): SLURM's
// `--signal=USR1@T` warning before the time limit reaches the programs, not the launcher's
// default action (death, leaving mpirun behind).
constexpr int forwarded_signals[] = {SIGUSR1, SIGUSR2};
// mpirun needs about a second to stop its ranks; past this it and its group are killed.
constexpr auto stop_grace = std::chrono::milliseconds(3000);
// mpirun notices a lost daemon itself and ends the job within about a second; past this
// the launcher ends it.
constexpr auto lost_grace = std::chrono::milliseconds(3000);
// A partial line of mpirun's standard error waits this long for the rest before it is
// passed on as it is.
constexpr auto partial_line_wait = std::chrono::milliseconds(100);
// The loop wakes at least this often, so that a time the launcher did not run (stopped) shows
// as a gap: a wake-up later than planned by more than `pause_gap`.
constexpr int max_sleep_ms = 500;
constexpr auto pause_gap = std::chrono::milliseconds(1000);
// After mpirun exited, the rest of its stderr is read this long (a remote process may hold it).
constexpr auto stderr_drain = std::chrono::milliseconds(1000);
// What mpirun left gets SIGTERM, then SIGKILL this much later (a step's own grace is 2 s).
constexpr auto leftover_grace = std::chrono::milliseconds(3000);
// Ranks waiting this long in MPI_Init for one that has not entered it get a line naming it,
// once (no limit ends the job for it: a program may work long before tnt::init); the same
// for ranks waiting in MPI_Finalize for one that has not reached it.
constexpr auto init_wait_notice = std::chrono::seconds(60);
constexpr auto interrupt_wait_notice = std::chrono::seconds(5);  // on an interrupt, waits named from this long

// Writes all of `text` to the launcher's standard error, as far as it takes it. 0, or the
// errno of a write that failed other than for a reader gone (EFBIG past ulimit -f, ENOSPC):
// the ranks' errors are then lost, and the job must not pass for a success.
int write_stderr(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EPIPE && errno != ECONNRESET) return errno;
    if (n <= 0) return 0;  // closed: nobody to tell
    done += static_cast<size_t>(n);
  }
  return 0;
}

// "rank 1 (host h2, local rank 0), rank 2 (host h2, local rank 1)", at most 8.
std::string describe_ranks(const std::vector<LostRank>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
    out += fmt::format("{}rank {} (host {}, local rank {})", i ? ", " : "", ranks[i].rank, ranks[i].host,
                       ranks[i].local_rank);
  }
  if (ranks.size() > 8) out += fmt::format(" and {} more", ranks.size() - 8);
  return out;
}

[[noreturn]] void exec_mpirun(const std::vector<std::string>& command, pid_t launcher, const sigset_t& original,
                              int stderr_pipe, int stdout_pipe) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != launcher) ::_exit(128 + SIGTERM);
  ::sigprocmask(SIG_SETMASK, &original, nullptr);
  // Ignored by the launcher alone (an ignored signal stays so across exec).
  for (int sig : {SIGPIPE, SIGXFSZ, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_DFL);
  // mpirun runs without core files: Open MPI 4.1's mpirun crashes when a signal finds it
  // ending a job already (a terminal's Ctrl-C reaches it directly), and its core is no
  // user's concern. The rank's step gives the program the limit back (env::core_limit).
  rlimit core{};
  if (::getrlimit(RLIMIT_CORE, &core) == 0 && core.rlim_cur != 0) {
    ::setenv(env::core_limit,
             core.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(core.rlim_cur).c_str(), 1);
    core.rlim_cur = 0;
    ::setrlimit(RLIMIT_CORE, &core);
  }
  ::dup2(stderr_pipe, STDERR_FILENO);
  if (stdout_pipe >= 0) ::dup2(stdout_pipe, STDOUT_FILENO);
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  std::fprintf(stderr, "tarantella: cannot run %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

}  // namespace

JobResult run_job(const std::vector<std::string>& command, ReportServer* server, RankWatch* watch,
                  Lifelines* lifelines, const std::vector<int>& expendable, int ranks,
                  std::chrono::milliseconds warning_hold) {
  // An explicit kill must stop the job even when the shell started us with SIGINT
  // ignored (background jobs of scripts); a SIGHUP ignored by nohup stays ignored.
  for (int sig : {SIGINT, SIGTERM, SIGQUIT}) ::signal(sig, SIG_DFL);

  sigset_t handled, original;
  sigemptyset(&handled);
  for (int sig : stop_signals) {
    // Linux queues even an ignored blocked signal: nohup's ignored SIGHUP stays out.
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) continue;
    sigaddset(&handled, sig);
  }
  for (int sig : forwarded_signals) sigaddset(&handled, sig);
  sigaddset(&handled, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &handled, &original);
  const int sfd = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) throw system_error("signalfd");

  // mpirun's standard error comes through the launcher (mpirun_output.hpp); its standard
  // input stays the user's, and so does its output to a terminal.
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(sfd);
    throw system_error("pipe2");
  }
  // mpirun's standard output comes through the launcher where its reader can go away or a
  // write can fail: a pipe, a socket, a file, a device but /dev/null (output_relay.hpp).
  int out_pipe[2] = {-1, -1};
  if (OutputRelay::wanted(STDOUT_FILENO) && ::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(sfd);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    throw system_error("pipe2");
  }
  // A user's stderr that is a closed pipe must not kill the launcher in the middle of a job,
  // nor a relayed output past the file-size limit (ulimit -f): the write fails with EFBIG,
  // and the job is stopped saying so.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);
  // What mpirun leaves behind when it ends or is killed (a launch agent still waiting on a
  // host that never answered, ranks' steps still ending their programs) is re-parented to
  // the launcher instead of init, and ended with the job (processes.hpp).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t self = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(sfd);
    for (int fd : {err_pipe[0], err_pipe[1], out_pipe[0], out_pipe[1]}) {
      if (fd >= 0) ::close(fd);
    }
    throw system_error("fork");
  }
  if (child == 0) exec_mpirun(command, self, original, err_pipe[1], out_pipe[1]);
  ::close(err_pipe[1]);
  std::optional<OutputRelay> out;
  if (out_pipe[0] >= 0) {
    ::close(out_pipe[1]);
    out.emplace(out_pipe[0], STDOUT_FILENO);
  }
  int err_fd = err_pipe[0];
  ::fcntl(err_fd, F_SETFL, ::fcntl(err_fd, F_GETFL) | O_NONBLOCK);
  MpirunOutputFilter filter;
  filter.set_mpirun_pid(child);
  // When a partial line (or a separator) that waits in the filter is passed on as it is.
  Clock::time_point flush_at = Clock::time_point::max();
  int stderr_error = 0;  // the first failed write of the ranks' standard error (write_stderr)
  const auto to_stderr = [&](const std::string& text) {
    if (const int e = write_stderr(text); e != 0 && stderr_error == 0) stderr_error = e;
  };
  auto relay = [&] {
    char buf[4096];
    // Bounded, so that a flood of output does not keep the loop from the job's events.
    for (int reads = 0; err_fd >= 0 && reads < 64; ++reads) {
      const ssize_t n = ::read(err_fd, buf, sizeof buf);
      if (n > 0) {
        to_stderr(filter.feed(std::string_view(buf, static_cast<size_t>(n))));
        // Counted from when the text began to wait: a progress bar that redraws its line
        // without a newline is still shown at that pace.
        if (!filter.pending()) {
          flush_at = Clock::time_point::max();
        } else if (flush_at == Clock::time_point::max()) {
          flush_at = Clock::now() + partial_line_wait;
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      ::close(err_fd);  // end of file: nothing will come any more
      err_fd = -1;
    }
    if (filter.pending() && (err_fd < 0 || Clock::now() >= flush_at)) {
      to_stderr(filter.flush());
      flush_at = Clock::time_point::max();
    }
  };

  JobResult result;
  // When mpirun gets SIGKILL; max() while no stop is under way.
  Clock::time_point kill_at = Clock::time_point::max();
  // The launcher has begun to end the job: ranks lost from now on went with that stop.
  bool stopping = false;
  bool asked_twice = false;  // a second SIGINT/SIGTERM: mpirun killed, no grace
  auto stop_job = [&] {
    stopping = true;
    ::kill(child, SIGTERM);
    kill_at = Clock::now() + stop_grace;
  };
  // When the launcher ends a job whose ranks were lost, unless mpirun has by then.
  Clock::time_point lost_stop_at = Clock::time_point::max();
  bool ended = false;  // mpirun has exited: what the lifelines say now is no news
  // Lifelines first: in the same wake-up, a rank lost is older news than the reports of
  // the ranks that mpirun stopped because of it.
  auto service_lifelines = [&] {
    if (!lifelines) return;
    const auto now = Clock::now();
    std::vector<LostRank> unreachable;
    for (LostRank& l : lifelines->service(now)) {
      if (ended) continue;
      if (watch) watch->record_lost(l, now);
      result.lost.push_back({l, result.failures.size(), stopping});
      if (l.kind == LostRank::Kind::unreachable) {
        unreachable.push_back(l);
      } else if (kill_at == Clock::time_point::max() && lost_stop_at == Clock::time_point::max()) {
        lost_stop_at = now + lost_grace;
      }
    }
    if (!unreachable.empty() && !result.interrupted_by) {
      std::fprintf(stderr, "tarantella: %s unreachable: no heartbeat for %s s (--heartbeat-timeout, "
                   "TNT_HEARTBEAT_TIMEOUT): the host is down or cut off from this one; ending the job\n",
                   describe_ranks(unreachable).c_str(), format_seconds(Seconds(lifelines->timeout_s())).c_str());
      // mpirun cannot reach the host either, and would wait for it forever. Once it is
      // already ending the job after a failure, a signal only makes it crash on the way
      // (Open MPI 4.1): it is killed at once. The ranks on the hosts that can be reached
      // end with it (their steps see mpirun, or its daemon, gone); the cut-off ones are
      // ended by their own steps.
      if (!result.failures.empty() && kill_at == Clock::time_point::max()) {
        stopping = true;
        ::kill(child, SIGKILL);
        kill_at = Clock::time_point::max() - Clock::duration(1);  // a stop under way, nothing left to send
      } else if (kill_at == Clock::time_point::max()) {
        stop_job();
      }
    }
  };
  // The launcher did not run for `gap`: the watch's timers move on by as much (the
  // lifelines make the same allowance themselves). Past the heartbeat timeout, the ranks'
  // steps have taken the launcher for gone and are ending their programs: say so now, so
  // that their losses are read as what they are.
  auto launcher_paused = [&](Clock::duration gap) {
    if (watch) watch->paused(gap);
    const double seconds = std::chrono::duration<double>(gap).count();
    if (!lifelines || seconds < lifelines->timeout_s() || result.stopped_s > 0 || ended) return;
    result.stopped_s = seconds;
    result.stopped_first = result.failures.empty() && result.lost.empty() && !result.verdict &&
                           !result.interrupted_by && !result.output_closed;
    std::fprintf(stderr, "tarantella: this launcher was stopped for %.0f s (SIGSTOP, or Ctrl-Z), longer than the "
                 "heartbeat timeout of %s s (--heartbeat-timeout): its ranks took it for gone and have ended their "
                 "programs\n", seconds, format_seconds(Seconds(lifelines->timeout_s())).c_str());
  };
  // The reader of the launcher's output has gone: nothing the job prints can reach anyone.
  // `running`: mpirun has not been reaped (so it may be signalled).
  auto output_closed = [&](bool running) {
    if (result.output_closed) return;
    result.output_closed = true;
    result.output_closed_first = result.failures.empty() && result.lost.empty() && !result.verdict &&
                                 !result.interrupted_by;
    result.output_error = out ? out->sink_error() : 0;
    const bool error_output = result.output_error == 0 && stderr_error != 0;  // (said where it may still go)
    if (error_output) result.output_error = stderr_error;
    if (result.output_error != 0) {  // a full disk: said even after mpirun ended, the output being lost
      std::fprintf(stderr, "tarantella: writing the standard %s failed: %s%s\n", error_output ? "error" : "output",
                   std::strerror(result.output_error),
                   !running || stopping ? "" : "; stopping the job (what its ranks print would be lost)");
    }
    if (!running) return;
    if (result.output_error == 0) {
      std::fprintf(stderr, "tarantella: the standard output was closed by its reader (the command it was piped to "
                   "has ended)%s\n", stopping ? "" : "; stopping the job");
    }
    if (!stopping) stop_job();
  };
  // Warning signals held while ranks start (see run_job), and the ranks past their start.
  std::vector<int> held_warnings;
  Clock::time_point held_until = Clock::time_point::max();
  std::set<int> past_start;  // entered MPI_Init, or ended
  std::map<int, Clock::time_point> started_at;
  // When every rank will be past its start: now or earlier, later, or max() (a rank has not
  // started its program yet).
  auto warnings_go_at = [&]() -> Clock::time_point {
    if (!server || ranks <= 0) return Clock::time_point::min();
    Clock::time_point at = Clock::time_point::min();
    for (int r = 0; r < ranks; ++r) {
      if (past_start.count(r)) continue;
      const auto it = started_at.find(r);
      if (it == started_at.end()) return Clock::time_point::max();
      at = std::max(at, it->second + warning_hold);
    }
    return at;
  };
  auto pass_on = [&](int sig) {
    if (!result.warned_by) result.warned_by = sig;
    ::kill(child, sig);
  };
  auto release_warnings = [&] {
    for (int sig : held_warnings) pass_on(sig);
    held_warnings.clear();
    held_until = Clock::time_point::max();
  };
  std::map<int, RankReport> stopped_now;  // by rank: stopped and not continued or ended since
  // Stopped ranks continued in the last moments: when a rank fails, Open MPI's stop of the
  // job (an MPI_Abort of the failing rank's runtime) sends SIGCONT before SIGTERM, and the
  // continued rank's report may come in before the failure's. A rank continued within
  // kContinuedRecently before the first failure counts as stopped at it.
  // A stop shorter than kLongStop (a profiler's, a user's kill -STOP/-CONT) is no cause of
  // a collective's timeout, and a rank that then ended cleanly was none either.
  constexpr auto kContinuedRecently = std::chrono::seconds(2);
  constexpr auto kLongStop = std::chrono::seconds(1);
  std::map<int, std::pair<RankReport, Clock::time_point>> continued_at;
  std::map<int, Clock::time_point> stopped_since;
  // Workers inside parameter-server training: a loss there is survived (the others drop the
  // worker); anywhere else (the weights' first broadcast, an evaluation after the fit) the
  // others would wait for it in a collective, so it ends the job as in synchronous training.
  std::set<int> in_ps;
  auto take_reports = [&] {
    std::vector<RankReport> reports;
    std::vector<LifelineHello> hellos;
    server->accept_pending(reports, lifelines ? &hellos : nullptr);
    const auto now = Clock::now();
    for (const auto& h : hellos) lifelines->adopt(h, now);
    for (const auto& r : reports) {
      if (r.kind == RankReport::Kind::ended) result.ends.push_back(r);
      // Only a worker killed by a signal is lost: one that exits with an error says what went
      // wrong (a usage error, a server that stopped answering), and that ends the job.
      if (r.kind == RankReport::Kind::ps_begin) in_ps.insert(r.rank);
      if (r.kind == RankReport::Kind::ps_end) in_ps.erase(r.rank);
      if (r.failed() && r.signaled && in_ps.count(r.rank) &&
          std::find(expendable.begin(), expendable.end(), r.rank) != expendable.end()) {
        result.dropped.push_back(r);
        if (!stopping && result.dropped.size() == expendable.size()) {
          // The last one is what ended the job: named first, its status the job's.
          std::fprintf(stderr, "tarantella: every worker is lost; ending the job\n");
          result.failures.push_back(r);
          stop_job();
        } else if (!stopping) {
          std::fprintf(stderr, "tarantella: worker rank %d (host %s, local rank %d) ended: %s; parameter-server "
                       "training goes on without it\n", r.rank, r.host.c_str(), r.local_rank, describe_status(r).c_str());
        }
      } else if (r.failed()) {
        if (result.failures.empty()) {
          for (const auto& [rank, report] : stopped_now) {
            if (rank != r.rank) result.stopped_at_first_failure.push_back(report);
          }
          for (const auto& [rank, when] : continued_at) {
            if (rank != r.rank && now - when.second <= kContinuedRecently)
              result.stopped_at_first_failure.push_back(when.first);
          }
          std::sort(result.stopped_at_first_failure.begin(), result.stopped_at_first_failure.end(),
                    [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
        }
        result.failures.push_back(r);
        // mpirun --enable-recovery ends nothing itself.
        if (!expendable.empty() && !stopping) stop_job();
      }
      if (r.kind == RankReport::Kind::stopped) {
        stopped_now[r.rank] = r;
        stopped_since[r.rank] = now;
        continued_at.erase(r.rank);
      }
      if (r.kind == RankReport::Kind::continued) {
        auto it = stopped_now.find(r.rank);
        if (it != stopped_now.end() && now - stopped_since[r.rank] >= kLongStop) continued_at[r.rank] = {it->second, now};
      }
      if (r.kind == RankReport::Kind::ended && !r.failed()) continued_at.erase(r.rank);
      if (r.kind == RankReport::Kind::continued || r.kind == RankReport::Kind::ended) stopped_now.erase(r.rank);
      if (r.kind == RankReport::Kind::started) result.started.insert(r.rank);
      if (r.kind == RankReport::Kind::started) started_at.emplace(r.rank, now);
      if (r.kind == RankReport::Kind::stop_requested) result.stop_requested = true;
      if (r.kind != RankReport::Kind::started && r.kind != RankReport::Kind::stopped &&
          r.kind != RankReport::Kind::continued) {
        past_start.insert(r.rank);
      }
      result.reported.insert(r.rank);
      if (watch) watch->record(r, now);
    }
  };
  bool done = false;
  bool init_wait_said = false, finalize_wait_said = false;
  auto last_return = Clock::now();  // when the last poll returned
  std::vector<int> lifeline_fds;
  std::vector<pollfd> fds;
  while (!done) {
    lifeline_fds.clear();
    if (lifelines) lifelines->poll_fds(lifeline_fds);
    fds.assign({{sfd, POLLIN, 0}, {server ? server->fd() : -1, POLLIN, 0}, {err_fd, POLLIN, 0}});
    for (int fd : lifeline_fds) fds.push_back({fd, POLLIN, 0});
    if (out) out->poll_fds(fds);
    // Wake for the SIGKILL of a stop under way, for the watch's next deadline, for the
    // lifelines' heartbeats and for a stop because ranks were lost.
    Clock::time_point wake = std::min({kill_at, lost_stop_at, flush_at});
    if (!held_warnings.empty()) wake = std::min({wake, held_until, warnings_go_at()});
    if (watch && !result.interrupted_by && !result.verdict) wake = std::min(wake, watch->next_check());
    if (lifelines) wake = std::min(wake, lifelines->next_wake());
    int timeout = max_sleep_ms;
    if (wake != Clock::time_point::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count();
      timeout = static_cast<int>(std::clamp<long long>(left + 1, 0, max_sleep_ms));
    }
    const int polled = ::poll(fds.data(), fds.size(), timeout);
    // From the last poll's return: a stop in the work between two polls counts too.
    if (const auto late = Clock::now() - (last_return + std::chrono::milliseconds(timeout)); late > pause_gap) {
      launcher_paused(late);
    }
    last_return = Clock::now();
    if (polled < 0 && errno != EINTR) {
      // Cannot watch any more: just wait, still relaying mpirun's standard error (a full
      // pipe would stop mpirun, and this wait with it).
      while (::waitpid(child, &result.mpirun_status, WNOHANG) == 0) {
        relay();
        ::usleep(10000);
      }
      break;
    }
    relay();
    if ((out && out->service()) || (stderr_error != 0 && !result.output_closed)) output_closed(true);
    service_lifelines();
    if (server && (fds[1].revents & POLLIN)) take_reports();
    if (!held_warnings.empty() && (warnings_go_at() <= Clock::now() || Clock::now() >= held_until)) {
      release_warnings();
    }
    if (Clock::now() >= lost_stop_at) {
      lost_stop_at = Clock::time_point::max();
      if (kill_at == Clock::time_point::max() && !result.interrupted_by) {
        std::fprintf(stderr, "tarantella: %s lost, and mpirun has not ended the job %lld s later; ending it\n",
                     describe_ranks(result.news()).c_str(),
                     static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(lost_grace).count()));
        stop_job();
      }
    }

    signalfd_siginfo info{};
    while (::read(sfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;
      if (sig == SIGUSR1 || sig == SIGUSR2) {
        if (warnings_go_at() > Clock::now()) {
          held_warnings.push_back(sig);
          if (held_until == Clock::time_point::max()) held_until = Clock::now() + std::chrono::minutes(1);
        } else {
          pass_on(sig);
        }
        continue;
      }
      if (!result.interrupted_by) {
        result.interrupted_by = sig;
        result.failures_before_interrupt = result.failures.size();
        std::fprintf(stderr, "tarantella: SIG%s received, stopping the job\n", ::sigabbrev_np(sig));
        // A job interrupted because it seemed to hang: what it waited for, if known.
        // Not a wait of under a few seconds: a Ctrl-C in the first second is no hang.
        if (watch) {
          const auto now = Clock::now();
          for (const auto& w : {watch->init_wait(now), watch->finalize_wait(now)}) {
            if (w && now - w->since >= interrupt_wait_notice) std::fprintf(stderr, "tarantella: %s\n", w->message.c_str());
          }
          if (auto s = watch->stopped_ranks(now)) std::fprintf(stderr, "tarantella: %s\n", s->c_str());
        }
        // SI_KERNEL: the terminal signalled the whole process group, mpirun included. A
        // stop the watch or the launcher began already runs its course: a second SIGTERM
        // would make mpirun leave its ranks behind. After a rank's failure mpirun is ending
        // the job already, and a signal then makes Open MPI 4.1's mpirun crash on the way
        // (a backtrace and a core file): it gets its grace, then SIGKILL.
        if (!result.verdict && !stopping) {
          if (info.ssi_code != SI_KERNEL && result.failed_before_interrupt() == nullptr) ::kill(child, SIGTERM);
          kill_at = Clock::now() + stop_grace;
        }
        stopping = true;
      } else {
        ::kill(child, SIGKILL);  // asked twice: no more waiting
        asked_twice = true;
      }
    }
    if (watch && !init_wait_said && !result.interrupted_by && !result.verdict) {
      if (auto w = watch->init_wait(Clock::now()); w && Clock::now() - w->since >= init_wait_notice) {
        std::fprintf(stderr, "tarantella: %s\n", w->message.c_str());
        init_wait_said = true;
      }
    }
    if (watch && !finalize_wait_said && !result.interrupted_by && !result.verdict) {
      if (auto w = watch->finalize_wait(Clock::now()); w && Clock::now() - w->since >= init_wait_notice) {
        std::fprintf(stderr, "tarantella: %s\n", w->message.c_str());
        finalize_wait_said = true;
      }
    }
    if (watch && !result.interrupted_by && !result.verdict) {
      if (auto verdict = watch->check(Clock::now())) {
        std::fprintf(stderr, "tarantella: %s; ending the job\n", verdict->message.c_str());
        result.verdict = std::move(verdict);
        if (!result.failures.empty() && kill_at == Clock::time_point::max()) {
          // mpirun is ending the job after the failure already: a signal would make Open MPI
          // 4.1's crash on the way. Killed at once, as for an unreachable host; the steps see
          // it gone and end their programs, and what is left here is ended below.
          stopping = true;
          ::kill(child, SIGKILL);
          kill_at = Clock::time_point::max() - Clock::duration(1);
        } else {
          stop_job();
        }
      }
    }
    if (Clock::now() >= kill_at) {
      ::kill(child, SIGKILL);
      kill_at = Clock::time_point::max();
    }
    int status = 0;
    if (::waitpid(child, &status, WNOHANG) == child) {
      result.mpirun_status = status;
      done = true;
    }
  }
  // The rest of mpirun's standard error, before the launcher's own account of the job.
  const auto drain_until = Clock::now() + stderr_drain;
  while (err_fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(drain_until - Clock::now()).count();
    if (left <= 0) break;
    pollfd pfd{err_fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left)) < 0 && errno != EINTR) break;
    relay();
  }
  if (err_fd >= 0) ::close(err_fd);
  // The rest of mpirun's standard output: a reader found gone only now lost the job's last
  // words (as a pipeline's writer would end with SIGPIPE).
  // A slow reader is waited for until a stop signal (SIGCHLD and the forwarded ones are
  // read and passed over); after a stop, for the drain time only.
  int drain_stop = 0;
  const auto stop_read = [&] {
    signalfd_siginfo info{};
    while (::read(sfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (is_stop_signal(sig)) drain_stop = sig;
    }
    return drain_stop != 0;
  };
  if (out && out->finish(Clock::now() + stderr_drain, result.interrupted_by ? -1 : sfd, stop_read)) {
    output_closed(false);  // a failed write says so there
    if (result.output_error == 0) {
      std::fprintf(stderr, "tarantella: the standard output was closed by its reader before the job's output "
                   "ended\n");
    }
  }
  if (drain_stop != 0) {
    // The last output waited for a reader that did not read: the launcher ends by the signal.
    std::fprintf(stderr, "tarantella: %s received while the job's last output waited for its reader: the rest is "
                 "dropped\n", signal_name(drain_stop).c_str());
  }
  to_stderr(filter.flush());
  to_stderr(filter.finish());  // errors that several ranks printed alike: the others, in one line
  if (stderr_error != 0) output_closed(false);
  result.mpirun_messages = filter.held_back();
  result.host_problems = filter.host_problems();
  result.daemons_failed = filter.daemons_failed();
  result.improper_exit_rank = filter.improper_exit_rank();
  // Reports are sent before a rank exits, and mpirun exits after its ranks: whatever is
  // left is already queued.
  service_lifelines();
  if (server) take_reports();
  ended = true;
  end_children(0, asked_twice ? std::chrono::milliseconds(100) : leftover_grace);  // asked twice: no grace
  remove_ompi_leftovers(child);  // what an mpirun killed or aborted left on this host
  // Signals that came while the job ended are taken (unblocked, they would end the launcher
  // before its report); after a failure a first one stops the restart, after a clean end not.
  for (signalfd_siginfo info{}; ::read(sfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info);) {
    if (const int sig = static_cast<int>(info.ssi_signo); is_stop_signal(sig) && !result.interrupted_by) {
      std::fprintf(stderr, "tarantella: %s received after the job had ended\n", signal_name(sig).c_str());
      if (!result.failures.empty()) result.interrupted_by = sig;
      result.failures_before_interrupt = result.failures.size();
    }
  }
  if (drain_stop != 0) ::raise(drain_stop);
  ::close(sfd);
  ::sigprocmask(SIG_SETMASK, &original, nullptr);
  return result;
}

}  // namespace tnt::launcher
