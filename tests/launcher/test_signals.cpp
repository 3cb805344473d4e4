// Signals to the launcher while a job runs: a stop signal that comes while mpirun is already
// ending the job for a failed rank, and the signals passed on to the ranks' programs
// (SIGUSR1, SIGUSR2). Every wait has a deadline; what a test starts carries a marker, and
// whatever carries it when the test ends is killed.
#include "process.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sys/resource.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using tnt_test::left_with;
using tnt_test::wait_for_files;

namespace {

const std::string launcher = TNT_LAUNCHER_BIN;

struct Scratch : tnt_test::ScratchDir {
  Scratch() : tnt_test::ScratchDir("tnt_signals") {}
  std::string script(const std::string& text) const { return ScratchDir::script("rank.sh", text); }
};

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

TEST_CASE("signals: SIGINT while mpirun ends the job for a failed rank", "[integration][signals]") {
  // Rank 1 fails; mpirun then stops the others with SIGTERM, which ranks 0 and 2 take
  // 3 s to act on, so mpirun is still ending the job when the launcher gets SIGINT. Before,
  // the launcher sent mpirun SIGTERM then: Open MPI 4.1's mpirun crashed (a backtrace,
  // "Segmentation fault", a core file), and the failed rank was never named.
  Scratch dir;
  const std::string marker = fmt::format("tnt_signals_fail.{}", ::getpid());
  const std::string program = dir.script(fmt::format(
      "if [ \"$TNT_RANK\" = 1 ]; then exit 3; fi\n"
      "trap 'touch {0}/term.$TNT_RANK; sleep 3; exit 0' TERM\n"
      "i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done",
      dir.path.string()));
  // To the launcher alone, or to its process group as a terminal's Ctrl-C (mpirun then gets
  // SIGINT itself, and crashed on it: its report is held back and it writes no core file).
  const bool whole_group = GENERATE(false, true);
  INFO("signalled: " << (whole_group ? "the launcher's process group" : "the launcher"));
  tnt_test::Process job({launcher, "-n", "3", "--", program, marker}, tnt_test::clean_environment());
  const bool stopping = wait_for_files({dir.file("term.0"), dir.file("term.2")}, 30s);
  if (whole_group) {
    ::kill(-job.pid(), SIGINT);
  } else {
    job.signal(SIGINT);
  }
  const tnt_test::Outcome o = job.wait(60s);
  INFO(o.describe());
  REQUIRE(stopping);
  CHECK(o.exited(128 + SIGINT));
  CHECK(o.err.find(fmt::format("rank 1 (host {}, local rank 1) had failed before the signal: exit code 3",
                               host_name())) != std::string::npos);
  CHECK(o.err.find("Segmentation fault") == std::string::npos);
  CHECK(o.err.find("Process received signal") == std::string::npos);
  CHECK(left_with(marker).empty());
}

TEST_CASE("signals: SIGUSR1 and SIGUSR2 to the launcher reach every rank's program", "[integration][signals]") {
  // As under mpirun alone (and SLURM's --signal=USR1@T warning before a time limit): the
  // programs get the signal, and the job goes on to its normal end.
  for (int sig : {SIGUSR1, SIGUSR2}) {
    INFO("signal: SIG" << ::sigabbrev_np(sig));
    Scratch dir;
    const std::string marker = fmt::format("tnt_signals_usr.{}", ::getpid());
    const std::string name = ::sigabbrev_np(sig);
    // Each rank says it runs, then waits (at most 30 s) for the signal, and exits 0.
    const std::string program = dir.script(fmt::format(
        "trap 'touch {0}/got.$TNT_RANK' {1}\n"
        "touch {0}/up.$TNT_RANK\n"
        "i=0; while [ ! -e {0}/got.$TNT_RANK ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done\n"
        "[ -e {0}/got.$TNT_RANK ]",
        dir.path.string(), name));
    tnt_test::Process job({launcher, "-n", "2", "--", program, marker}, tnt_test::clean_environment());
    const bool up = wait_for_files({dir.file("up.0"), dir.file("up.1")}, 30s);
    job.signal(sig);
    const tnt_test::Outcome o = job.wait(60s);
    INFO(o.describe());
    REQUIRE(up);
    CHECK(o.exited(0));
    CHECK(fs::exists(dir.file("got.0")));
    CHECK(fs::exists(dir.file("got.1")));
    CHECK(left_with(marker).empty());
  }
}

TEST_CASE("signals: a second and a third SIGINT end the job at once, with exit 130", "[integration][signals]") {
  // Ranks that ignore the stop keep the first SIGINT's grace running; a second one kills
  // mpirun. Before, the steps it left got 3 s more, and a third SIGINT in that time ended the
  // launcher by the signal itself, without its report.
  Scratch dir;
  const std::string marker = fmt::format("tnt_signals_twice.{}", ::getpid());
  const std::string program = dir.script(fmt::format(
      "trap '' TERM INT\ntouch {0}/up.$TNT_RANK\ni=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done",
      dir.path.string()));
  tnt_test::Process job({launcher, "-n", "2", "--", program, marker}, tnt_test::clean_environment());
  const bool up = wait_for_files({dir.file("up.0"), dir.file("up.1")}, 30s);
  job.signal(SIGINT);
  std::this_thread::sleep_for(300ms);
  job.signal(SIGINT);
  std::this_thread::sleep_for(100ms);
  job.signal(SIGINT);
  const tnt_test::Outcome o = job.wait(60s);
  INFO(o.describe());
  REQUIRE(up);
  CHECK(o.exited(128 + SIGINT));
  CHECK(o.err.find("SIGINT received, stopping the job") != std::string::npos);
  CHECK(left_with(marker).empty());
}

TEST_CASE("signals: a rank's step killed says so, not only its program's SIGTERM", "[integration][signals]") {
  // Rank 1 kills its step's front (the process mpirun started: its parent's parent) with
  // SIGKILL; the step's back then ends the program with SIGTERM. The launcher's line names
  // that SIGTERM; the step's own line says where it came from.
  Scratch dir;
  const std::string marker = fmt::format("tnt_signals_front.{}", ::getpid());
  const std::string program = dir.script(fmt::format(
      "touch {0}/up.$TNT_RANK\n"
      "if [ \"$TNT_RANK\" = 1 ]; then sleep 0.5; kill -KILL $(cut -d' ' -f4 /proc/$PPID/stat); fi\n"
      "i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done",
      dir.path.string()));
  tnt_test::Process job({launcher, "-n", "2", "--", program, marker}, tnt_test::clean_environment());
  const tnt_test::Outcome o = job.wait(60s);
  INFO(o.describe());
  CHECK_FALSE(o.exited(0));
  CHECK(o.err.find(fmt::format("tarantella: rank 1 on {}: its per-rank step (the process mpirun started) was killed; "
                               "ending its program with SIGTERM",
                               host_name())) != std::string::npos);
  CHECK(left_with(marker).empty());
}

TEST_CASE("signals: --requeue puts a SLURM job stopped by its warning signal back in the queue",
          "[integration][signals]") {
  // SLURM's `scontrol requeue` is stood in for by a script that writes down its arguments
  // (TNT_SCONTROL); the cluster test cluster.slurm.requeue runs the real one. The ranks'
  // stand-in says on its join pipe that it stopped on the request ('s', as the runtime does
  // when fit stops on one), unless the case has it run to its end.
  struct Case {
    std::string name;
    std::vector<std::string> launcher_args, program_args;
    bool signal = true;
    std::string scontrol_status = "0";
    int status = 0;
    bool requeued = false;
    std::string says;
    bool stops = true;
    int exit_code = 0;
  };
  const std::vector<Case> cases = {
      {"requeued", {"--requeue"}, {"--resume=auto"}, true, "0", 0, true,
       "tarantella: SIGUSR1 stopped the job after a step, with its checkpoint; requeueing SLURM job 4242 (scontrol "
       "requeue 4242): it runs again and continues from there"},
      {"no --resume", {"--requeue"}, {"--model_dir=x"}, true, "0", 0, false,
       "the program's arguments have no --resume=auto, so it would train from the start again"},
      {"scontrol fails", {"--requeue"}, {"--resume"}, true, "1", 1, true,
       "scontrol-stand-in requeue 4242 failed (exit code 1): Requested operation is presently disabled; "
       "submit the job again with --resume=auto to continue"},
      {"no warning signal", {"--requeue"}, {"--resume=auto"}, false, "0", 0, false, ""},
      {"without --requeue", {}, {"--resume=auto"}, true, "0", 0, false, ""},
      {"--resume=false", {"--requeue"}, {"--resume=false"}, true, "0", 0, false,
       "the program's arguments have no --resume=auto"},
      {"ran to its end", {"--requeue"}, {"--resume=auto"}, true, "0", 0, false,
       "tarantella: --requeue: SIGUSR1 came, but no program stopped on it (they ran to their end, or do not take "
       "it): not requeued",
       false},
      {"failed after the warning, with restarts left", {"--requeue", "--max-restarts", "2"}, {"--resume=auto"}, true,
       "0", 3, false,
       "tarantella: no restart tried (2 of 2 left): SIGUSR1 came before the failure (a batch system's warning before "
       "its time limit); run the same command again to continue",
       true, 3},
  };
  for (const Case& c : cases) {
    INFO("case: " << c.name);
    Scratch dir;
    const std::string marker = fmt::format("tnt_signals_requeue.{}", ::getpid());
    const std::string program = dir.script(fmt::format(
        "trap 'touch {0}/got.$TNT_RANK' USR1\n"
        "touch {0}/up.$TNT_RANK\n"
        "i=0; while [ ! -e {0}/got.$TNT_RANK ] && [ $i -lt {1} ]; do sleep 0.1; i=$((i + 1)); done\n"
        "if [ -e {0}/got.$TNT_RANK ] && [ {2} = 1 ]; then eval \"printf s >&$TNT_JOIN_FD\"; fi\n"
        "exit {3}",
        dir.path.string(), c.signal ? 300 : 5, c.stops ? 1 : 0, c.exit_code));
    const std::string scontrol = dir.path.string() + "/scontrol-stand-in";
    {
      std::ofstream f(scontrol);
      f << "#!/bin/sh\necho \"$@\" >> " << dir.file("scontrol.args") << "\n"
        << (c.scontrol_status == "0" ? "" : "echo 'Requested operation is presently disabled' >&2\n")
        << "exit " << c.scontrol_status << "\n";
    }
    ::chmod(scontrol.c_str(), 0755);
    tnt_test::Env env = tnt_test::clean_environment();
    env["SLURM_JOB_ID"] = "4242";
    env["TNT_SCONTROL"] = scontrol;
    std::vector<std::string> argv{launcher, "-H", "localhost", "-n", "2"};
    argv.insert(argv.end(), c.launcher_args.begin(), c.launcher_args.end());
    argv.insert(argv.end(), {"--", program, marker});
    argv.insert(argv.end(), c.program_args.begin(), c.program_args.end());
    tnt_test::Process job(argv, env);
    const bool up = wait_for_files({dir.file("up.0"), dir.file("up.1")}, 30s);
    if (c.signal) job.signal(SIGUSR1);
    const tnt_test::Outcome o = job.wait(60s);
    INFO(o.describe());
    REQUIRE(up);
    CHECK(o.exited(c.status));
    std::ifstream args(dir.file("scontrol.args"));
    std::string called((std::istreambuf_iterator<char>(args)), std::istreambuf_iterator<char>());
    CHECK(called == (c.requeued ? "requeue 4242\n" : ""));
    if (!c.says.empty()) CHECK_THAT(o.err, Catch::Contains(c.says));
    if (c.says.empty()) CHECK_THAT(o.err, !Catch::Contains("requeue"));
    CHECK(left_with(marker).empty());
  }
}

namespace {

// A 2-rank job of `script` (in `dir`; {0} there is the directory) in which rank 0 fails
// with exit code 1 while rank 1 is (or was just) stopped: the launcher must name rank 1.
void expect_stopped_rank_named(Scratch& dir, const std::string& marker, const std::string& script) {
  const std::string program = dir.script(fmt::format(fmt::runtime(script), dir.path.string()));
  tnt_test::Process job({launcher, "-n", "2", "--", program, marker}, tnt_test::clean_environment());
  const tnt_test::Outcome o = job.wait(60s);
  INFO(o.describe());
  CHECK(o.exited(1));
  CHECK(o.err.find(fmt::format("rank 0 (host {}, local rank 0) failed first: exit code 1", host_name())) !=
        std::string::npos);
  CHECK(o.err.find(fmt::format("rank 1 (host {}, local rank 1) was stopped (SIGSTOP) when rank 0 failed",
                               host_name())) != std::string::npos);
  CHECK(left_with(marker).empty());
}

}  // namespace

TEST_CASE("signals: a rank that fails while another is stopped points at the stopped one", "[integration][signals]") {
  // Rank 0 stands for a rank whose collective operation timed out waiting for rank 1, which
  // is stopped (SIGSTOP). Before, the launcher's last word named rank 0 alone, though it had
  // rank 1's stopped report.
  Scratch dir;
  expect_stopped_rank_named(dir, fmt::format("tnt_signals_stopped.{}", ::getpid()),
                            "if [ \"$TNT_RANK\" = 1 ]; then touch {0}/stopping; kill -STOP $$; exit 0; fi\n"
                            "i=0; while [ ! -e {0}/stopping ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done\n"
                            "sleep 2; exit 1");
}

TEST_CASE("signals: a stopped rank continued by the job's stop just before the failure's report is still named",
          "[integration][signals]") {
  // Open MPI's stop of a job (after the failing rank's MPI_Abort) sends SIGCONT before
  // SIGTERM, so the stopped rank's "continued" report may reach the launcher before the
  // failure's. Rank 0 plays both: it continues rank 1, then fails a second later (the
  // continued report comes first). Before, the launcher then forgot that rank 1 had been
  // stopped.
  Scratch dir;
  expect_stopped_rank_named(
      dir, fmt::format("tnt_signals_continued.{}", ::getpid()),
      "if [ \"$TNT_RANK\" = 1 ]; then echo $$ > {0}/pid.tmp; mv {0}/pid.tmp {0}/pid; kill -STOP $$; exec sleep 60; fi\n"
      "i=0; while [ ! -e {0}/pid ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done\n"
      "sleep 2; kill -CONT $(cat {0}/pid); sleep 1; exit 1");
}

TEST_CASE("signals: SIGINT while ranks wait in MPI_Init names the rank that has not reached it",
          "[integration][signals][join]") {
  // Rank 0 says, as the runtime does, that it enters MPI_Init (the join pipe); rank 1 runs on
  // without. No limit ends such a job (a program may work long before tnt::init); a user
  // who interrupts it learns what it waited for (after 60 s the launcher says so unasked).
  Scratch dir;
  const std::string marker = fmt::format("tnt_signals_join.{}", ::getpid());
  const std::string program = dir.script(fmt::format(
      "if [ \"$TNT_RANK\" = 0 ]; then printf e >/proc/self/fd/$TNT_JOIN_FD; fi\n"
      "touch {0}/up.$TNT_RANK\n"
      "exec sleep 300",
      dir.path.string()));
  {
    // Interrupted at once: a wait of a second is no hang, and nobody is blamed for it.
    tnt_test::Process quick({launcher, "-n", "2", "--", program, marker}, tnt_test::clean_environment());
    const bool quick_up = wait_for_files({dir.file("up.0"), dir.file("up.1")}, 30s);
    std::this_thread::sleep_for(500ms);
    quick.signal(SIGINT);
    const tnt_test::Outcome q = quick.wait(60s);
    INFO(q.describe());
    REQUIRE(quick_up);
    CHECK(q.exited(128 + SIGINT));
    CHECK(q.err.find("has waited") == std::string::npos);
    std::filesystem::remove(dir.file("up.0"));
    std::filesystem::remove(dir.file("up.1"));
  }
  tnt_test::Process job({launcher, "-n", "2", "--", program, marker}, tnt_test::clean_environment());
  const bool up = wait_for_files({dir.file("up.0"), dir.file("up.1")}, 30s);
  // The join word goes through rank 0's step (a 250 ms tick); an interrupt names waits of 5 s
  // and more.
  std::this_thread::sleep_for(6s);
  job.signal(SIGINT);
  const tnt_test::Outcome o = job.wait(60s);
  INFO(o.describe());
  REQUIRE(up);
  CHECK(o.exited(128 + SIGINT));
  CHECK(o.err.find(fmt::format("rank 0 (host {0}, local rank 0) has waited ", host_name())) != std::string::npos);
  CHECK(o.err.find(fmt::format(" s in MPI_Init (tnt::init) for rank 1 (host {0}, local rank 1), which has not "
                               "reached it",
                               host_name())) != std::string::npos);
  CHECK(left_with(marker).empty());
}

TEST_CASE("signals: SIGINT while ranks wait in MPI_Finalize names the stopped rank they wait for",
          "[integration][signals][join]") {
  // Rank 0 says, as the runtime does, that it got through MPI_Init and enters MPI_Finalize;
  // rank 1 stops itself after its last collective, as a rank held by a debugger or stuck
  // would. Before, an interrupt said only "SIGINT received".
  Scratch dir;
  const std::string marker = fmt::format("tnt_signals_finalize.{}", ::getpid());
  const std::string program = dir.script(fmt::format(
      "printf ej >/proc/self/fd/$TNT_JOIN_FD\n"
      "if [ \"$TNT_RANK\" = 0 ]; then printf f >/proc/self/fd/$TNT_JOIN_FD; touch {0}/up.0; exec sleep 300; fi\n"
      "touch {0}/up.1; kill -STOP $$; exec sleep 300",
      dir.path.string()));
  tnt_test::Process job({launcher, "-n", "2", "--", program, marker}, tnt_test::clean_environment());
  const bool up = wait_for_files({dir.file("up.0"), dir.file("up.1")}, 30s);
  // The words go through the steps (a 250 ms tick); an interrupt names waits of 5 s and more.
  std::this_thread::sleep_for(6s);
  job.signal(SIGINT);
  const tnt_test::Outcome o = job.wait(60s);
  INFO(o.describe());
  REQUIRE(up);
  CHECK(o.exited(128 + SIGINT));
  CHECK(o.err.find(fmt::format("rank 0 (host {0}, local rank 0) has waited ", host_name())) != std::string::npos);
  CHECK(o.err.find(fmt::format(" s in MPI_Finalize (tnt::finalize, the end of the program) for rank 1 (host {0}, "
                               "local rank 1, stopped by SIGSTOP), which has not reached it",
                               host_name())) != std::string::npos);
  CHECK(o.err.find(fmt::format("rank 1 (host {0}, local rank 1, stopped by SIGSTOP) is stopped (", host_name())) !=
        std::string::npos);
  CHECK(left_with(marker).empty());
}

TEST_CASE("signals: ranks that the job's stop took down are not called abnormal", "[integration][signals]") {
  // Rank 1 fails; Open MPI then stops ranks 0 and 2 with SIGTERM. They were said to have
  // "ended abnormally after it", as if they had failed on their own.
  Scratch dir;
  const std::string marker = fmt::format("tnt_signals_stop.{}", ::getpid());
  // Rank 1 fails once the others run (so that their programs, not only their steps, are
  // what the stop takes down).
  const std::string program = dir.script(fmt::format(
      "touch {0}/up.$TNT_RANK\n"
      "if [ \"$TNT_RANK\" = 1 ]; then\n"
      "  i=0; while [ ! -e {0}/up.0 ] || [ ! -e {0}/up.2 ]; do [ $i -lt 300 ] || break; sleep 0.1; i=$((i + 1)); done\n"
      "  sleep 0.5; exit 3\n"
      "fi\n"
      "exec sleep 30",
      dir.path.string()));
  tnt_test::Process job({launcher, "-n", "3", "--", program, marker}, tnt_test::clean_environment());
  const tnt_test::Outcome o = job.wait(60s);
  INFO(o.describe());
  CHECK(o.exited(3));
  CHECK(o.err.find("failed first: exit code 3; 2 more ranks ended by the job's stop (SIGTERM)") !=
        std::string::npos);
  CHECK(o.err.find("abnormally") == std::string::npos);
  CHECK(left_with(marker).empty());
}

TEST_CASE("signals: mpirun runs without core files, the ranks' programs with the launcher's limit",
          "[integration][signals]") {
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_CORE, &saved) == 0);
  rlimit mine = saved;
  mine.rlim_cur = saved.rlim_max == RLIM_INFINITY ? 1 << 20 : std::min<rlim_t>(saved.rlim_max, 1 << 20);
  REQUIRE(::setrlimit(RLIMIT_CORE, &mine) == 0);
  const tnt_test::Outcome o = tnt_test::run(
      {launcher, "-n", "1", "--", "/bin/sh", "-c", "echo \"core $(ulimit -c) ${TNT_CORE_LIMIT:-unset}\""},
      tnt_test::clean_environment(), 60s);
  ::setrlimit(RLIMIT_CORE, &saved);
  INFO(o.describe());
  CHECK(o.exited(0));
  // sh counts 512-byte blocks; the variable is the launcher's to its steps, not the program's.
  CHECK(o.out.find(fmt::format("core {} unset", mine.rlim_cur / 512)) != std::string::npos);
}

TEST_CASE("signals: a rank that throws something other than a std::exception ends the job with a message",
          "[integration][signals]") {
  // Before, tnt::run_main caught std::exception only: std::terminate, Open MPI's backtrace
  // of a SIGABRT, exit 134, while the other rank waited in its collective.
  const std::string join_probe = TNT_JOIN_PROBE_BIN;
  const tnt_test::Outcome o =
      tnt_test::run({launcher, "-n", "2", "--", join_probe, "throw-int", "1"}, tnt_test::clean_environment(), 60s);
  INFO(o.describe());
  CHECK(o.exited(1));
  CHECK(o.err.find("error (rank 1 of 2): the program threw an exception that is not a std::exception") !=
        std::string::npos);
  CHECK(o.err.find("terminate called") == std::string::npos);
}
