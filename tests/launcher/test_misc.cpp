// The smaller pieces: the failure report protocol, GPU counting rules, finding
// executables, and the per-rank step's view of its rank.
#include "env_names.hpp"
#include "error.hpp"
#include "gpus.hpp"
#include "job.hpp"
#include "limits.hpp"
#include "local_checks.hpp"
#include "ompi_leftovers.hpp"
#include "output_relay.hpp"
#include "paths.hpp"
#include "rank_setup.hpp"
#include "report.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace tnt::launcher;

TEST_CASE("report: statuses in words", "[report]") {
  CHECK(describe_status({1, 1, "h", false, 3}) == "exit code 3");
  CHECK(describe_status({1, 1, "h", true, SIGKILL}) == "signal 9 (SIGKILL)");
  CHECK(describe_status({1, 1, "h", true, SIGSEGV}) == "signal 11 (SIGSEGV)");
  CHECK(shell_status({1, 1, "h", false, 3}) == 3);
  CHECK(shell_status({1, 1, "h", true, SIGTERM}) == 143);
  CHECK(signal_name(SIGSTOP) == "SIGSTOP");
  CHECK_FALSE(RankReport{1, 1, "h", false, 0}.failed());
  CHECK(RankReport{1, 1, "h", false, 2}.failed());
  CHECK_FALSE(RankReport{1, 1, "h", false, 2, RankReport::Kind::stopped}.failed());
}

TEST_CASE("report: a failure sent by a rank reaches the launcher", "[report]") {
  auto server = ReportServer::open("this-host");
  REQUIRE(server);
  // The host name first, then this machine's addresses; no lifelines asked for.
  CHECK_THAT(server->address(), Catch::StartsWith("this-host") && Catch::EndsWith(":0"));
  auto parsed = parse_launcher_address(server->address());
  REQUIRE(parsed);
  CHECK(parsed->hosts.front() == "this-host");
  CHECK(parsed->heartbeat_s == 0);

  std::vector<RankReport> got;
  std::thread rank([&] {
    CHECK(send_report(server->address(), "this-host", {3, 1, "node7", true, SIGABRT}));
  });
  // Accept as the launcher does: wait for the listening socket, then take what is queued.
  for (int i = 0; i < 50 && got.empty(); ++i) {
    pollfd p{server->fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    server->accept_pending(got);
  }
  rank.join();
  REQUIRE(got.size() == 1);
  CHECK(got[0].rank == 3);
  CHECK(got[0].local_rank == 1);
  CHECK(got[0].host == "node7");
  CHECK(got[0].signaled);
  CHECK(got[0].code == SIGABRT);
  CHECK(got[0].kind == RankReport::Kind::ended);
  CHECK(got[0].failed());

  // Every kind of report, sent without waiting for the launcher, arrives in order; the
  // launcher's own host is reached over loopback.
  const std::vector<RankReport> sent = {
      {2, 0, "this-host", false, 0, RankReport::Kind::started},
      {2, 0, "this-host", false, SIGSTOP, RankReport::Kind::stopped},
      {2, 0, "this-host", false, 0, RankReport::Kind::continued},
      {2, 0, "this-host", false, 0, RankReport::Kind::ended},
  };
  for (const auto& r : sent) CHECK(send_report(server->address(), "this-host", r, false));
  got.clear();
  for (int i = 0; i < 50 && got.size() < sent.size(); ++i) {
    pollfd p{server->fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    server->accept_pending(got);
  }
  REQUIRE(got.size() == sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].kind == sent[i].kind);
    CHECK(got[i].code == sent[i].code);
    CHECK(got[i].rank == 2);
    CHECK_FALSE(got[i].failed());
  }

  // A wrong token is not a report.
  const std::string forged = fmt::format("this-host:{}:0000:0", parsed->port);
  std::thread stranger([&] { send_report(forged, "this-host", {0, 0, "x", false, 1}); });
  std::vector<RankReport> none;
  for (int i = 0; i < 20; ++i) {
    pollfd p{server->fd(), POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      server->accept_pending(none);
      break;
    }
  }
  stranger.join();
  CHECK(none.empty());
  CHECK_FALSE(send_report("garbage", "h", {}));
}

