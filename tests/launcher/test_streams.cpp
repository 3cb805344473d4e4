// The launcher's standard streams and hang-up as users' shells leave them: standard output
// closed (`>&-`), SIGHUP ignored (nohup), and a reader that stops reading (a pager left
// open). Every wait has a deadline; what a test starts carries a marker, and whatever
// carries it when the test ends is killed.
#include "process.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using tnt_test::left_with;
using tnt_test::wait_for_files;

namespace {

const std::string launcher = TNT_LAUNCHER_BIN;

}  // namespace

TEST_CASE("streams: a launcher started with standard output closed runs the job and ends", "[integration][streams]") {
  // Before, the report socket took descriptor 1 and the launcher relayed the ranks' output
  // into it for ever after the job had ended (SIGTERM did not end that wait either).
  tnt_test::ScratchDir dir("tnt_streams");
  const std::string marker = fmt::format("tnt_streams_closed.{}", ::getpid());
  const std::string program = dir.script("rank.sh", "echo \"rank $TNT_RANK says something\"\n");
  const tnt_test::Outcome o =
      tnt_test::run({"/bin/bash", "-c", "exec \"$@\" >&-", "_", launcher, "-n", "2", "--", program, marker},
                    tnt_test::clean_environment(), 60s);
  INFO(o.describe());
  CHECK(o.exited(0));
  CHECK(left_with(marker).empty());
}

TEST_CASE("streams: a SIGHUP that nohup ignores leaves the job running", "[integration][streams]") {
  // Linux queues even an ignored signal for a signalfd: the launcher stopped the job on it.
  tnt_test::ScratchDir dir("tnt_streams");
  const std::string marker = fmt::format("tnt_streams_hup.{}", ::getpid());
  // Each rank says it runs, waits (at most 30 s) for the test's go, and exits 0.
  const std::string program = dir.script(
      "rank.sh", fmt::format("touch {0}/up.$TNT_RANK\n"
                             "i=0; while [ ! -e {0}/go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done\n"
                             "[ -e {0}/go ]",
                             dir.path.string()));
  // As nohup does: SIGHUP ignored before the launcher starts.
  tnt_test::Process job({"/bin/bash", "-c", "trap '' HUP; exec \"$@\"", "_", launcher, "-n", "2", "--", program, marker},
                        tnt_test::clean_environment());
  const bool up = wait_for_files({dir.file("up.0"), dir.file("up.1")}, 30s);
  job.signal(SIGHUP);
  std::this_thread::sleep_for(1s);
  std::ofstream(dir.file("go")) << "";
  const tnt_test::Outcome o = job.wait(60s);
  INFO(o.describe());
  REQUIRE(up);
  CHECK(o.exited(0));
  CHECK(o.err.find("SIGHUP received") == std::string::npos);
  CHECK(left_with(marker).empty());
}

