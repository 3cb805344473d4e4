// The launcher against ranks that misbehave: programs that leave children behind, ranks
// that never start or stop at start, ranks that exit 0 while the others wait for them, and
// plans that this machine's limits cannot hold. Every job here is short, every wait has a
// deadline, and whatever a test starts is killed by a guard if the test fails.
#include "process.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;
using tnt_test::Env;
using tnt_test::Outcome;
namespace fs = std::filesystem;

namespace {

const std::string launcher = TNT_LAUNCHER_BIN;
const std::string rank_info = TNT_RANK_INFO_BIN;

Outcome tarantella(const std::vector<std::string>& args, std::chrono::milliseconds deadline,
                   const Env& env = tnt_test::clean_environment()) {
  std::vector<std::string> argv{launcher};
  argv.insert(argv.end(), args.begin(), args.end());
  return tnt_test::run(argv, env, deadline);
}

// A fresh directory for files the ranks write, removed with everything in it.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "tnt_faults_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace

TEST_CASE("faults: a rank's program leaves no children behind", "[integration][faults]") {
  ScratchDir dir;
  // `sleep 300.PID` is a valid sleep whose argument marks it as this test's.
  const std::string marker = "300." + std::to_string(::getpid());
  tnt_test::RecordedPids children{{}, marker};
  for (const char* kind : {"plain", "session", "holds-output"}) {
    for (int r = 0; r < 2; ++r) children.files.push_back(dir.file(fmt::format("{}.{}", kind, r)));
  }

  SECTION("children with their output elsewhere, one of them in a session of its own") {
    // setsid takes the second child out of the program's process group, so only the step's
    // being a subreaper finds it once the program has exited.
    const std::string script = fmt::format(
        "sleep {0} >/dev/null 2>&1 & echo $! > {1}/plain.$TNT_RANK; "
        "setsid sleep {0} >/dev/null 2>&1 </dev/null & echo $! > {1}/session.$TNT_RANK; exit 0",
        marker, dir.path.string());
    Outcome o = tarantella({"-n", "2", "--", "/bin/sh", "-c", script}, 30s);
    INFO(o.describe());
    CHECK(o.exited(0));
    CHECK(o.seconds < 10);
  }
  SECTION("a child that keeps the rank's output open") {
    // mpirun waits for a rank's output to close, so this job hung as long as the child ran.
    const std::string script =
        fmt::format("sleep {} & echo $! > {}/holds-output.$TNT_RANK; exit 0", marker, dir.path.string());
    Outcome o = tarantella({"-n", "2", "--", "/bin/sh", "-c", script}, 30s);
    INFO(o.describe());
    CHECK(o.exited(0));
    CHECK(o.seconds < 10);
  }
  size_t recorded = 0;
  for (const auto& f : children.files) recorded += fs::exists(f);
  CHECK(recorded >= 2);  // the programs ran and recorded their children
  // The step ends the leftovers before it exits, so nothing may be alive once the launcher
  // has returned; a short grace only absorbs /proc catching up.
  auto left = children.alive();
  for (int i = 0; i < 20 && !left.empty(); ++i) {
    std::this_thread::sleep_for(50ms);
    left = children.alive();
  }
  std::string pids;
  for (pid_t p : left) pids += fmt::format(" {}", p);
  INFO("still running:" << pids);
  CHECK(left.empty());
}

TEST_CASE("faults: more local ranks than this machine's limits allow stops before anything starts",
          "[integration][faults][limits]") {
  // Under `ulimit -n 64` mpirun can start about 9 ranks; past that it printed "The system
  // limit on number of pipes a process can open was reached" and hung. The shell lowers the
  // limit for the launcher alone.
  for (const std::string n : {"30", "100000"}) {
    const std::vector<std::string> argv{"/bin/sh", "-c", "ulimit -n 64 && exec \"$0\" -n " + n + " -- /bin/true",
                                        launcher};
    const Outcome o = tnt_test::run(argv, tnt_test::clean_environment(), 20s);
    INFO(o.describe());
    CHECK(o.exited(2));
    CHECK(o.seconds < 5);
    CHECK_THAT(o.err, Catch::Contains("tarantella: error: " + n + " ranks on this machine") &&
                          Catch::Contains("RLIMIT_NOFILE") && Catch::Contains("is 64"));
  }
}