TEST_CASE("gpus: CUDA_VISIBLE_DEVICES limits the count", "[gpus]") {
  CHECK(visible_gpu_count("", 4) == 0);
  CHECK(visible_gpu_count("0,1", 4) == 2);
  CHECK(visible_gpu_count("3", 4) == 1);
  CHECK(visible_gpu_count("0,1,2,3,4,5", 4) == 4);
  CHECK(visible_gpu_count("0,-1,2", 4) == 1);
  CHECK(visible_gpu_count("GPU-8e2b,GPU-11aa", 8) == 2);
  CHECK(count_gpus({{"CUDA_VISIBLE_DEVICES", ""}}) == 0);
  CHECK(count_gpus({}) >= 0);  // whatever this machine has, without CUDA linked in
}

TEST_CASE("paths: finding executables like execvp", "[paths]") {
  CHECK(find_executable("sh", "/nonexistent:/bin:/usr/bin").problem == ExecutableProblem::none);
  CHECK(find_executable("sh", "/nonexistent").problem == ExecutableProblem::not_found);
  CHECK(find_executable("/bin/sh", "").problem == ExecutableProblem::none);
  CHECK(find_executable("/no/such/program", "/bin").problem == ExecutableProblem::not_found);
  CHECK(find_executable("/tmp", "/bin").problem == ExecutableProblem::is_directory);

  char path[] = "/tmp/tnt_not_exec_XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  ::chmod(path, 0644);
  CHECK(find_executable(path, "").problem == ExecutableProblem::not_executable);
  CHECK_THROWS_WITH(check_program(path, {{"PATH", "/bin"}}), Catch::Contains("is not executable"));
  std::remove(path);

  CHECK_THROWS_WITH(check_program("/no/such/program", {}), "program '/no/such/program': no such file");
  CHECK_THROWS_WITH(check_program("no-such-program-xyz", {{"PATH", "/bin"}}),
                    "program 'no-such-program-xyz': not found in PATH");
  CHECK_NOTHROW(check_program("sh", {{"PATH", "/bin:/usr/bin"}}));
  // The launcher's options after '--' (tarantella -- -n 2 ./train): said so.
  CHECK_THROWS_WITH(check_program("-n", {{"PATH", "/bin"}}),
                    "program '-n': not found in PATH (options of the launcher go before '--': tarantella -n 2 -- "
                    "PROGRAM)");

}

TEST_CASE("paths: a script whose interpreter does not exist", "[paths]") {
  char dir[] = "/tmp/tnt_interp_XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string script = std::string(dir) + "/job.sh";
  auto write_script = [&](const std::string& text) {
    std::ofstream(script) << text;
    ::chmod(script.c_str(), 0755);
  };
  write_script("#!/nonexistent/interp -x\necho hi\n");
  CHECK(missing_interpreter(script) == "/nonexistent/interp");
  CHECK_THROWS_WITH(check_program(script, {}), "program '" + script +
                                                   "': its interpreter '/nonexistent/interp' (named on its #! line) "
                                                   "was not found");
  // What the per-rank step says when exec fails on a host where the launcher's check could
  // not look (ENOENT would otherwise blame the script).
  CHECK(exec_failure_reason(script, ENOENT) ==
        "its interpreter '/nonexistent/interp' (named on its #! line) was not found");
  CHECK(exec_failure_reason(script, EACCES) == std::strerror(EACCES));
  CHECK(exec_failure_reason("/no/such/program", ENOENT) == std::strerror(ENOENT));
  write_script("#! /bin/sh\necho hi\n");
  CHECK_FALSE(missing_interpreter(script));
  CHECK_NOTHROW(check_program(script, {}));
  write_script("echo no interpreter line\n");
  CHECK_FALSE(missing_interpreter(script));
  CHECK_FALSE(missing_interpreter("/no/such/script"));
  std::remove(script.c_str());
  ::rmdir(dir);
}

