// What the user reads when something goes wrong, through the launcher with the real Open
// MPI: the failing rank's own message and the launcher's line naming it, without Open
// MPI's restatement of the same failure; errors about the command line, the hostfile and
// the program that name the input and quote it safely.
#include "process.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

using namespace std::chrono_literals;
using tnt_test::Env;
using tnt_test::Outcome;
namespace fs = std::filesystem;

namespace {

const std::string launcher = TNT_LAUNCHER_BIN;

Outcome tarantella(const std::vector<std::string>& args, const Env& env = tnt_test::clean_environment()) {
  std::vector<std::string> argv{launcher};
  argv.insert(argv.end(), args.begin(), args.end());
  return tnt_test::run(argv, env, 90s);
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

struct ScratchDir : tnt_test::ScratchDir {
  ScratchDir() : tnt_test::ScratchDir("tnt_messages") {}
};

// Open MPI's own texts that restate a failure (mpirun_output.hpp).
void check_no_open_mpi_noise(const std::string& err) {
  CHECK_THAT(err, !Catch::Contains("MPI_ABORT was invoked"));
  CHECK_THAT(err, !Catch::Contains("NOTE: invoking MPI_ABORT"));
  CHECK_THAT(err, !Catch::Contains("ORTE_ERROR_LOG"));
  CHECK_THAT(err, !Catch::Contains("Primary job"));
  CHECK_THAT(err, !Catch::Contains("detected that one or more processes exited with non-zero status"));
  CHECK_THAT(err, !Catch::Contains("orte_base_help_aggregate"));
  CHECK_THAT(err, !Catch::Contains("-----------------"));
}

}  // namespace

TEST_CASE("messages: a failing rank's message and the launcher's line, not Open MPI's banners",
          "[integration][messages]") {
  SECTION("a rank exits with an error") {
    const Outcome o = tarantella({"-n", "2", "--", "/bin/sh", "-c",
                                  "if [ \"$TNT_RANK\" = 1 ]; then echo \"error: bad input on rank 1\" >&2; exit 3; fi; "
                                  "exec sleep 30"});
    INFO(o.describe());
    CHECK(o.exited(3));
    CHECK_THAT(o.err, Catch::Contains("error: bad input on rank 1\n"));
    CHECK_THAT(o.err, Catch::Contains("tarantella: rank 1 (host " + host_name() +
                                      ", local rank 1) failed first: exit code 3"));
    check_no_open_mpi_noise(o.err);
  }
  SECTION("a rank is killed by a signal") {
    const Outcome o = tarantella(
        {"-n", "2", "--", "/bin/sh", "-c", "if [ \"$TNT_RANK\" = 0 ]; then kill -KILL $$; fi; exec sleep 30"});
    INFO(o.describe());
    CHECK(o.exited(128 + 9));
    CHECK_THAT(o.err, Catch::Contains("failed first: signal 9 (SIGKILL)"));
    CHECK_THAT(o.err, !Catch::Contains("noticed that process rank"));
    check_no_open_mpi_noise(o.err);
  }
  SECTION("a rank's stderr passes on whole, partial last line included") {
    const Outcome o = tarantella({"-n", "2", "--", "/bin/sh", "-c",
                                  "echo \"----- rank $TNT_RANK -----\" >&2; printf 'no newline' >&2; exit 0"});
    INFO(o.describe());
    CHECK(o.exited(0));
    CHECK_THAT(o.err, Catch::Contains("----- rank 0 -----\n"));
    CHECK_THAT(o.err, Catch::Contains("----- rank 1 -----\n"));
    CHECK_THAT(o.err, Catch::Contains("no newline"));
  }
}

TEST_CASE("messages: what mpirun says is shown when no rank reported a failure", "[integration][messages]") {
  // A stand-in for mpirun that fails by itself, before any rank, with Open MPI's banner
  // and an ORTE_ERROR_LOG line: the launcher has no account of its own, so those are it.
  ScratchDir dir;
  const std::string dashes(74, '-');
  const std::string fake = dir.script(
      "mpirun",
      fmt::format("printf '%s\\n' '{0}' 'mpirun has exited due to process rank 0 with PID 0 on' '{0}' >&2\n"
                  "echo '[vm:1] [[1,0],0] ORTE_ERROR_LOG: Not found in file base/plm_base_launch_support.c at "
                  "line 1' >&2\n"
                  "exit 5",
                  dashes));
  const Outcome o = tarantella({"-n", "2", "--mpirun", fake, "--", "/bin/true"});
  INFO(o.describe());
  CHECK(o.exited(5));
  CHECK_THAT(o.err, Catch::Contains(dashes + "\nmpirun has exited due to process rank 0 with PID 0 on\n" + dashes +
                                    "\n[vm:1] [[1,0],0] ORTE_ERROR_LOG: Not found"));
  CHECK_THAT(o.err, Catch::EndsWith("tarantella: mpirun failed with exit code 5 (no rank reported a failure)\n"));
}

TEST_CASE("messages: bad input names the input, quoted safely", "[integration][messages]") {
  ScratchDir dir;
  auto fails_with = [](const std::vector<std::string>& args, const std::string& message) {
    const Outcome o = tarantella(args);
    INFO(o.describe());
    CHECK(o.exited(2));
    CHECK(o.err == "tarantella: error: " + message + "\n");
    CHECK(o.out.empty());
  };
  SECTION("a script whose interpreter does not exist") {
    const std::string job = dir.script("job.sh", "echo never", "#!/nonexistent/interp");
    fails_with({"-n", "2", "--", job},
               "program '" + job + "': its interpreter '/nonexistent/interp' (named on its #! line) was not found");
  }
  SECTION("the same script started by the per-rank step, as on a host the launcher cannot check") {
    // The launcher checks the program on its own host; on another host only the per-rank
    // step sees the exec fail. It is run here as mpirun would run it.
    const std::string job = dir.script("job.sh", "echo never", "#!/nonexistent/interp");
    Env env = tnt_test::clean_environment();
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}) env[v] = "0";
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) env[v] = "1";
    const Outcome o = tnt_test::run({launcher, "__tnt_rank_step", "--", job}, env, 30s);
    INFO(o.describe());
    CHECK(o.exited(127));
    CHECK_THAT(o.err, Catch::StartsWith("tarantella: cannot run '" + job + "' on " + host_name() +
                                        ": its interpreter '/nonexistent/interp' (named on its #! line) was not "
                                        "found\n"));
  }
  SECTION("a hostfile of binary garbage") {
    const std::string hosts = dir.file("hosts");
    std::ofstream(hosts, std::ios::binary) << std::string("\x1b[31m\x00\xfe\xff", 8) << std::string(3000, 'x');
    fails_with({"--hostfile", hosts, "--", "/bin/true"},
               "hostfile '" + hosts + "', line 1: '\\x1b[31m\\x00\\xfe\\xff" + std::string(32, 'x') +
                   "...' is not a host name (letters, digits, '.', '-', '_')");
  }
  SECTION("--hostfile given twice") {
    fails_with({"--hostfile", "a", "--hostfile", "b", "--", "/bin/true"},
               "--hostfile given 2 times ('a', 'b'); give it once");
  }
  SECTION("a stray word before --") {
    fails_with({"-n", "2", "stray", "--", "/bin/true"},
               "unexpected argument 'stray': put '--' before the program, as in: tarantella [options] -- PROGRAM "
               "[ARGS...]");
  }
}
