#include "rank_setup.hpp"

#include "env_names.hpp"
#include "error.hpp"
#include "gpus.hpp"
#include "lifeline.hpp"
#include "native_libs.hpp"
#include "paths.hpp"
#include "processes.hpp"
#include "report.hpp"
#include "text.hpp"
#include "topology.hpp"

#include <sched.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <fcntl.h>
#include <functional>
#include <fstream>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tnt::launcher {

namespace {

void apply_binding(const RankBinding& b, PinMode mode) {
  const Numa& numa = Numa::get();
  if (numa.available() < 0) throw SystemError("cannot bind: the kernel has no NUMA support (libnuma)");
  // The step is single-threaded here, so what is set now is what the program inherits:
  // the CPU mask and the memory policy both survive fork and exec.
  bitmask* cpus = numa.allocate_cpumask();
  for (unsigned cpu : b.cpus) numa.bitmask_setbit(cpus, cpu);
  const int rc = numa.sched_setaffinity(0, cpus);
  const int err = errno;
  numa.bitmask_free(cpus);
  if (rc != 0) {
    throw SystemError(fmt::format("cannot bind to cpus {}: {}", format_cpu_list(b.cpus), std::strerror(err)));
  }
  bitmask* nodes = numa.allocate_nodemask();
  numa.bitmask_setbit(nodes, b.numa_node);
  if (mode == PinMode::socket) {
    numa.set_preferred(static_cast<int>(b.numa_node));
  } else {
    numa.set_membind(nodes);
  }
  numa.bitmask_free(nodes);

  // libnuma reports failures on stderr rather than to the caller, so read back what the
  // kernel holds now: the rank must run exactly as the plan says, or not at all.
  cpu_set_t now;
  CPU_ZERO(&now);
  if (::sched_getaffinity(0, sizeof now, &now) != 0) throw system_error("sched_getaffinity");
  std::vector<unsigned> got;
  for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &now)) got.push_back(c);
  }
  if (got != b.cpus) {
    throw SystemError(fmt::format("bound to cpus {} instead of {}", format_cpu_list(got), format_cpu_list(b.cpus)));
  }
  int policy = -1;
  unsigned long mask[16] = {};
  if (numa.get_mempolicy(&policy, mask, sizeof(mask) * 8, nullptr, 0) != 0) throw system_error("get_mempolicy");
  const int wanted = mode == PinMode::socket ? MPOL_PREFERRED : MPOL_BIND;
  const bool on_node = b.numa_node < sizeof(mask) * 8 && ((mask[b.numa_node / 64] >> (b.numa_node % 64)) & 1UL) != 0;
  const int mode_flags = (1 << 15) | (1 << 14) | (1 << 13);  // MPOL_F_STATIC/RELATIVE_NODES, NUMA_BALANCING
  if ((policy & ~mode_flags) != wanted || !on_node) {
    throw SystemError(fmt::format("cannot set the memory policy to {} on NUMA node {}",
                                  mode == PinMode::socket ? "preferred" : "bind", b.numa_node));
  }
}

// Signals mpirun may send to a rank that the program must get too.
constexpr int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT};
constexpr int stop_grace_ms = 2000;
// What the program leaves running when it ends gets SIGTERM, then SIGKILL this much later.
constexpr int leftover_grace_ms = 1000;

bool is_termination(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT; }

// The program runs as the leader of its own process group (its id is the program's PID),
// so everything it starts and does not move elsewhere can be signalled at once.
//
// Termination signals and SIGCONT go to the whole group, as a shell's job control does: a
// program's helpers stop with it, and a stopped group resumes together. SIGUSR1 and SIGUSR2
// (whose default action kills) go to the program alone, which decides what its helpers get.
// A termination signal is followed by SIGCONT, so that a stopped program acts on it.
void forward(pid_t group, int sig) {
  if (is_termination(sig) || sig == SIGCONT) {
    ::kill(-group, sig);
    if (sig != SIGCONT) ::kill(-group, SIGCONT);
  } else {
    ::kill(group, sig);
  }
}

// `exec_status` is the write end of a close-on-exec pipe: it closes unwritten when exec
// succeeds, and carries errno when the program could not be started.
[[noreturn]] void not_started(int exec_status, int err, int code) {
  [[maybe_unused]] auto n = ::write(exec_status, &err, sizeof err);
  ::_exit(code);
}