TEST_CASE("streams: a reader that stops reading does not hold the launcher after SIGTERM", "[integration][streams]") {
  // The launcher's standard output is a FIFO whose reader never reads (a pager left open,
  // a stalled log shipper). The job fills it and waits; SIGTERM must end the launcher
  // within the job's stop (5 s) and the drain, not when the reader goes.
  tnt_test::ScratchDir dir("tnt_streams");
  const std::string marker = fmt::format("tnt_streams_stall.{}", ::getpid());
  const std::string program =
      dir.script("rank.sh", fmt::format("head -c 300000 /dev/zero | tr '\\0' x\n"
                                        "touch {0}/up.$TNT_RANK\n"
                                        "sleep 30\n",
                                        dir.path.string()));
  const std::string fifo = dir.file("out.fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // The reader holds the FIFO open and never reads; it carries the marker to be cleaned up.
  tnt_test::Process reader({"/bin/bash", "-c", "exec sleep 60 < \"$1\"", "_", fifo, marker}, tnt_test::clean_environment());
  tnt_test::Process job({"/bin/bash", "-c", "exec \"$@\" > \"$0\"", fifo, launcher, "-n", "1", "--", program, marker},
                        tnt_test::clean_environment());
  const bool up = wait_for_files({dir.file("up.0")}, 30s);
  std::this_thread::sleep_for(500ms);  // the launcher has read what it can and waits on the reader
  job.signal(SIGTERM);
  const tnt_test::Outcome o = job.wait(30s);
  INFO(o.describe());
  REQUIRE(up);
  CHECK_FALSE(o.timed_out);
  // Its stop takes up to 5 s for the ranks and 2 s to drain; 15 s is what a loaded machine
  // may add. Before, it waited for the reader (60 s).
  CHECK(o.seconds < 15);
  reader.signal(SIGKILL);
  reader.wait(10s);
  CHECK(left_with(marker).empty());
}

TEST_CASE("streams: the launcher's account of this machine's environment in the mpirun command and refusals",
          "[integration][streams]") {
  tnt_test::ScratchDir dir("tnt_streams");
  const std::string program = dir.script("rank.sh", "exit 0\n");
  tnt_test::Env env = tnt_test::clean_environment();
  env.erase("OMPI_MCA_mpi_yield_when_idle");
  // More ranks than the cores the launcher may run on (taskset: one): Open MPI is told to
  // yield while it waits, else every rank spins; as many ranks as cores: not.
  const tnt_test::Outcome over =
      tnt_test::run({"/usr/bin/taskset", "-c", "0", launcher, "--dry-run", "-n", "2", "--", program}, env);
  INFO(over.describe());
  REQUIRE(over.exited(0));
  CHECK(over.out.find("--mca mpi_yield_when_idle 1") != std::string::npos);
  const tnt_test::Outcome fits =
      tnt_test::run({"/usr/bin/taskset", "-c", "0", launcher, "--dry-run", "-n", "1", "--", program}, env);
  CHECK(fits.out.find("mpi_yield_when_idle") == std::string::npos);
  // The user's own setting wins.
  const tnt_test::Outcome own = tnt_test::run({"/usr/bin/taskset", "-c", "0", launcher, "--dry-run", "-n", "2",
                                               "--mpi-args=--mca mpi_yield_when_idle 0", "--", program},
                                              env);
  INFO(own.describe());
  CHECK(own.out.find("--mca mpi_yield_when_idle 1") == std::string::npos);
  // No ssh on PATH (a container): a job on this machine alone still starts, with an agent
  // that is never run.
  tnt_test::Env no_ssh = env;
  no_ssh["PATH"] = dir.path.string();
  const tnt_test::Outcome local = tnt_test::run({launcher, "-n", "2", "--", program}, no_ssh);
  INFO(local.describe());
  CHECK(local.exited(0));
  // A working directory that was removed, and a TMPDIR that is a file: refused before Open
  // MPI fails on them with its own text (exit 1, which a restart would repeat).
  const std::string gone = dir.file("gone");
  const tnt_test::Outcome no_cwd = tnt_test::run(
      {"/bin/bash", "-c", "mkdir \"$0\" && cd \"$0\" && rmdir \"$0\" && exec \"$@\"", gone, launcher, "-n", "2", "--",
       program},
      env);
  INFO(no_cwd.describe());
  CHECK(no_cwd.exited(2));
  CHECK(no_cwd.err.find("the current directory cannot be read") != std::string::npos);
  tnt_test::Env bad_tmp = env;
  std::ofstream(dir.file("a-file")) << "x";
  bad_tmp["TMPDIR"] = dir.file("a-file");
  const tnt_test::Outcome no_tmp = tnt_test::run({launcher, "-n", "2", "--", program}, bad_tmp);
  INFO(no_tmp.describe());
  CHECK(no_tmp.exited(2));
  CHECK(no_tmp.err.find("TMPDIR=" + dir.file("a-file") + ": not a directory") != std::string::npos);
}

TEST_CASE("streams: output to a file that cannot take it fails the job, naming why", "[integration][streams]") {
  tnt_test::ScratchDir dir("tnt_streams");
  const std::string program = dir.script("rank.sh", "head -c 4000000 /dev/zero\n");
  const tnt_test::Env env = tnt_test::clean_environment();
  // Past the file-size limit (ulimit -f, 1000 blocks of 1 KB in bash): the launcher writes the
  // file now, and SIGXFSZ would kill it (exit 153, no word, mpirun left behind).
  const tnt_test::Outcome big = tnt_test::run(
      {"/bin/bash", "-c", "ulimit -f 1000; exec \"$0\" -n 1 -- \"$1\" > \"$2\"", launcher, program,
       dir.file("out.bin")},
      env);
  INFO(big.describe());
  CHECK(big.exited(1));
  CHECK(big.err.find("tarantella: writing the standard output failed: File too large") != std::string::npos);
  // /dev/full: before, exit 0 and the output lost.
  const tnt_test::Outcome full =
      tnt_test::run({"/bin/bash", "-c", "exec \"$0\" -n 1 -- \"$1\" > /dev/full", launcher, program}, env);
  INFO(full.describe());
  CHECK(full.exited(1));
  CHECK(full.err.find("tarantella: writing the standard output failed: No space left on device") != std::string::npos);
  CHECK(full.err.find("closed by its reader") == std::string::npos);
  // The ranks' standard error past ulimit -f: their errors lost, so no exit 0 (the launcher's
  // own line goes the same way: the status alone tells).
  const std::string noisy = dir.script("noisy.sh", "head -c 4000000 /dev/zero >&2\n");
  const tnt_test::Outcome err = tnt_test::run(
      {"/bin/bash", "-c", "ulimit -f 1000; exec \"$0\" -n 1 -- \"$1\" 2> \"$2\"", launcher, noisy,
       dir.file("err.bin")},
      env);
  INFO(err.describe());
  CHECK(err.exited(1));
}

TEST_CASE("streams: a signal that is no stop leaves the job's last output to a slow reader", "[integration][streams]") {
  // SIGUSR1 (SLURM's warning) or a SIGCHLD while the launcher waits, after the job, for a
  // reader that reads late: every byte still reaches it, exit 0 (the first version of the
  // stop-aware wait took any signal as a stop and dropped the rest without a word).
  tnt_test::ScratchDir dir("tnt_streams");
  const std::string marker = fmt::format("tnt_streams_late.{}", ::getpid());
  const std::string program = dir.script("rank.sh", "head -c 300001 /dev/zero | tr '\\0' y\n");
  const std::string fifo = dir.file("out.fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // The reader opens the FIFO at once, reads only after 4 s.
  tnt_test::Process reader(
      {"/bin/bash", "-c", "exec 3<\"$1\"; sleep 4; cat <&3 >\"$2\"", "_", fifo, dir.file("got"), marker},
      tnt_test::clean_environment());
  tnt_test::Process job({"/bin/bash", "-c", "exec \"$@\" > \"$0\"", fifo, launcher, "-n", "1", "--", program, marker},
                        tnt_test::clean_environment());
  std::this_thread::sleep_for(2500ms);  // the job has ended; the launcher waits on the reader
  job.signal(SIGUSR1);
  const tnt_test::Outcome o = job.wait(30s);
  INFO(o.describe());
  CHECK(o.exited(0));
  reader.wait(20s);
  std::error_code ec;
  CHECK(fs::file_size(dir.file("got"), ec) == 300001);
  CHECK(left_with(marker).empty());
}