TEST_CASE("paths: choosing mpirun", "[paths]") {
  const Environment no_path{{"PATH", "/nonexistent"}};
  CHECK_THROWS_WITH(resolve_mpirun(std::nullopt, "", no_path), Catch::Contains("mpirun not found"));
  CHECK(resolve_mpirun(std::nullopt, "/bin/sh", no_path) == "/bin/sh");  // the one built with
  CHECK_THROWS_WITH(resolve_mpirun(std::string("/no/mpirun"), "/bin/sh", no_path),
                    "--mpirun '/no/mpirun': no such file");
  CHECK(resolve_mpirun(std::string("sh"), "", {{"PATH", "/bin"}}) == "/bin/sh");
  CHECK(self_executable().find("test_launcher_unit") != std::string::npos);
}

TEST_CASE("paths: checking --launch-agent", "[paths]") {
  const Environment bin{{"PATH", "/bin:/usr/bin"}};
  CHECK_NOTHROW(check_launch_agent("sh -c true", bin));
  CHECK_NOTHROW(check_launch_agent("/bin/sh", bin));
  CHECK_NOTHROW(check_launch_agent("nosuchagent-tnt : sh", bin));  // Open MPI's alternatives: one is enough
  CHECK_THROWS_WITH(check_launch_agent("nosuchagent-tnt -x", bin),
                    Catch::StartsWith("--launch-agent 'nosuchagent-tnt -x': its program 'nosuchagent-tnt': not "
                                      "found in PATH (mpirun runs it"));
  CHECK_THROWS_WITH(check_launch_agent("/no/such/ssh -p 2222", bin),
                    Catch::StartsWith("--launch-agent '/no/such/ssh -p 2222': its program '/no/such/ssh': no such file"));
  CHECK_THROWS_WITH(check_launch_agent("/ -p 1", bin), Catch::Contains("its program '/': '/' is a directory"));
  CHECK_THROWS_WITH(check_launch_agent("ssh : ", bin), Catch::Contains("an alternative between ':' is empty"));
  CHECK_THROWS_WITH(check_launch_agent("ssh 'unclosed", bin), Catch::StartsWith("--launch-agent 'ssh 'unclosed': "));
}

