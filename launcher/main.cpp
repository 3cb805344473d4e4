// tarantella: the launcher. Two programs in one binary: the launcher a user runs, and the
// hidden per-rank step (first argument __tnt_rank_step) that mpirun runs on every rank.
// Everything is checked before anything starts; only this file decides exit statuses.
#include "cli.hpp"
#include "env_names.hpp"
#include "error.hpp"
#include "exports.hpp"
#include "gpus.hpp"
#include "host_names.hpp"
#include "job.hpp"
#include "lifeline.hpp"
#include "local_checks.hpp"
#include "limits.hpp"
#include "mpirun_command.hpp"
#include "mpirun_output.hpp"
#include "paths.hpp"
#include "plan.hpp"
#include "predict.hpp"
#include "ps_plan.hpp"
#include "rank_watch.hpp"
#include "rank_setup.hpp"
#include "requeue.hpp"
#include "shell_words.hpp"

#include <tarantella/build_config.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string.h>  // sigabbrev_np
#include <sys/resource.h>
#include <algorithm>
#include <set>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tl = tnt::launcher;

namespace {

constexpr int exit_bad_input = 2;
// The launcher ended the job because ranks did not start or end in time (as timeout(1)).
constexpr int exit_timed_out = 124;
// The first failure was a rank lost or unreachable: there is no exit status to pass on.
constexpr int exit_lost = 1;
// A rank's program ended without joining the job while the others waited for it (no
// timeout: the launcher knew at once).
constexpr int exit_left = 1;
// The launcher itself was stopped for longer than the heartbeat timeout.
constexpr int exit_launcher_stopped = 1;
// mpirun said the job succeeded, but some ranks never ran.
constexpr int exit_not_run = 1;

void warn(const std::string& text) { std::fprintf(stderr, "tarantella: warning: %s\n", text.c_str()); }

std::string version_text() {
  std::string out = fmt::format("tarantella {}\n", TNT_VERSION);
  if (TNT_WITH_CUDA_BUILD) {
    out += fmt::format("  build: CUDA {}, cuDNN {}, NCCL {}\n", TNT_CUDA_VERSION, TNT_CUDNN_VERSION, TNT_NCCL_VERSION);
  } else {
    out += "  build: CPU only\n";
  }
  out += fmt::format("  MPI: {} (mpirun {})\n", TNT_MPI_VERSION, std::string(TNT_MPIEXEC).empty() ? "from PATH" : TNT_MPIEXEC);
  out += fmt::format("  hwloc: {}\n", TNT_HWLOC_VERSION);
  if (std::string(TNT_DNNL_VERSION).size()) out += fmt::format("  oneDNN: {}\n", TNT_DNNL_VERSION);
  return out;
}

struct Attempt {
  int status = 0;
  bool interrupted = false;  // by the user's signal: not restarted
  std::string futile;        // why a restart would fail the same way (tl::restart_futility); "": it may not
  std::optional<int> warned_by;  // the SIGUSR1/SIGUSR2 passed on to the ranks (--requeue)
  bool stop_requested = false;   // and a program stopped training on it
};

// "ranks 1, 2 on h2: lost (...)": a line per host and kind for the ranks the job lost; the
// ranks that went with the launcher's own stop of the job (`stopped`) are said to have.
void print_losses(const std::vector<tl::LostRank>& lost, bool stopped = false) {
  struct Group {
    std::string host;
    tl::LostRank::Kind kind;
    std::vector<int> ranks;
    const tl::LostRank* first;
  };
  std::vector<Group> groups;
  for (const auto& l : lost) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](auto& x) { return x.host == l.host && x.kind == l.kind; });
    if (g == groups.end()) {
      groups.push_back({l.host, l.kind, {l.rank}, &l});
    } else {
      g->ranks.push_back(l.rank);
    }
  }
  for (auto& g : groups) {
    std::sort(g.ranks.begin(), g.ranks.end());
    const bool one = g.ranks.size() == 1;
    const std::string ranks = fmt::format("{}", fmt::join(g.ranks, ", "));
    const std::string what = stopped ? "ended by the launcher's stop of the job (not a cause of the failure)"
                                     : tl::describe_lost(*g.first);
    std::fprintf(stderr, "tarantella: %s %s on %s: %s\n", one ? "rank" : "ranks", ranks.c_str(), g.host.c_str(),
                 what.c_str());
  }
}

