#include "job.hpp"

#include "error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tnt::launcher {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
// mpirun needs about a second to stop its ranks; past this it and its group are killed.
constexpr auto stop_grace = std::chrono::milliseconds(3000);

[[noreturn]] void exec_mpirun(const std::vector<std::string>& command, pid_t launcher, const sigset_t& original) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != launcher) ::_exit(128 + SIGTERM);
  ::sigprocmask(SIG_SETMASK, &original, nullptr);
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  std::fprintf(stderr, "tarantella: cannot run %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

}  // namespace

JobResult run_job(const std::vector<std::string>& command, ReportServer* server, RankWatch* watch) {
  // An explicit kill must stop the job even when the shell started us with SIGINT
  // ignored (background jobs of scripts); a SIGHUP ignored by nohup stays ignored.
  for (int sig : {SIGINT, SIGTERM, SIGQUIT}) ::signal(sig, SIG_DFL);

  sigset_t handled, original;
  sigemptyset(&handled);
  for (int sig : stop_signals) sigaddset(&handled, sig);
  sigaddset(&handled, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &handled, &original);
  const int sfd = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) throw system_error("signalfd");

  const pid_t self = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(sfd);
    throw system_error("fork");
  }
  if (child == 0) exec_mpirun(command, self, original);

  JobResult result;
  // When mpirun gets SIGKILL; max() while no stop is under way.
  Clock::time_point kill_at = Clock::time_point::max();
  auto stop_job = [&] {
    ::kill(child, SIGTERM);
    kill_at = Clock::now() + stop_grace;
  };
  auto take_reports = [&] {
    std::vector<RankReport> reports;
    server->accept_pending(reports);
    const auto now = Clock::now();
    for (const auto& r : reports) {
      if (r.failed()) result.failures.push_back(r);
      if (watch) watch->record(r, now);
    }
  };
  bool done = false;
  while (!done) {
    pollfd fds[2] = {{sfd, POLLIN, 0}, {server ? server->fd() : -1, POLLIN, 0}};
    // Wake for the SIGKILL of a stop under way, or for the watch's next deadline.
    Clock::time_point wake = kill_at;
    if (watch && !result.interrupted_by && !result.verdict) wake = std::min(wake, watch->next_check());
    int timeout = -1;
    if (wake != Clock::time_point::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count();
      timeout = static_cast<int>(std::clamp<long long>(left + 1, 0, 24LL * 3600 * 1000));
    }
    if (::poll(fds, 2, timeout) < 0 && errno != EINTR) {
      ::waitpid(child, &result.mpirun_status, 0);  // cannot watch any more: just wait
      break;
    }
    if (server && (fds[1].revents & POLLIN)) take_reports();

    signalfd_siginfo info{};
    while (::read(sfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;
      if (!result.interrupted_by) {
        result.interrupted_by = sig;
        std::fprintf(stderr, "tarantella: SIG%s received, stopping the job\n", ::sigabbrev_np(sig));
        // SI_KERNEL: the terminal signalled the whole process group, mpirun included. A
        // stop the watch began already runs its course: a second SIGTERM would make
        // mpirun leave its ranks behind.
        if (!result.verdict) {
          if (info.ssi_code != SI_KERNEL) ::kill(child, SIGTERM);
          kill_at = Clock::now() + stop_grace;
        }
      } else {
        ::kill(child, SIGKILL);  // asked twice: no more waiting
      }
    }
    if (watch && !result.interrupted_by && !result.verdict) {
      if (auto verdict = watch->check(Clock::now())) {
        std::fprintf(stderr, "tarantella: %s; ending the job\n", verdict->message.c_str());
        result.verdict = std::move(verdict);
        stop_job();
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
  // Reports are sent before a rank exits, and mpirun exits after its ranks: whatever is
  // left is already queued.
  if (server) take_reports();
  ::close(sfd);
  ::sigprocmask(SIG_SETMASK, &original, nullptr);
  return result;
}

}  // namespace tnt::launcher