// The core file size limit the launcher had (mpirun ran without one: env::core_limit),
// given back to the program, within the hard limit this process has.
void restore_core_limit() {
  const char* text = std::getenv(env::core_limit);
  if (text == nullptr) return;
  rlimit core{};
  if (::getrlimit(RLIMIT_CORE, &core) == 0) {
    const rlim_t want = std::string(text) == "unlimited" ? RLIM_INFINITY : std::strtoull(text, nullptr, 10);
    core.rlim_cur = core.rlim_max == RLIM_INFINITY ? want : std::min(want, core.rlim_max);
    ::setrlimit(RLIMIT_CORE, &core);
  }
  ::unsetenv(env::core_limit);
}

[[noreturn]] void exec_program(const std::vector<std::string>& program, pid_t monitor, int exec_status,
                                int join_fd) {
  restore_core_limit();
  // Die with the step: without this a step killed by SIGKILL leaves its program behind.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != monitor) not_started(exec_status, ESRCH, 128 + SIGKILL);
  // The step calls setpgid too; whichever runs first, the group exists before the program
  // runs and before the step signals it.
  ::setpgid(0, 0);
  for (int sig : forwarded) ::signal(sig, SIG_DFL);
  ::signal(SIGCHLD, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (join_fd >= 0) ::fcntl(join_fd, F_SETFD, 0);  // the one descriptor the program inherits

  std::vector<char*> argv;
  for (const auto& a : program) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int err = errno;
  std::fprintf(stderr, "tarantella: cannot run '%s' on %s: %s\n", argv[0], this_host_name().c_str(),
               exec_failure_reason(program.front(), err).c_str());
  not_started(exec_status, err, err == ENOENT ? 127 : 126);
}

// Leaves the way the program left, so mpirun's view of the rank is the program's.
[[noreturn]] void exit_like(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);  // the program's core (if any) is the one that matters
    ::signal(sig, SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    ::sigprocmask(SIG_UNBLOCK, &only, nullptr);
    ::raise(sig);
    ::_exit(128 + sig);
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

// Reaps every child that has ended; returns the program's status once it has ended. The
// program's stops and continues (WUNTRACED, WCONTINUED) go to `changed`.
std::optional<int> reap_children(pid_t program, const std::function<void(int)>& changed = {}) {
  std::optional<int> program_status;
  int status = 0;
  pid_t pid = 0;
  while ((pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED)) > 0) {
    if (pid != program) continue;  // a process the program abandoned: reaped, or its stop is not news
    if (WIFSTOPPED(status) || WIFCONTINUED(status)) {
      if (changed) changed(status);
    } else {
      program_status = status;
    }
  }
  return program_status;
}

// The step's side of the report channel (report.hpp). `started` is retried for a while
// when the launcher cannot be reached, because a launcher that never hears it ends the
// job once its start timeout has passed.
class Reporter {
 public:
  using Clock = std::chrono::steady_clock;

  Reporter(std::string address, const RankIdentity& id, std::string host)
      : address_(std::move(address)), host_(std::move(host)), id_(id) {}

  bool send(RankReport::Kind kind, bool signaled, int code, bool wait_until_read) {
    if (address_.empty()) return false;
    RankReport r{id_.rank, id_.local_rank, host_, signaled, code, kind};
    return send_report(address_, host_, r, wait_until_read);
  }

  void started() {
    if (address_.empty() || send(RankReport::Kind::started, false, 0, false)) return;
    retries_left_ = started_retries;
    next_try_ = Clock::now() + retry_interval;
  }

  // From the monitor's loop: tries `started` again when it is due.
  void retry() {
    if (retries_left_ == 0 || Clock::now() < next_try_) return;
    if (send(RankReport::Kind::started, false, 0, false)) {
      retries_left_ = 0;
      return;
    }
    next_try_ = Clock::now() + retry_interval;
    if (--retries_left_ == 0) {
      std::fprintf(stderr, "tarantella: rank %d on %s cannot reach the launcher at %s to report its start; the "
                   "launcher will end the job when its start timeout passes\n", id_.rank, host_.c_str(),
                   address_.c_str());
    }
  }

 private:
  static constexpr int started_retries = 5;
  static constexpr auto retry_interval = std::chrono::seconds(1);
  std::string address_, host_;
  RankIdentity id_;
  int retries_left_ = 0;
  Clock::time_point next_try_{};
};

// The runtime's word that it enters MPI_Init ('e'), has left it ('j') and enters
// MPI_Finalize ('f'), that a fit stopped on request ('s'), that a worker enters ('P') or
// leaves ('p') parameter-server training, on the pipe whose write end the program inherits (env::join_fd),
// passed on to the launcher once each.
class JoinWatch {
 public:
  explicit JoinWatch(int fd) : fd_(fd) {}
  ~JoinWatch() {
    if (fd_ >= 0) ::close(fd_);
  }
  JoinWatch(const JoinWatch&) = delete;
  JoinWatch& operator=(const JoinWatch&) = delete;

  // Reads what is there without waiting.
  void poll(Reporter& reporter) {
    char buf[16];
    while (fd_ >= 0) {
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n > 0) {
        for (ssize_t i = 0; i < n; ++i) {
          if ((buf[i] == 'e' || buf[i] == 'j') && !joining_) {
            joining_ = true;
            reporter.send(RankReport::Kind::joining, false, 0, false);
          }
          if (buf[i] == 'j' && !joined_) {
            joined_ = true;
            reporter.send(RankReport::Kind::joined, false, 0, false);
          }
          if (buf[i] == 'f' && !finalizing_) {
            finalizing_ = true;
            reporter.send(RankReport::Kind::finalizing, false, 0, false);
          }
          if (buf[i] == 's' && !stop_requested_) {
            stop_requested_ = true;
            reporter.send(RankReport::Kind::stop_requested, false, 0, false);
          }
          // Each parameter-server fit of a program: its loss is survived only in there.
          if (buf[i] == 'P') reporter.send(RankReport::Kind::ps_begin, false, 0, false);
          if (buf[i] == 'p') reporter.send(RankReport::Kind::ps_end, false, 0, false);
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      ::close(fd_);  // end of file: nothing holds the write end any more
      fd_ = -1;
    }
  }

 private:
  int fd_ = -1;
  bool joining_ = false, joined_ = false, finalizing_ = false, stop_requested_ = false;
};

// After the program has ended: ends what it left running, that is its process group and
// whatever was re-parented to the step, so that a rank leaves nothing behind (and mpirun,
// which waits for a rank's output to close, is not kept waiting by a child that holds it).
void end_leftovers(pid_t group) { end_children(group, std::chrono::milliseconds(leftover_grace_ms)); }

// A rank cut off from the launcher: its Open MPI daemon (the front's parent on a host other
// than the launcher's) would wait for mpirun forever, so the step ends it once its own
// program has ended: SIGTERM (the daemon then ends its other ranks' steps, which end their
// programs), SIGKILL 2 s later. Only a daemon that is still the front's parent and is an
// Open MPI daemon: mpirun, the launcher's child, is left to the launcher.
void end_cut_off_daemon(pid_t front, pid_t daemon) {
  if (daemon <= 1 || ::getppid() != front) return;
  const auto front_stat = read_stat(front);
  if (!front_stat || front_stat->ppid != daemon) return;
  std::ifstream comm("/proc/" + std::to_string(daemon) + "/comm");
  std::string name;
  std::getline(comm, name);
  if (name != "orted" && name != "prted") return;
  const auto daemon_start = read_stat(daemon);
  if (!daemon_start) return;
  using Clock = std::chrono::steady_clock;
  ::kill(daemon, SIGTERM);
  const auto term_deadline = Clock::now() + std::chrono::seconds(2);
  const auto give_up = term_deadline + std::chrono::seconds(1);
  bool killed = false;
  while (Clock::now() < give_up) {
    const auto st = read_stat(daemon);
    // Gone, a zombie, or its PID already another process's.
    if (!st || st->state == 'Z' || st->start_time != daemon_start->start_time) return;
    if (!killed && Clock::now() >= term_deadline) {
      ::kill(daemon, SIGKILL);
      killed = true;
    }
    timespec tick{0, 20'000'000};
    ::nanosleep(&tick, nullptr);
  }
}

// The front half of the step (rank_setup.hpp): what mpirun started and signals. It passes
// every signal on to the back, sends it SIGTERM when mpirun (or its daemon) is gone, and
// exits exactly as the back did, which exits as the program did.
[[noreturn]] void run_front(pid_t back, pid_t daemon, const sigset_t& handled) {
  bool orphaned = false;
  while (true) {
    timespec tick{0, 250'000'000};  // how often to notice that mpirun has gone
    siginfo_t info{};
    const int sig = ::sigtimedwait(&handled, &info, &tick);
    if (sig > 0 && sig != SIGCHLD) ::kill(back, sig);
    int status = 0;
    if (::waitpid(back, &status, WNOHANG) == back) exit_like(status);
    if (!orphaned && ::getppid() != daemon) {
      orphaned = true;
      ::kill(back, SIGTERM);
    }
  }
}

// Waits for the program to end, passing on signals, telling the launcher when the program
// stops and continues, and stopping it when mpirun goes away or the lifeline says that the
// launcher is gone or cut off (`launcher` then holds which). Returns its wait status.
// drop_after_s > 0 (a worker of parameter-server training: the servers' worker timeout): a
// program stopped for twice that is ended, as the servers have dropped it and no one else
// can end it on this host, and the job would wait for it for ever.
int monitor(pid_t child, const sigset_t& handled, Reporter& reporter, JoinWatch& join, LifelineClient& lifeline,
            LifelineClient::State& launcher, const RankIdentity& id, const std::string& host, double drop_after_s) {
  using Clock = std::chrono::steady_clock;
  const pid_t parent = ::getppid();
  // Often enough for the lifeline's heartbeats (a sixth of its timeout, at least 0.1 s).
  const long tick_ns = lifeline.connected()
                           ? std::min<long>(250'000'000, heartbeat_interval(lifeline.timeout_s()).count() * 1'000'000L)
                           : 250'000'000;
  bool stopping = false, killed = false, front_gone = false;
  Clock::time_point kill_at{};  // when a stopping program gets SIGKILL
  std::optional<Clock::time_point> stopped_at;  // the program is stopped since
  auto stop = [&](int grace_ms) {
    if (stopping) return;
    stopping = true;
    kill_at = Clock::now() + std::chrono::milliseconds(grace_ms);
  };
  while (true) {
    timespec tick{0, tick_ns};  // how often to notice that mpirun has gone
    siginfo_t info{};
    const int sig = ::sigtimedwait(&handled, &info, &tick);
    if (sig == SIGCHLD || sig < 0) {
      auto changed = [&](int status) {
        if (WIFSTOPPED(status)) {
          reporter.send(RankReport::Kind::stopped, false, WSTOPSIG(status), false);
          stopped_at = Clock::now();
        } else {
          reporter.send(RankReport::Kind::continued, false, 0, false);
          stopped_at.reset();
        }
      };
      if (auto status = reap_children(child, changed)) return *status;
    }
    reporter.retry();
    join.poll(reporter);
    // A signal the front passed on first (a normal stop: mpirun's SIGTERM before its SIGKILL).
    if (sig > 0 && sig != SIGCHLD) {
      forward(child, sig);
      if (is_termination(sig)) stop(stop_grace_ms);
    }
    // Orphaned: the step's front (the process mpirun started) was killed, as only SIGKILL
    // does; the program's SIGTERM (from here, or from the job's stop that followed) is not
    // its own failure.
    if (!stopping && !front_gone && ::getppid() != parent) {
      front_gone = true;
      std::fprintf(stderr, "tarantella: rank %d on %s: its per-rank step (the process mpirun started) was killed; "
                   "ending its program with SIGTERM\n", id.rank, host.c_str());
    }
    if (sig < 0 && !stopping && front_gone) {
      // No one else will stop the program.
      forward(child, SIGTERM);
      stop(stop_grace_ms / 2);
    }
    const auto state = lifeline.service(Clock::now());
    if ((state == LifelineClient::State::closed || state == LifelineClient::State::unreachable) &&
        launcher == LifelineClient::State::alive) {
      launcher = state;
      if (!stopping) {
        std::fprintf(stderr, "tarantella: rank %d on %s: %s; ending its program\n", id.rank, host.c_str(),
                     state == LifelineClient::State::closed
                         ? "the launcher has gone (its lifeline closed)"
                         : fmt::format("no heartbeat from the launcher for {:g} s (--heartbeat-timeout): it is down or "
                                       "cut off from this host", lifeline.timeout_s()).c_str());
        forward(child, SIGTERM);
        stop(stop_grace_ms);
      }
    }
    if (stopped_at && drop_after_s > 0 && !stopping &&
        Clock::now() - *stopped_at > std::chrono::duration<double>(2 * drop_after_s)) {
      std::fprintf(stderr, "tarantella: rank %d on %s: its program has been stopped for more than %g s, twice the "
                   "parameter servers' worker timeout (--heartbeat-timeout), so they have dropped it; ending it "
                   "(SIGKILL) so that the job can end\n", id.rank, host.c_str(), 2 * drop_after_s);
      stopping = true;
      kill_at = Clock::now();
    }
    if (stopping && !killed && Clock::now() >= kill_at) {
      ::kill(-child, SIGKILL);
      killed = true;
    }
  }
}

}  // namespace

namespace {

int run_rank_step(const RankStepArgs& args, const Environment& env, const RankIdentity& id, const std::string& host) {
  std::string device = "cpu";
  const auto servers = env.find(env::ps_servers);
  const bool server = servers != env.end() && is_ps_server(servers->second, id.rank);
  if (args.device == DeviceKind::gpu && !server) {
    const int gpus = count_gpus(env);
    if (gpus == 0) {
      throw SystemError(fmt::format("rank {} on {}: the launcher planned GPU ranks, but this host has no GPU "
                                    "(use --no-gpu for CPU ranks)", id.rank, host));
    }
    device = device_name(DeviceKind::gpu, id.local_rank, gpus);
  }

  std::optional<RankBinding> binding;
  if (args.pin != PinMode::none) {
    NodeTopology topology = load_topology();
    if (!topology.this_system) {
      throw SystemError(fmt::format("rank {} on {}: hwloc reports {} instead of this machine; cannot bind",
                                    id.rank, host, topology.source));
    }
    binding = plan_node_bindings(topology, id.local_size).ranks[static_cast<size_t>(id.local_rank)];
    apply_binding(*binding, args.pin);
  }

  // TNT_NUM_THREADS given by the user (-x, or the launcher's environment) stays as given: a
  // pinned rank's cores are only its default (the runtime warns when the value asks for more
  // cores than the rank may run on).
  const bool user_threads = !lookup(env, env::num_threads).value_or("").empty();
  for (const auto& [name, value] : rank_variables(id, device, binding)) {
    if (user_threads && name == env::num_threads) continue;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  // An unpinned rank has no NUMA node: a value inherited from outside must not say one.
  if (!binding) ::unsetenv(env::numa_node);
  // OpenMP threads that spin while they wait take the cores that the gradient
  // communication thread and the other ranks need; wait passively unless the user chose.
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  const std::string report_to = lookup(env, env::report_address).value_or("");
  ::unsetenv(env::report_address);

  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : forwarded) sigaddset(&handled, sig);
  sigaddset(&handled, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &handled, nullptr);

  // The step splits here into the front, which mpirun knows, and the back, which runs the
  // rest in a process group of its own (rank_setup.hpp).
  const pid_t daemon = ::getppid();
  const pid_t front = ::getpid();
  const pid_t back = ::fork();
  if (back < 0) throw system_error("fork");
  if (back > 0) {
    ::setpgid(back, back);
    run_front(back, daemon, handled);
  }
  ::setpgid(0, 0);
  // A front killed before this point started nothing that could be left behind.
  if (::getppid() != front) ::_exit(128 + SIGKILL);

  // A subreaper: what the program starts and abandons is re-parented to the step rather
  // than to init, so the step can still end it when the program is done.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  int exec_status[2];
  if (::pipe2(exec_status, O_CLOEXEC) != 0) throw system_error("pipe2");
  // Without the pipe the rank is only watched as a program without the runtime is.
  int join[2] = {-1, -1};
  if (!report_to.empty() && ::pipe2(join, O_CLOEXEC | O_NONBLOCK) == 0) {
    ::setenv(env::join_fd, std::to_string(join[1]).c_str(), 1);
  } else {
    ::unsetenv(env::join_fd);
  }
  const pid_t self = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) throw system_error("fork");
  if (child == 0) {
    ::close(exec_status[0]);
    exec_program(args.program, self, exec_status[1], join[1]);
  }
  if (join[1] >= 0) ::close(join[1]);
  JoinWatch join_watch(join[0]);
  ::setpgid(child, child);
  ::close(exec_status[1]);
  // End of file: exec succeeded and the program runs. (Signals are blocked, so the read is
  // not interrupted; it waits only as long as the exec takes.)
  int exec_errno = 0;
  ssize_t n = 0;
  do {
    n = ::read(exec_status[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  ::close(exec_status[0]);
  Reporter reporter(report_to, id, host);
  if (n == 0) reporter.started();
  LifelineClient lifeline(n == 0 ? report_to : std::string(), host, id.rank, id.local_rank);
  if (n == 0 && !lifeline.connected() && !report_to.empty()) {
    if (auto a = parse_launcher_address(report_to); a && a->heartbeat_s > 0) {
      std::fprintf(stderr, "tarantella: rank %d on %s cannot reach the launcher for its lifeline; if the launcher's "
                   "host goes away, this rank will not notice\n", id.rank, host.c_str());
    }
  }
  LifelineClient::State launcher = lifeline.connected() ? LifelineClient::State::alive : LifelineClient::State::none;

  double drop_after_s = 0;  // a parameter-server worker's (monitor)
  if (servers != env.end() && !server) drop_after_s = std::atof(lookup(env, env::ps_worker_timeout_s).value_or("0").c_str());
  const int status = monitor(child, handled, reporter, join_watch, lifeline, launcher, id, host, drop_after_s);
  join_watch.poll(reporter);  // what the program said just before it ended comes before its end
  const RankReport ended{id.rank, id.local_rank, host, WIFSIGNALED(status),
                         WIFSIGNALED(status) ? WTERMSIG(status) : WIFEXITED(status) ? WEXITSTATUS(status) : 1};
  const bool launcher_gone =
      launcher == LifelineClient::State::closed || launcher == LifelineClient::State::unreachable;
  // Every end is reported, so the launcher knows which ranks still run; a failure waits
  // until the launcher has read it (report.hpp: the first report is the first failure).
  // A launcher that is gone hears nothing.
  const bool reported =
      !launcher_gone && reporter.send(RankReport::Kind::ended, ended.signaled, ended.code, ended.failed());
  if (!reported && launcher == LifelineClient::State::alive) {
    // The report did not get through, though the lifeline has not yet timed out: a host
    // cut off moments ago (whose program ended on its own collective timeout) looks like
    // this. Ask the lifeline, for at most its timeout, before leaving the daemon behind.
    launcher = lifeline.await_word();
  }
  if (ended.failed() && !reported && !launcher_gone) {
    std::fprintf(stderr, "tarantella: rank %d on %s: %s ended with %s\n", id.rank, host.c_str(),
                 args.program.front().c_str(), describe_status(ended).c_str());
  }
  lifeline.farewell();
  end_leftovers(child);
  if (launcher == LifelineClient::State::unreachable) end_cut_off_daemon(front, daemon);
  exit_like(status);
}

}  // namespace

int rank_step_main(const std::vector<std::string>& words) {
  const Environment env = current_environment();
  const std::string host = this_host_name();
  RankIdentity id;
  bool known = false;
  try {
    id = rank_identity(env);
    known = true;
    return run_rank_step(parse_rank_step_arguments(words), env, id, host);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tarantella: error: rank %s on %s: %s\n", known ? std::to_string(id.rank).c_str() : "?",
                 host.c_str(), e.what());
    // Counted as the rank failing with exit code 1, so the launcher names it.
    const std::string report_to = lookup(env, env::report_address).value_or("");
    if (known && !report_to.empty()) send_report(report_to, host, RankReport{id.rank, id.local_rank, host, false, 1});
    return 1;
  }
}

}  // namespace tnt::launcher