TEST_CASE("rank setup: identity and variables", "[rank_setup]") {
  const Environment env{{"OMPI_COMM_WORLD_RANK", "5"},
                        {"OMPI_COMM_WORLD_SIZE", "8"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  auto id = rank_identity(env);
  CHECK(id.rank == 5);
  CHECK(id.size == 8);
  CHECK(id.local_rank == 1);
  CHECK(id.local_size == 4);
  CHECK_THROWS_WITH(rank_identity({}), Catch::Contains("OMPI_COMM_WORLD_RANK is not set"));
  const Environment bad{{"OMPI_COMM_WORLD_RANK", "9"},
                        {"OMPI_COMM_WORLD_SIZE", "8"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  CHECK_THROWS_WITH(rank_identity(bad), Catch::Contains("inconsistent"));

  using Vars = std::vector<std::pair<std::string, std::string>>;
  CHECK(rank_variables(id, "cuda:1", std::nullopt) == Vars{{"TNT_RANK", "5"},
                                                          {"TNT_SIZE", "8"},
                                                          {"TNT_LOCAL_RANK", "1"},
                                                          {"TNT_LOCAL_SIZE", "4"},
                                                          {"TNT_DEVICE", "cuda:1"},
                                                          {"TNT_LAUNCHER", "1"}});
  RankBinding b{1, {4, 5, 6, 7}, 4};
  auto pinned = rank_variables(id, "cpu", b);
  CHECK(pinned.at(6) == std::pair<std::string, std::string>{"TNT_NUMA_NODE", "1"});
  CHECK(pinned.at(7) == std::pair<std::string, std::string>{"TNT_NUM_THREADS", "4"});
  CHECK(env::is_reserved("TNT_DEVICE"));
  CHECK_FALSE(env::is_reserved("TNT_FUSION_THRESHOLD"));
}

TEST_CASE("a parameter server takes no GPU: TNT_PS_SERVERS names its rank", "[ps]") {
  CHECK(is_ps_server("0", 0));
  CHECK(is_ps_server("0,3", 3));
  CHECK(is_ps_server("10,3", 10));
  CHECK_FALSE(is_ps_server("0,3", 1));
  CHECK_FALSE(is_ps_server("10", 1));  // a rank's digits inside another's are no match
  CHECK_FALSE(is_ps_server("", 0));
}

TEST_CASE("limits: a plan is checked against open files, processes and PIDs", "[limits]") {
  SystemLimits roomy;
  roomy.open_files = roomy.open_files_hard = 1 << 20;
  roomy.processes = 1 << 20;
  roomy.pid_max = 4 << 20;
  roomy.tasks_now = 300;
  CHECK(limit_problems(0, roomy).empty());
  CHECK(limit_problems(1000, roomy).empty());

  // Exactly at the open-file need, and one rank past it.
  SystemLimits files = roomy;
  files.open_files = 5 * 8 + 32;
  CHECK(limit_problems(8, files).empty());
  auto p = limit_problems(9, files);
  REQUIRE(p.size() == 1);
  CHECK_THAT(p[0], Catch::StartsWith("9 ranks on this machine need about 77 open files in mpirun") &&
                       Catch::Contains("RLIMIT_NOFILE, ulimit -n) is 72 (hard limit 1048576): raise it with "
                                       "ulimit -n 77"));
  files.open_files_hard = 72;
  CHECK_THAT(limit_problems(9, files)[0], Catch::Contains("its hard limit only 72: ask for a higher hard limit"));

  // RLIMIT_NPROC binds users, not root.
  SystemLimits procs = roomy;
  procs.processes = 100;
  CHECK(limit_problems(50, procs).empty());
  p = limit_problems(51, procs);
  REQUIRE(p.size() == 1);
  CHECK_THAT(p[0], Catch::Contains("at least 102 processes") && Catch::Contains("RLIMIT_NPROC, ulimit -u) is 100"));
  procs.privileged = true;
  CHECK(limit_problems(51, procs).empty());

  // kernel.pid_max less what already runs; unknown (0) is not checked.
  SystemLimits pids = roomy;
  pids.pid_max = 32768;
  pids.tasks_now = 768;
  CHECK(limit_problems(16000, pids).empty());
  p = limit_problems(16001, pids);
  REQUIRE(p.size() == 1);
  CHECK_THAT(p[0], Catch::Contains("kernel.pid_max is 32768 and 768 are in use, so at most 32000 more"));
  pids.pid_max = 0;
  CHECK(limit_problems(16001, pids).empty());

  // Every limit at once: one line each. `tarantella -n 100000` on a common machine.
  SystemLimits common;
  common.open_files = 1024;
  common.open_files_hard = 524288;
  common.processes = 63000;
  common.pid_max = 32768;
  common.tasks_now = 200;
  CHECK(limit_problems(100000, common).size() == 3);

  // This machine's own values are read (whatever they are).
  const SystemLimits here = current_limits();
  CHECK(here.open_files > 0);
  CHECK(here.open_files <= here.open_files_hard);
}

TEST_CASE("restart: a failure that a restart would repeat is named; others are not", "[restart]") {
  JobResult r;
  CHECK(restart_futility(r).empty());  // no failure at all
  r.started = {0, 1};
  r.failures = {{1, 1, "h2", false, 2}, {0, 0, "h1", true, SIGTERM}};
  CHECK(restart_futility(r) == "rank 1 (host h2, local rank 1) exited with code 2, a usage error (its command line or "
                               "input was refused), which a restart would repeat");
  r.failures.front().code = 3;
  CHECK(restart_futility(r).empty());
  r.failures.front().signaled = true;  // signal 3 (SIGQUIT), not exit code 2 or 3
  r.failures.front().code = 2;
  CHECK(restart_futility(r).empty());
  // A rank whose program never started: exec failed (127, 126) or the step's setup (1).
  r.started = {0};
  for (int code : {127, 126, 1}) {
    r.failures.front() = {1, 1, "h2", false, code};
    CHECK(restart_futility(r) == fmt::format("rank 1 (host h2, local rank 1) could not start its program (exit code "
                                             "{}), and a restart would start it the same way", code));
  }
  r.failures.front() = {1, 1, "h2", true, SIGKILL};  // the step itself killed: may not happen again
  CHECK(restart_futility(r).empty());
  // A loss first, a timeout or the user's signal: a restart may help, or is not wanted.
  r.failures.front() = {1, 1, "h2", false, 2};
  r.lost.push_back({LostRank{1, 0, "h3"}, 0});
  CHECK(restart_futility(r).empty());
  r.lost.clear();
  r.verdict = RankWatch::Verdict{RankWatch::Reason::start, "late"};
  CHECK(restart_futility(r).empty());
  r.verdict = RankWatch::Verdict{RankWatch::Reason::teardown, "mpirun lingered"};
  CHECK_FALSE(restart_futility(r).empty());
  r.verdict.reset();
  r.interrupted_by = SIGINT;
  CHECK(restart_futility(r).empty());
}

TEST_CASE("output relay: passes output on, and finds a reader gone at the next write", "[output_relay]") {
  int source[2], sink[2];
  REQUIRE(::pipe(source) == 0);
  REQUIRE(::pipe(sink) == 0);
  CHECK(OutputRelay::wanted(sink[1]));
  // A device or a file can fail a write (/dev/full, a full disk) that mpirun would ignore;
  // /dev/null cannot.
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  CHECK_FALSE(OutputRelay::wanted(null));
  ::close(null);
  char file_name[] = "/tmp/tnt_relay_file_XXXXXX";
  const int file = ::mkstemp(file_name);
  REQUIRE(file >= 0);
  CHECK(OutputRelay::wanted(file));
  ::close(file);
  ::unlink(file_name);
  // A terminal is left to mpirun: a pseudo-terminal's far end stands in for one.
  const int terminal = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(terminal >= 0);
  REQUIRE(::grantpt(terminal) == 0);
  REQUIRE(::unlockpt(terminal) == 0);
  const int far_end = ::open(::ptsname(terminal), O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(far_end >= 0);
  CHECK_FALSE(OutputRelay::wanted(far_end));
  ::close(far_end);
  ::close(terminal);
  OutputRelay relay(source[0], sink[1]);
  REQUIRE(::write(source[1], "one\n", 4) == 4);
  CHECK_FALSE(relay.service());
  char buf[16] = {};
  REQUIRE(::read(sink[0], buf, sizeof buf) == 4);
  CHECK(std::string(buf, 4) == "one\n");
  ::close(sink[0]);  // the reader goes
  CHECK_FALSE(relay.service());  // nothing to write: nothing noticed yet
  REQUIRE(::write(source[1], "two\n", 4) == 4);
  CHECK(relay.service());  // the next write finds it
  CHECK(relay.sink_closed());
  CHECK_FALSE(relay.service());  // once
  // Still read (to nowhere), so that the writer is never blocked: four times what the
  // pipe holds goes through.
  ::fcntl(source[1], F_SETFL, O_NONBLOCK);
  const std::string chunk(4096, 'x');
  size_t written = 0;
  for (int round = 0; round < 10'000 && written < 256 * 1024; ++round) {
    const ssize_t n = ::write(source[1], chunk.data(), chunk.size());
    if (n > 0) written += static_cast<size_t>(n);
    relay.service();
  }
  CHECK(written >= 256 * 1024);
  ::close(source[1]);
  CHECK_FALSE(relay.finish(std::chrono::steady_clock::now() + std::chrono::seconds(1), -1));
  ::close(sink[1]);
}

TEST_CASE("output relay: a write that fails is not taken for a reader gone", "[output_relay]") {
  int source[2];
  REQUIRE(::pipe(source) == 0);
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  REQUIRE(full >= 0);
  CHECK(OutputRelay::wanted(full));
  {
    OutputRelay relay(source[0], full);
    REQUIRE(::write(source[1], "lost\n", 5) == 5);
    CHECK(relay.service());  // the first failed write closes it, once
    CHECK(relay.sink_closed());
    CHECK(relay.sink_error() == ENOSPC);
    CHECK_FALSE(relay.service());
  }
  ::close(source[1]);
  ::close(full);

  // A reader gone is no error of the sink's: the launcher then ends as by SIGPIPE.
  int again[2], sink[2];
  REQUIRE(::pipe(again) == 0);
  REQUIRE(::pipe(sink) == 0);
  OutputRelay relay(again[0], sink[1]);
  ::close(sink[0]);
  REQUIRE(::write(again[1], "x\n", 2) == 2);
  CHECK(relay.service());
  CHECK(relay.sink_error() == 0);
  ::close(again[1]);
  ::close(sink[1]);
}

TEST_CASE("output relay: a reader that stops reading holds the launcher only until a stop signal", "[output_relay]") {
  using Clock = std::chrono::steady_clock;
  // A pipe whose reader never reads, output left over that it cannot take, and a stop
  // signal arriving (a pipe's read end stands in for the signalfd).
  for (const bool with_stop_fd : {true, false}) {
    int source[2], sink[2], stop[2];
    REQUIRE(::pipe(source) == 0);
    REQUIRE(::pipe(sink) == 0);
    REQUIRE(::pipe(stop) == 0);
    ::fcntl(sink[1], F_SETFL, O_NONBLOCK);
    OutputRelay relay(source[0], sink[1]);
    const std::string chunk(4096, 'y');
    ::fcntl(source[1], F_SETFL, O_NONBLOCK);
    size_t written = 0;
    for (int round = 0; round < 1000 && written < 200 * 1024; ++round) {
      const ssize_t n = ::write(source[1], chunk.data(), chunk.size());
      if (n > 0) written += static_cast<size_t>(n);
      relay.service();
    }
    REQUIRE(written >= 200 * 1024);  // more than the sink's pipe holds (64 KiB)
    ::close(source[1]);
    std::thread signal([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      REQUIRE(::write(stop[1], "x", 1) == 1);  // not a stop: the wait goes on
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      REQUIRE(::write(stop[1], "s", 1) == 1);
    });
    const auto start = Clock::now();
    // Without a stop fd (the job was already stopped), the deadline ends the wait; with
    // one, the deadline is for the source only, and the signal ends the wait.
    // The stop callback reads what woke it (as the launcher reads its signalfd): a byte
    // 'x' is no stop (SIGCHLD, SIGUSR1), a byte 's' is.
    int wakes = 0;
    const auto stop_read = [&] {
      char c = 0;
      ++wakes;
      return ::read(stop[0], &c, 1) == 1 && c == 's';
    };
    relay.finish(start + std::chrono::milliseconds(with_stop_fd ? 50 : 500), with_stop_fd ? stop[0] : -1, stop_read);
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    signal.join();
    // Bounds: the thread's 300 ms sleep, the 500 ms deadline; a few seconds of slack for a
    // loaded machine (before, the wait had no end).
    if (with_stop_fd) {
      CHECK(waited >= 250);  // past the 'x' at 150 ms
      CHECK(wakes == 2);
    } else {
      CHECK(waited >= 450);
    }
    CHECK(waited < 5000);
    for (int fd : {sink[0], sink[1], stop[0], stop[1]}) ::close(fd);
  }
}

TEST_CASE("ompi leftovers: an mpirun's session directory and its ranks' shared memory go, nothing else",
          "[ompi_leftovers]") {
  // The layout Open MPI 4.1 leaves after a killed mpirun (seen after a terminal's Ctrl-C).
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/tnt_ompi_leftovers_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path root = tmpl, tmp = root / "tmp", shm = root / "shm";
  const std::string uid = std::to_string(::getuid());
  const fs::path session = tmp / ("ompi.node1." + uid);
  fs::create_directories(session / "pid.4242" / "pmix_dstor_ds21_4242");
  fs::create_directories(session / "pid.4243");  // another mpirun's: stays
  fs::create_directories(session / "jf.18248");   // not the pid directory: stays
  fs::create_directories(tmp / "ompi.node1.99999" / "pid.4242");  // another user's: stays
  fs::create_directories(tmp / ("ompi.node2." + uid) / "pid.4242");  // another host's (a shared TMPDIR): stays
  fs::create_directories(shm);
  std::ofstream(session / "pid.4242" / "contact.txt") << "1195900928.0;tcp://192.0.2.2:60119\n4242\n";
  std::ofstream(session / "pid.4243" / "contact.txt") << "1078460416.0;tcp://192.0.2.2:43487\n4243\n";
  for (const std::string& name : {"vader_segment.node1." + uid + ".47480001.0",  // 1195900928 + 1, in hex
                                 "vader_segment.node1." + uid + ".47480001.1",
                                 "vader_segment.node1." + uid + ".40480001.0",  // the other job's
                                 "vader_segment.node1." + uid + ".474800010.0"}) {
    std::ofstream(shm / name) << "x";
  }
  CHECK(tnt::launcher::remove_ompi_leftovers(4242, tmp.string(), shm.string(), "node1.cluster.example") == 3);
  CHECK_FALSE(fs::exists(session / "pid.4242"));
  CHECK(fs::exists(session / "pid.4243" / "contact.txt"));
  CHECK(fs::exists(session / "jf.18248"));
  CHECK(fs::exists(tmp / "ompi.node1.99999" / "pid.4242"));
  CHECK(fs::exists(tmp / ("ompi.node2." + uid) / "pid.4242"));
  CHECK_FALSE(fs::exists(shm / ("vader_segment.node1." + uid + ".47480001.0")));
  CHECK_FALSE(fs::exists(shm / ("vader_segment.node1." + uid + ".47480001.1")));
  CHECK(fs::exists(shm / ("vader_segment.node1." + uid + ".40480001.0")));
  CHECK(fs::exists(shm / ("vader_segment.node1." + uid + ".474800010.0")));
  // A clean end left nothing: nothing to do.
  CHECK(tnt::launcher::remove_ompi_leftovers(4242, tmp.string(), shm.string(), "node1") == 0);
  fs::remove_all(root);
}

TEST_CASE("local checks: a TMPDIR that cannot be made, or whose disk is full, is refused naming it", "[local_checks]") {
  char tmpl[] = "/tmp/tnt_local_checks_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  // Missing, below a folder that exists: Open MPI makes it.
  CHECK_NOTHROW(check_local_environment({{"TMPDIR", dir + "/missing/sub"}}));
  // Missing, below a file: before, Open MPI's own text (exit 1), restarted in vain.
  std::ofstream(dir + "/file") << "x";
  CHECK_THROWS_WITH(check_local_environment({{"TMPDIR", dir + "/file/sub/"}}),
                    "TMPDIR=" + dir + "/file/sub/ does not exist, and cannot be made: " + dir +
                        "/file is no folder (Open MPI keeps its session files there); create it, or unset TMPDIR");
  // A full file system (a 64 KB tmpfs; the test needs root, as the suite does).
  const std::string full = dir + "/full";
  ::mkdir(full.c_str(), 0700);
  REQUIRE(::mount("tmpfs", full.c_str(), "tmpfs", 0, "size=64k") == 0);
  CHECK_THROWS_WITH(check_local_environment({{"TMPDIR", full}}),
                    Catch::StartsWith("TMPDIR=" + full + ": its file system has ") &&
                        Catch::Contains("KB free (Open MPI keeps its session files there"));
  CHECK_THROWS_WITH(check_local_environment({{"TMPDIR", full + "/not/yet"}}),
                    Catch::StartsWith("TMPDIR=" + full + "/not/yet: its file system has "));
  ::umount2(full.c_str(), MNT_DETACH);
  std::filesystem::remove_all(dir);
}