// mpirun could not start the job on some hosts: a line per host that the launch agent said
// it could not reach, and why. `hosts`: the plan's other hosts. False when nobody said which.
bool print_unreached_hosts(const tl::JobResult& result, const std::vector<std::string>& hosts) {
  bool any = false;
  for (const auto& p : result.host_problems) {
    // A program of the job may use ssh itself: only the plan's hosts count, unless Open MPI
    // said its daemons did not start (the agent may know a host by another name).
    if (!result.daemons_failed && std::find(hosts.begin(), hosts.end(), p.host) == hosts.end()) continue;
    std::fprintf(stderr, "tarantella: host %s could not be reached, so mpirun could not start its daemon there: %s\n",
                 p.host.c_str(), p.said.c_str());
    any = true;
  }
  return any;
}

// The rank that Open MPI ended the job for, when it "exited improperly" with status 0 and
// every failure after it is a rank that mpirun ended (SIGTERM, or SIGKILL after it); else
// null. Without this the first rank mpirun ended would be named as the one that failed.
const tl::RankReport* improper_exit(const tl::JobResult& result) {
  if (!result.improper_exit_rank || result.failures.empty()) return nullptr;
  const tl::RankReport* end = nullptr;
  for (const tl::RankReport& r : result.ends) {
    if (r.rank == *result.improper_exit_rank) end = &r;
  }
  if (end == nullptr || end->failed()) return nullptr;
  for (const tl::RankReport& f : result.failures) {
    if (!f.signaled || (f.code != SIGTERM && f.code != SIGKILL)) return nullptr;
  }
  return end;
}

// The account of how a job that was not interrupted ended (printed here), and its status.
// `hosts`: the plan's hosts other than this machine; `mpirun` the command that ran the job.
// `reports`: whether the ranks had a report channel (so each rank's start is known).
int job_status(const tl::JobResult& result, const std::vector<std::string>& hosts, const std::string& mpirun,
               const std::vector<tl::RankSlot>& slots, bool reports, const std::optional<tl::PsRoles>& roles) {
  const int st = result.mpirun_status;
  const bool mpirun_failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  // Hosts mpirun could not start on: the launcher names them, and Open MPI's list of
  // possible causes is no news after that.
  if (mpirun_failed && result.failures.empty() && result.lost.empty() && !result.verdict &&
      (result.daemons_failed || !result.host_problems.empty()) && print_unreached_hosts(result, hosts)) {
    return exit_lost;
  }
  // What mpirun said about a failure is held back when a rank's program ended with its
  // own message and the launcher names that rank below; otherwise (ranks that did not
  // start, lost hosts, mpirun failing by itself) it may be the only account there is.
  // A parameter-server worker dropped (the launcher says so below) leaves Open MPI's PMIx
  // complaints on every rank: no account of anything, unless mpirun itself failed.
  if ((result.failures.empty() && (result.dropped.empty() || mpirun_failed)) || result.lost_first()) {
    std::fputs(result.mpirun_messages.c_str(), stderr);
  }
  const std::vector<tl::LostRank> news = result.news();
  // The watch printed why it ended the job; what the ranks reported while they were being
  // stopped is a consequence, not news. A teardown verdict follows a failure, which is.
  if (result.verdict && result.verdict->reason == tl::RankWatch::Reason::left) return exit_left;
  if (result.verdict && result.verdict->reason != tl::RankWatch::Reason::teardown) return exit_timed_out;
  if (result.verdict && result.failures.empty() && result.lost.empty()) return exit_timed_out;
  if (result.lost_first()) {
    const tl::LostRank& first = result.lost.front().rank;
    // The first line names it; the lines below say what lost or unreachable means.
    std::fprintf(stderr, "tarantella: rank %d (%shost %s, local rank %d) failed first: %s\n", first.rank,
                 tl::ps_role_words(roles, first.rank).c_str(), first.host.c_str(), first.local_rank,
                 first.kind == tl::LostRank::Kind::lost ? "lost" : "unreachable");
    print_losses(news);
    print_losses(result.stopped_with_job(), true);
    return exit_lost;
  }
  if (const tl::RankReport* culprit = improper_exit(result)) {
    // Open MPI ended the job for a rank that exited 0: the ranks it ended are no culprits.
    std::fprintf(stderr,
                 "tarantella: rank %d (%shost %s, local rank %d) failed first: it exited 0 while other ranks were in "
                 "MPI (it never called MPI_Init, or it did and did not call MPI_Finalize), so Open MPI ended the job: "
                 "%zu more rank%s ended by %s; every rank must call MPI_Init and MPI_Finalize before it exits "
                 "(tnt::init and tnt::finalize do)\n",
                 culprit->rank, tl::ps_role_words(roles, culprit->rank).c_str(), culprit->host.c_str(),
                 culprit->local_rank, result.failures.size(), result.failures.size() == 1 ? "" : "s",
                 tl::describe_status(result.failures.front()).c_str());
    print_losses(news);
    return exit_left;
  }
  if (!result.failures.empty()) {
    const tl::RankReport& first = result.failures.front();
    std::string more;
    // Ranks that made the same mistake (a usage error everywhere, /bin/false) are not
    // "abnormal after it": they are the same failure, said once.
    // Ranks that Open MPI's stop of the job took down (SIGTERM) are no failures of their own,
    // even where they printed the first one's error already. (SIGKILL may be the kernel's
    // out-of-memory killer: abnormal.)
    size_t same = 0, other = 0, stopped = 0;
    for (size_t i = 1; i < result.failures.size(); ++i) {
      const tl::RankReport& r = result.failures[i];
      // SIGTERM first (a rank ended from outside): the others' SIGTERM is the job's stop.
      if (r.signaled && r.code == SIGTERM) {
        ++stopped;
      } else if (r.signaled == first.signaled && r.code == first.code) {
        ++same;
      } else {
        ++other;
      }
    }
    auto ranks = [](size_t n) { return fmt::format("{} more rank{}", n, n == 1 ? "" : "s"); };
    if (same > 0) {
      const bool usage = !first.signaled && first.code == tl::usage_exit_code;
      more += fmt::format("; {} ended {}", ranks(same), usage ? "with the same usage error" : "the same way");
    }
    if (stopped > 0) more += fmt::format("; {} ended by the job's stop (SIGTERM)", ranks(stopped));
    if (other > 0) more += fmt::format("; {} ended abnormally after it", ranks(other));
    // Steps that mpirun's stop killed before they could report (at 16 ranks, most): counted,
    // so that the line accounts for every rank.
    std::set<int> reported;
    for (const tl::RankReport& e : result.ends) reported.insert(e.rank);
    reported.insert(first.rank);
    for (const auto& l : result.lost) reported.insert(l.rank.rank);  // named on lines of their own
    if (reports && slots.size() > reported.size()) {
      more += fmt::format("; {} ended by the job's stop before they reported", ranks(slots.size() - reported.size()));
    }
    std::fprintf(stderr, "tarantella: rank %d (%shost %s, local rank %d) failed first: %s%s\n%s", first.rank,
                 tl::ps_role_words(roles, first.rank).c_str(), first.host.c_str(), first.local_rank,
                 tl::describe_status(first).c_str(), more.c_str(), tl::failure_hint(first).c_str());
    const auto& stopped_ranks = result.stopped_at_first_failure;
    for (size_t i = 0; i < stopped_ranks.size() && i < 8; ++i) {  // enough to find them on a large job
      const tl::RankReport& s = stopped_ranks[i];
      std::fprintf(stderr, "tarantella: rank %d (%shost %s, local rank %d) was stopped (%s) when rank %d failed: a "
                   "rank waiting for it in a collective operation fails at its timeout; look at the stopped one\n",
                   s.rank, tl::ps_role_words(roles, s.rank).c_str(), s.host.c_str(), s.local_rank,
                   tl::signal_name(s.code).c_str(), first.rank);
    }
    if (stopped_ranks.size() > 8) {
      std::fprintf(stderr, "tarantella: and %zu more ranks were stopped then\n", stopped_ranks.size() - 8);
    }
    print_losses(news);
    return tl::shell_status(first);
  }
  if (!news.empty()) {
    print_losses(news);
    print_losses(result.stopped_with_job(), true);
    return exit_lost;
  }
  if (!result.dropped.empty()) {
    // Parameter-server training went on without lost workers: what became of every rank.
    std::fprintf(stderr, "tarantella: the job ended without %zu of its %zu workers; each rank:\n",
                 result.dropped.size(), roles ? roles->workers.size() : size_t{0});
    // On a large job the ranks that exited 0 are one line.
    std::vector<long> fine;
    for (const auto& s : slots) {
      auto end = std::find_if(result.ends.rbegin(), result.ends.rend(), [&](auto& r) { return r.rank == s.rank; });
      const bool dropped = std::any_of(result.dropped.begin(), result.dropped.end(),
                                       [&](auto& r) { return r.rank == s.rank; });
      if (slots.size() > 8 && !dropped && end != result.ends.rend() && !end->failed()) {
        fine.push_back(s.rank);
        continue;
      }
      const std::string role = tl::ps_role_words(roles, s.rank).empty() ? "worker" : "parameter server";
      const std::string what = end == result.ends.rend() ? std::string("no end reported")
                               : dropped ? tl::describe_status(*end) + ": dropped, the other workers took over its samples"
                                         : tl::describe_status(*end);
      std::fprintf(stderr, "  rank %d (%s, host %s, local rank %d): %s\n", s.rank, role.c_str(), s.host.c_str(),
                   s.local_rank, what.c_str());
    }
    if (!fine.empty()) {
      std::fprintf(stderr, "  rank%s %s: exit code 0\n", fine.size() > 1 ? "s" : "", tl::rank_ranges(fine).c_str());
    }
    if (!reports) return 0;
  }
  if (!mpirun_failed) {
    // mpirun's word alone is no evidence that anything ran (`--mpirun /bin/true` exits 0):
    // every rank's step reports at least its program's start and end.
    if (!reports) return 0;
    std::vector<tl::RankSlot> silent;
    for (const auto& s : slots) {
      if (result.reported.count(s.rank) == 0) silent.push_back(s);
    }
    if (silent.empty()) return 0;
    std::string names;
    for (size_t i = 0; i < silent.size() && i < 8; ++i) {
      names += fmt::format("{}rank {} (host {}, local rank {})", i ? ", " : "", silent[i].rank, silent[i].host,
                           silent[i].local_rank);
    }
    if (silent.size() > 8) names += fmt::format(" and {} more", silent.size() - 8);
    std::fprintf(stderr, "tarantella: %s exited 0, but %zu of %zu ranks never started: %s; nothing of the job ran "
                 "there (--mpirun must be Open MPI's mpirun, which starts each rank through tarantella)\n",
                 mpirun.c_str(), silent.size(), slots.size(), names.c_str());
    return exit_not_run;
  }
  if (result.daemons_failed) {
    std::string names;
    for (size_t i = 0; i < hosts.size() && i < 8; ++i) names += (i ? ", " : "") + hosts[i];
    if (hosts.size() > 8) names += fmt::format(" and {} more", hosts.size() - 8);
    std::fprintf(stderr, "tarantella: mpirun could not start its daemons on %s%s (Open MPI's account above); "
                 "check that each can be reached with the launch agent (ssh HOST, or --launch-agent)\n",
                 hosts.empty() ? "some hosts" : "one or more of the hosts ", names.c_str());
    return exit_lost;
  }
  if (WIFSIGNALED(st)) {
    std::fprintf(stderr, "tarantella: mpirun was killed by signal %d\n", WTERMSIG(st));
    return 128 + WTERMSIG(st);
  }
  std::fprintf(stderr, "tarantella: mpirun failed with exit code %d (no rank reported a failure)\n",
               WEXITSTATUS(st));
  return WEXITSTATUS(st);
}

// One run of the job: the report server, the watch and the lifelines, mpirun, and the
// account of how it ended.
Attempt run_attempt(const std::vector<std::string>& command, const std::string& host,
                    const std::vector<tl::RankSlot>& slots, const tl::WatchLimits& limits, double heartbeat_s,
                    const std::optional<tl::PsRoles>& roles) {
  auto server = tl::ReportServer::open(host, heartbeat_s);
  ::setenv(tl::env::report_address, server ? server->address().c_str() : "", 1);
  // Without reports nothing can be watched: the job then runs as mpirun alone would.
  std::optional<tl::RankWatch> watch;
  if (server && limits.any()) {
    watch.emplace(slots, limits, tl::Clock::now());
  } else if (!server && limits.any()) {
    warn("no socket for the ranks' reports: ranks that do not start or end in time will not be noticed");
  }
  std::optional<tl::Lifelines> lifelines;
  if (server && heartbeat_s > 0) lifelines.emplace(heartbeat_s);
  std::fflush(stdout);
  const std::vector<int> expendable = roles ? roles->workers : std::vector<int>{};
  if (watch) watch->tolerate(expendable);
  const tl::JobResult result = tl::run_job(command, server ? &*server : nullptr, watch ? &*watch : nullptr,
                                           lifelines ? &*lifelines : nullptr, expendable,
                                           static_cast<int>(slots.size()));

  if (result.interrupted_by) {
    // A rank that had failed before the signal came is still named: the signal only ended
    // the job sooner.
    if (const tl::RankReport* failed = result.failed_before_interrupt()) {
      const tl::RankReport& first = *failed;
      std::fprintf(stderr, "tarantella: rank %d (%shost %s, local rank %d) had failed before the signal: %s\n",
                   first.rank, tl::ps_role_words(roles, first.rank).c_str(), first.host.c_str(), first.local_rank,
                   tl::describe_status(first).c_str());
    }
    return {128 + *result.interrupted_by, true, "", std::nullopt, false};
  }
  // The reader of the output went away first (`| head`): the job was stopped for that, and
  // what the ranks reported as it stopped is no failure of theirs. As a pipeline's writer
  // ends by SIGPIPE; a restart would write to the same closed pipe. A failed write (a full disk): 1.
  if (result.output_closed && result.output_closed_first)
    return {result.output_error ? 1 : 128 + SIGPIPE, true, "", std::nullopt, false};
  // The launcher was stopped (said when it resumed): the ranks' ends and losses that
  // followed are its consequence, not failures of theirs. Not restarted: it was stopped
  // on purpose, and may be again.
  if (result.stopped_s > 0 && result.stopped_first) {
    std::fprintf(stderr, "tarantella: the job ended because this launcher was stopped, not because of its ranks\n");
    return {exit_launcher_stopped, true, "", std::nullopt, false};
  }
  std::vector<std::string> others;
  for (const auto& s : slots) {
    if (s.host != host && std::find(others.begin(), others.end(), s.host) == others.end()) others.push_back(s.host);
  }
  return {job_status(result, others, command.front(), slots, server.has_value(), roles), false,
          tl::restart_futility(result), result.warned_by, result.stop_requested};
}

int launch(const std::vector<std::string>& args) {
  // SIGUSR1 and SIGUSR2 are for the ranks' programs: while a job runs they are passed on
  // (job.cpp); before, between and after jobs they must not end the launcher (their default).
  ::signal(SIGUSR1, SIG_IGN);
  ::signal(SIGUSR2, SIG_IGN);
  const tl::Options options = tl::parse_command_line(args);
  if (options.help) {
    std::fputs(tl::help_text().c_str(), stdout);
    return 0;
  }
  if (options.version) {
    std::fputs(version_text().c_str(), stdout);
    return 0;
  }

  const tl::Environment env = tl::current_environment();
  const tl::WatchLimits limits = tl::watch_limits(options, env);
  try {
    tl::check_program(options.program.front(), env);
  } catch (const tl::InputError& e) {
    // A dry run only prints the plan, maybe for another machine (as with the limits below).
    if (!options.dry_run) throw;
    warn(fmt::format("{} (a run stops here; --dry-run only prints the plan)", e.what()));
  }
  const std::string mpirun = tl::resolve_mpirun(options.mpirun, TNT_MPIEXEC, env);
  if (options.launch_agent) tl::check_launch_agent(*options.launch_agent, env);
  const tl::HostSelection hosts = tl::select_hosts(options, env);
  const int gpus = options.no_gpu ? 0 : tl::count_gpus(env);

  std::optional<tl::NodeTopology> topology;
  if (options.pin != tl::PinMode::none) {
    topology = options.topology ? tl::load_topology(*options.topology) : tl::load_topology();
    if (!options.dry_run && !topology->this_system) {
      throw tl::InputError(fmt::format("--pin-to-socket: hwloc reports {} instead of this machine, and ranks "
                                       "cannot be bound to it: unset that variable (or see the plan for it with "
                                       "--dry-run)",
                                       topology->source));
    }
  }
  const std::string host = tl::this_host_name();
  const tl::LaunchPlan plan = tl::make_plan(options, hosts, gpus, topology ? &*topology : nullptr, host);
  for (const auto& w : tl::with_requeue_warnings(plan.warnings, options, env)) warn(w);
  if (!options.dry_run) tl::check_local_environment(env);
  // A file-size limit reaches every rank and mpirun: Open MPI's session store and the
  // programs' checkpoints fail past it (mpirun then may not even start the ranks).
  if (rlimit fsize{}; !options.dry_run && ::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY) {
    warn(fmt::format("the file-size limit (ulimit -f) is {} KB here and applies to every rank and to mpirun: Open "
                     "MPI's session files and the programs' checkpoints larger than that fail (ulimit -f unlimited)",
                     fsize.rlim_cur / 1024));
  }
  // A dry run may plan for hosts that only another machine knows, and a launch agent may
  // know names that the resolver does not (--skip-host-lookup).
  if (!options.dry_run && !options.skip_host_lookup) {
    for (const auto& w : tl::check_host_names(hosts, plan, tl::resolve_name)) warn(w);
  }
  std::uint64_t local_ranks = 0;
  for (const auto& h : plan.hosts) local_ranks += h.local ? static_cast<std::uint64_t>(h.ranks) : 0;
  const std::vector<std::string> over = tl::limit_problems(local_ranks, tl::current_limits());
  if (!over.empty()) {
    // A dry run may be planning for another machine: there the limits are only a warning.
    if (!options.dry_run) throw tl::InputError(fmt::format("{}", fmt::join(over, "; ")));
    for (const auto& w : over) warn(w);
  }

  tl::CommandSpec spec;
  spec.mpirun = mpirun;
  spec.as_root = ::geteuid() == 0;
  spec.hosts = plan.hosts;
  spec.exports = tl::rank_exports(options, env);
  const std::optional<tl::PsRoles> roles = tl::plan_ps_roles(options, plan);
  if (roles) {
    // The plan's roles, not a stale TNT_PS_SERVERS of this environment.
    std::erase_if(spec.exports, [](const auto& e) { return e.first == tl::env::ps_servers; });
    spec.exports.emplace_back(tl::env::ps_servers, tl::ps_servers_value(*roles));
    // A worker that dies or stops sending is dropped after the heartbeat timeout and the job
    // goes on (docs/parameter_server.md): mpirun must not end it when a rank dies (below),
    // and the runtime's first server must know the timeout (unless this environment sets
    // its own).
    if (env.find(tl::env::ps_worker_timeout_s) == env.end()) {
      std::erase_if(spec.exports, [](const auto& e) { return e.first == tl::env::ps_worker_timeout_s; });
      spec.exports.emplace_back(tl::env::ps_worker_timeout_s, fmt::format("{}", limits.heartbeat.count()));
    }
  }
  // TNT_DEVICE of this environment is not passed on (the per-rank step sets each rank's):
  // say so, unless this launcher runs inside a rank of another job, whose value is stale.
  if (auto it = env.find(tl::env::device); it != env.end() && env.find(tl::env::launcher) == env.end()) {
    warn(fmt::format("{}={} in this environment is not passed on: the launcher gives each rank its device (cuda:K "
                     "by local rank where GPUs exist, else cpu; --no-gpu for CPU ranks on a GPU machine)",
                     tl::env::device, it->second));
  }
  spec.pass_by_name.push_back(tl::env::report_address);
  ::setenv(tl::env::stdout_is_tty, ::isatty(STDOUT_FILENO) == 1 ? "1" : "0", 1);
  spec.pass_by_name.push_back(tl::env::stdout_is_tty);
  // A rank's pseudo-terminal has no size: progress bars fit the user's terminal by COLUMNS.
  if (struct winsize ws {}; ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    ::setenv("COLUMNS", std::to_string(ws.ws_col).c_str(), 1);
  }
  if (std::getenv("COLUMNS")) spec.pass_by_name.push_back("COLUMNS");
  // ... and how it clears a line (TERM=dumb has no ESC[K), for ranks on other hosts too.
  if (std::getenv("TERM")) spec.pass_by_name.push_back("TERM");
  const bool remote = std::any_of(plan.hosts.begin(), plan.hosts.end(), [](auto& h) { return !h.local; });
  if (remote) {
    // Remote ranks start from a login environment; they need ours to find PROGRAM.
    for (const char* name : {"PATH", "LD_LIBRARY_PATH"}) {
      if (env.count(name)) spec.pass_by_name.push_back(name);
    }
  }
  if (options.max_restarts > 0) {
    // From the launcher's environment, per attempt: the command stays the same.
    spec.pass_by_name.push_back(tl::env::restart);
    spec.pass_by_name.push_back(tl::env::run_id);
    ::setenv(tl::env::restart, "0", 1);
    ::setenv(tl::env::run_id, tl::random_run_id().c_str(), 1);
  }
  spec.launch_agent = options.launch_agent;
  spec.mpi_args = options.mpi_args;
  if (roles) {
    // A rank's step ends with its program's status: a non-zero one must not end the job
    // either (Open MPI's recovery covers only processes killed by a signal). The launcher
    // ends the job itself when a server fails (tl::run_job).
    spec.mpi_args.insert(spec.mpi_args.begin(), {"--enable-recovery", "--mca", "orte_abort_on_non_zero_status", "0"});
  }
  tl::add_local_mca(spec, env, local_ranks, remote, options.launch_agent.has_value());
  spec.self = tl::self_executable();
  spec.step = {options.pin, plan.device, options.program};
  const std::vector<std::string> command = tl::mpirun_command(spec);

  if (options.dry_run) {
    std::fputs(tl::format_plan(plan).c_str(), stdout);
    if (roles) std::fputs(tl::format_ps_roles(*roles, plan).c_str(), stdout);
    std::fputs("command:\n", stdout);
    std::fputs(tl::shell_join(command).c_str(), stdout);
    std::fputs("\n", stdout);
    return 0;
  }

  const std::vector<tl::RankSlot> slots = [&] {
    std::vector<tl::RankSlot> v;
    // Named as the ranks name themselves in their reports: this machine by its own name.
    for (const auto& r : plan.ranks) {
      v.push_back({r.rank, tl::is_local_host(r.host, host) ? host : r.host, r.local_rank});
    }
    return v;
  }();
  double heartbeat_s = limits.heartbeat.count();
  if (heartbeat_s > 0 && !tl::reserve_files(plan.ranks.size() + tl::launcher_files_base)) {
    warn(fmt::format("the open-file limit does not allow a lifeline for each of the {} ranks: lost or unreachable "
                     "hosts will not be noticed by heartbeats (raise it with ulimit -n {})",
                     plan.ranks.size(), plan.ranks.size() + tl::launcher_files_base));
    heartbeat_s = 0;
  }

  // --max-restarts: the same job again after a failure, until it succeeds or no restart is
  // left. The user's signals end it at once.
  for (int attempt = 0;; ++attempt) {
    if (options.max_restarts > 0) ::setenv(tl::env::restart, std::to_string(attempt).c_str(), 1);
    const Attempt a = run_attempt(command, host, slots, limits, heartbeat_s, roles);
    if (const tl::RequeueDecision r = tl::decide_requeue(options, env, a.warned_by, a.stop_requested, a.status);
        !r.message.empty()) {
      std::fprintf(stderr, "tarantella: %s\n", r.message.c_str());
      std::fflush(stderr);
      if (r.requeue) {
        // SLURM ends this job step to requeue it: what follows may not run.
        if (const std::string failed = tl::run_requeue(r.job_id); !failed.empty()) {
          std::fprintf(stderr, "tarantella: --requeue: %s; submit the job again with --resume=auto to continue\n",
                       failed.c_str());
          return 1;
        }
      }
    }
    if (a.status == 0) {
      if (attempt > 0) {
        std::fprintf(stderr, "tarantella: the job succeeded after %d restart%s\n", attempt, attempt == 1 ? "" : "s");
      }
      return 0;
    }
    // A warning (the time limit's, say) came before the failure: a restart would run into the
    // limit with no warning left to stop it in time.
    if (a.warned_by && !a.interrupted && attempt < options.max_restarts) {
      std::fprintf(stderr, "tarantella: no restart tried (%d of %d left): SIG%s came before the failure (a batch "
                   "system's warning before its time limit); run the same command again to continue\n",
                   options.max_restarts - attempt, options.max_restarts, ::sigabbrev_np(*a.warned_by));
      return a.status;
    }
    if (a.interrupted || attempt >= options.max_restarts) {
      if (options.max_restarts > 0 && !a.interrupted) {
        std::fprintf(stderr, "tarantella: the job failed with no restart left (%d of %d used)\n", attempt,
                     options.max_restarts);
      }
      return a.status;
    }
    if (!a.futile.empty()) {
      std::fprintf(stderr, "tarantella: no restart tried (%d of %d left): %s\n", options.max_restarts - attempt,
                   options.max_restarts, a.futile.c_str());
      return a.status;
    }
    std::fprintf(stderr, "tarantella: restarting the whole job (restart %d of %d, TNT_RESTART=%d)\n", attempt + 1,
                 options.max_restarts, attempt + 1);
    std::fflush(stderr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A standard stream started closed (`>&-`) would be taken by the first file the launcher
  // opens, a listening socket for the ranks' reports, and mpirun's output would then be
  // relayed into it, waiting for ever. Each closed one reads or writes /dev/null instead,
  // as the programs' output would go nowhere either.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      const int opened = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (opened >= 0 && opened != fd) ::close(opened);  // the lower ones were open after all
    }
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args.front() == tl::rank_step_flag) {
    return tl::rank_step_main(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  try {
    if (!args.empty() && args.front() == "predict") return tl::predict_main({args.begin() + 1, args.end()});
    return launch(args);
  } catch (const tl::InputError& e) {
    std::fprintf(stderr, "tarantella: error: %s\n", e.what());
    return exit_bad_input;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tarantella: error: %s\n", e.what());
    return 1;
  }
}
