#include "cli.hpp"
#include "error.hpp"
#include "requeue.hpp"

#include <catch2/catch.hpp>

using namespace tnt::launcher;
using Args = std::vector<std::string>;

namespace {

std::string error_of(const Args& args) {
  try {
    parse_command_line(args);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("cli: defaults and the program after --", "[cli]") {
  auto o = parse_command_line({"--", "./train", "--batch_size=64", "-n", "3"});
  CHECK(o.program == Args{"./train", "--batch_size=64", "-n", "3"});
  CHECK_FALSE(o.ranks_per_node);
  CHECK_FALSE(o.hostfile);
  CHECK_FALSE(o.hosts);
  CHECK_FALSE(o.no_gpu);
  CHECK_FALSE(o.fusion_threshold_kb);
  CHECK(o.pin == PinMode::none);
  CHECK(o.exports.empty());
  CHECK_FALSE(o.log_level);
  CHECK_FALSE(o.dry_run);
  CHECK(o.mpi_args.empty());
  CHECK_FALSE(o.start_timeout_s);
  CHECK_FALSE(o.exit_timeout_s);
}

TEST_CASE("cli: --start-timeout and --exit-timeout", "[cli]") {
  auto o = parse_command_line({"--start-timeout", "2.5", "--exit-timeout", "0", "--", "p"});
  CHECK(o.start_timeout_s == 2.5);
  CHECK(o.exit_timeout_s == 0.0);
  CHECK(error_of({"--start-timeout", "-1", "--", "p"}) ==
        "--start-timeout -1: must be a number of seconds from 0 (no limit) to a year (31622400)");
  CHECK(error_of({"--exit-timeout", "later", "--", "p"}) ==
        "--exit-timeout later: must be a number of seconds from 0 (no limit) to a year (31622400)");
  CHECK_THAT(help_text(), Catch::Contains("--start-timeout SECONDS") && Catch::Contains("--exit-timeout SECONDS") &&
                              Catch::Contains("124"));
}

TEST_CASE("cli: every option", "[cli]") {
  auto o = parse_command_line({"--hostfile", "hosts", "-n", "4", "--no-gpu", "--fusion-threshold", "64",
                               "--pin-to-socket", "-x", "A=1", "-x", "B=x=y,z", "--log-level", "info",
                               "--output-on-all-devices", "--log-on-all-devices", "--mpirun", "/opt/mpi/bin/mpirun",
                               "--mpi-args", "--mca btl tcp,self '--tag-output'", "--dry-run", "--skip-host-lookup",
                               "--", "prog"});
  CHECK(o.hostfile == "hosts");
  CHECK(o.ranks_per_node == 4);
  CHECK(o.no_gpu);
  CHECK(o.fusion_threshold_kb == 64u);
  CHECK(o.pin == PinMode::socket);
  CHECK(o.exports == std::vector<std::pair<std::string, std::string>>{{"A", "1"}, {"B", "x=y,z"}});
  CHECK(o.log_level == "INFO");
  CHECK(o.output_on_all_devices);
  CHECK(o.log_on_all_devices);
  CHECK(o.mpirun == "/opt/mpi/bin/mpirun");
  CHECK(o.mpi_args == Args{"--mca", "btl", "tcp,self", "--tag-output"});
  CHECK(o.dry_run);
  CHECK(o.skip_host_lookup);
  CHECK(o.program == Args{"prog"});
}

TEST_CASE("cli: the three names of ranks per node", "[cli]") {
  CHECK(parse_command_line({"-n", "2", "--", "p"}).ranks_per_node == 2);
  CHECK(parse_command_line({"-n3", "--", "p"}).ranks_per_node == 3);
  CHECK(parse_command_line({"--n-per-node", "5", "--", "p"}).ranks_per_node == 5);
  CHECK(parse_command_line({"--n-per-node=6", "--", "p"}).ranks_per_node == 6);
  CHECK(parse_command_line({"--devices-per-node", "8", "--", "p"}).ranks_per_node == 8);
  CHECK_THAT(error_of({"-n", "2", "--devices-per-node", "2", "--", "p"}),
             Catch::Contains("-n/--n-per-node and --devices-per-node"));
  CHECK_THAT(error_of({"-n", "2", "--n-per-node", "3", "--", "p"}), Catch::Contains("give one"));
  CHECK_THAT(error_of({"-n", "0", "--", "p"}), Catch::Contains("an integer from 1 to 1000000"));
  CHECK_THAT(error_of({"-n", "-2", "--", "p"}), Catch::Contains("an integer from 1 to 1000000"));
  CHECK_THAT(error_of({"-n", "two", "--", "p"}), Catch::Contains("-n/--n-per-node two"));
  CHECK_THAT(error_of({"--devices-per-node", "1.5", "--", "p"}), Catch::Contains("--devices-per-node 1.5"));
  CHECK_THAT(error_of({"-n", "--", "p"}), Catch::Contains("n"));
}

TEST_CASE("cli: fusion threshold", "[cli]") {
  CHECK(parse_command_line({"--fusion-threshold", "0", "--", "p"}).fusion_threshold_kb == 0u);
  CHECK(parse_command_line({"--fusion-threshold=128", "--", "p"}).fusion_threshold_kb == 128u);
  for (const char* bad : {"-1", "abc", "1.5", "", "12KB", "99999999999999999999"}) {
    INFO(bad);
    CHECK_THAT(error_of({std::string("--fusion-threshold=") + bad, "--", "p"}),
               Catch::Contains("--fusion-threshold") && Catch::Contains("non-negative integer"));
  }
  // Horovod's bytes where KB are meant: 64 MB written as 67108864 would be 64 GiB.
  CHECK(error_of({"--fusion-threshold", "67108864", "--", "p"}) ==
        "--fusion-threshold 67108864: at most 16777216 KB (16 GiB); the value is in KB, not bytes as Horovod's (64 MB "
        "is --fusion-threshold 65536)");
  const Options big = parse_command_line({"--fusion-threshold", "16777216", "--", "p"});
  CHECK(big.fusion_threshold_kb == 16777216u);
  REQUIRE(big.warnings.size() == 1);
  CHECK(big.warnings[0] == "--fusion-threshold 16777216 is 16 GiB (the value is in KB): all the gradients of most "
                           "models in one bucket; if bytes were meant, 16 MB is --fusion-threshold 16384");
  CHECK(parse_command_line({"--fusion-threshold", "1048575", "--", "p"}).warnings.empty());
  CHECK(parse_command_line({"--fusion-threshold", "1048576", "--", "p"}).warnings.size() == 1);
}

TEST_CASE("cli: --topology without pinning is said to be unread; an empty one is refused", "[cli]") {
  // It plans pinned ranks only: before, --dry-run --topology garbage passed without a word.
  const Options unpinned = parse_command_line({"--dry-run", "--topology", "garbage", "--", "p"});
  REQUIRE(unpinned.warnings.size() == 1);
  CHECK(unpinned.warnings[0] == "--topology plans where pinned ranks go: without --pin-to-socket or "
                                "--pin-memory-to-socket it is not read");
  CHECK(parse_command_line({"--dry-run", "--pin-to-socket", "--topology", "pack:2 core:2", "--", "p"}).warnings.empty());
  CHECK(error_of({"--dry-run", "--topology", " ", "--", "p"}) ==
        "--topology: empty (an hwloc XML file or \"pack:2 core:8 pu:2\")");
}

TEST_CASE("cli: --requeue says at the start what would keep the job from being requeued", "[cli]") {
  // Before, only when SLURM's warning signal came, hours into the job.
  const Options bare = parse_command_line({"--requeue", "--", "p", "--model_dir=x"});
  const std::vector<std::string> w = with_requeue_warnings({"earlier"}, bare, Environment{});
  REQUIRE(w.size() == 3);
  CHECK(w[0] == "earlier");
  CHECK(w[1] == "--requeue: this is not a SLURM job (no SLURM_JOB_ID): a warning signal will stop the job with its "
                "checkpoint, but there is nothing to requeue");
  CHECK(w[2] == "--requeue: the program's arguments have no --resume=auto: a requeued run would train from the start "
                "again, so the job will not be requeued");
  const Options ready = parse_command_line({"--requeue", "--", "p", "--resume=auto"});
  CHECK(with_requeue_warnings({}, ready, Environment{{"SLURM_JOB_ID", "7"}}).empty());
  CHECK(with_requeue_warnings({}, parse_command_line({"--", "p"}), Environment{}).empty());
}

TEST_CASE("cli: -x", "[cli]") {
  auto o = parse_command_line({"-x", "A=", "-xB=2", "-x", "A=3", "--", "p"});
  CHECK(o.exports == std::vector<std::pair<std::string, std::string>>{{"A", "3"}, {"B", "2"}});
  CHECK_THAT(error_of({"-x", "NOEQUALS", "--", "p"}), Catch::Contains("-x NOEQUALS: expected KEY=VALUE"));
  CHECK(error_of({"-x", "", "--", "p"}) == "-x: empty; expected KEY=VALUE");  // not 'write -x ="$"'
  CHECK_THAT(error_of({"-x", "=v", "--", "p"}), Catch::Contains("not a valid environment variable name"));
  CHECK_THAT(error_of({"-x", "1A=v", "--", "p"}), Catch::Contains("not a valid environment variable name"));
  CHECK_THAT(error_of({"-x", "TNT_RANK=3", "--", "p"}), Catch::Contains("set by tarantella"));
  CHECK_THAT(error_of({"-x", "TNT_FUSION_THRESHOLD=3", "--fusion-threshold", "4", "--", "p"}),
             Catch::Contains("give one"));
  CHECK(parse_command_line({"-x", "TNT_FUSION_THRESHOLD=3", "--", "p"}).exports.size() == 1);
}

TEST_CASE("cli: log level and pinning", "[cli]") {
  CHECK(parse_command_line({"--log-level", "debug", "--", "p"}).log_level == "DEBUG");
  CHECK(parse_command_line({"--log-level", "Warn", "--", "p"}).log_level == "WARNING");
  CHECK(parse_command_line({"--log-level", "ERROR", "--", "p"}).log_level == "ERROR");
  CHECK_THAT(error_of({"--log-level", "loud", "--", "p"}), Catch::Contains("DEBUG, INFO, WARNING or ERROR"));
  CHECK(parse_command_line({"--pin-memory-to-socket", "--", "p"}).pin == PinMode::socket_strict);
  CHECK(parse_command_line({"--pin-to-socket", "--pin-memory-to-socket", "--", "p"}).pin == PinMode::socket_strict);
}

TEST_CASE("cli: hosts", "[cli]") {
  CHECK(parse_command_line({"-H", "a,b:2", "--", "p"}).hosts == "a,b:2");
  CHECK(parse_command_line({"--hosts", "a", "--", "p"}).hosts == "a");
  CHECK_THAT(error_of({"--hostfile", "f", "-H", "a", "--", "p"}), Catch::Contains("give one"));
  CHECK_THAT(error_of({"-H", " ", "--", "p"}), Catch::Contains("empty"));
}

TEST_CASE("cli: the program and the separator", "[cli]") {
  CHECK_THAT(error_of({"-n", "2"}), Catch::Contains("no program to run"));
  CHECK_THAT(error_of({}), Catch::Contains("no program to run"));
  CHECK_THAT(error_of({"-n", "2", "--"}), Catch::Contains("no program after '--'"));
  CHECK_THAT(error_of({"-n", "2", "./train"}), Catch::Contains("put '--' before the program"));
  CHECK_THAT(error_of({"--mpirun", "", "--", "p"}), Catch::Contains("--mpirun"));
  CHECK_THAT(error_of({"--mpi-args", "--mca 'unclosed", "--", "p"}), Catch::Contains("--mpi-args: unclosed '"));
  CHECK_THAT(error_of({"--topology", "pack:2 pu:1", "--", "p"}), Catch::Contains("--dry-run"));
  CHECK(parse_command_line({"--dry-run", "--topology", "pack:2 pu:1", "--", "p"}).topology == "pack:2 pu:1");
}

TEST_CASE("cli: an option that takes a value is given once", "[cli]") {
  // cxxopts would keep the last one silently; which one the user meant is unknown.
  CHECK(error_of({"--hostfile", "a", "--hostfile", "b", "--", "p"}) ==
        "--hostfile given 2 times ('a', 'b'); give it once");
  CHECK(error_of({"-H", "n1", "--hosts", "n2", "--", "p"}) == "-H/--hosts given 2 times ('n1', 'n2'); give it once");
  CHECK(error_of({"--mpirun", "m1", "--mpirun", "m2", "--mpirun", "m3", "--", "p"}) ==
        "--mpirun given 3 times ('m1', 'm2', 'm3'); give it once");
  CHECK(error_of({"--start-timeout", "1", "--start-timeout", "2", "--", "p"}) ==
        "--start-timeout given 2 times ('1', '2'); give it once");
  // -x is repeatable, and a flag without a value given twice is harmless.
  CHECK(parse_command_line({"-x", "A=1", "-x", "B=2", "--no-gpu", "--no-gpu", "--", "p"}).exports.size() == 2);
  // Stray words before '--' are refused, naming the first.
  CHECK(error_of({"--hostfile", "a", "stray", "--", "p"}) ==
        "unexpected argument 'stray': put '--' before the program, as in: tarantella [options] -- PROGRAM [ARGS...]");
}

TEST_CASE("cli: every option error names the option as written", "[cli]") {
  // cxxopts alone said "Argument 'maybe' failed to parse" and "Option 'bogus' does not
  // exist", in typographic quotes.
  CHECK(error_of({"--no-gpu=maybe", "--", "p"}) == "--no-gpu: takes no value (or true or false), got 'maybe'");
  CHECK(parse_command_line({"--no-gpu=true", "--", "p"}).no_gpu);
  CHECK_FALSE(parse_command_line({"--no-gpu=false", "--", "p"}).no_gpu);
  CHECK(error_of({"--bogus", "--", "p"}) == "--bogus: no such option (see tarantella --help)");
  CHECK(error_of({"-q", "--", "p"}) == "-q: no such option (see tarantella --help)");
  // horovodrun's and mpirun's spelling, the program's flags after it without '--': before,
  // "--batch_size: no such option" alone.
  CHECK(error_of({"-np", "2", "-H", "localhost:2", "build/bin/fashion_mnist", "--batch_size=64"}) ==
        "--batch_size: no such option of tarantella; it comes after 'build/bin/fashion_mnist': to pass options to "
        "the program, put '--' before it (tarantella [options] -- build/bin/fashion_mnist --batch_size=64 ...)");
  // Another launcher's option: what does the same here.
  CHECK(error_of({"--map-by", "socket", "--", "p"}) ==
        "--map-by: no such option; tarantella places the ranks itself (a host's slots fill before the next host's) "
        "and binds them with --pin-to-socket; --dry-run prints the plan. Other mpirun options go through --mpi-args "
        "\"...\" (see tarantella --help)");
  CHECK(error_of({"--nproc_per_node=4", "--", "p"}) ==
        "--nproc_per_node: no such option; torchrun's ranks per node are -n N here (see tarantella --help)");
  CHECK_THAT(error_of({"-mca", "btl", "tcp,self", "--", "p"}),
             Catch::StartsWith("-mca: no such option; mpirun's MCA parameters go through --mpi-args"));
  CHECK_THAT(error_of({"--master_port", "29500", "--", "p"}), Catch::StartsWith("--master_port: no such option; not needed"));
  CHECK_THAT(error_of({"--tag-output", "--", "p"}), Catch::Contains("--output-on-all-devices"));
  CHECK_THAT(error_of({"-p", "2222", "--", "p"}), Catch::Contains("--launch-agent \"ssh -p PORT\""));
  CHECK_THAT(error_of({"--ntasks-per-node=2", "--", "p"}), Catch::Contains("srun's tasks per node are -n N"));
  CHECK_THAT(error_of({"--ntasks-per-socket", "2", "--", "p"}), Catch::Contains("srun's tasks per socket, core or GPU"));
  CHECK_THAT(error_of({"--ntasks=8", "--", "p"}), Catch::Contains("srun's tasks in all are -np N"));
  // mpirun's one-dash long options: before, -host was read as -h with the value "ost".
  CHECK(error_of({"-host", "a,b", "--", "p"}) ==
        "-host: no such option; mpirun's --host is -H/--hosts LIST here (-H node1,node2:4) (see tarantella --help)");
  CHECK(error_of({"-hostfile", "hf", "--", "p"}) == "-hostfile: tarantella's long options take two dashes: --hostfile");
  CHECK_THAT(error_of({"-map-by", "core", "--", "p"}), Catch::StartsWith("-map-by: no such option; tarantella places"));
  CHECK(parse_command_line({"-n2", "-Hlocalhost:2", "--", "p"}).ranks_per_node == 2);
  // -n's letter followed by letters is a word: ours with one dash, or Open MPI's.
  CHECK(error_of({"-no-gpu", "--", "p"}) == "-no-gpu: tarantella's long options take two dashes: --no-gpu");
  CHECK(error_of({"-n-per-node", "2", "--", "p"}) ==
        "-n-per-node: tarantella's long options take two dashes: --n-per-node");
  CHECK_THAT(error_of({"-npersocket", "1", "--", "p"}), Catch::StartsWith("-npersocket: no such option; tarantella "
                                                                         "places the ranks itself"));
  CHECK_THAT(error_of({"-nolocal", "--", "p"}), Catch::StartsWith("-nolocal: no such option; tarantella runs ranks"));
  // --help=true after a program is the same question as --help there.
  CHECK_THAT(error_of({"-np", "2", "prog", "--help=true"}), Catch::StartsWith("--help comes after 'prog'"));
  CHECK_THAT(error_of({"-np", "2", "prog", "--version"}), Catch::StartsWith("--version comes after 'prog'"));
  // After a program its words are the program's: -host there is no -h.
  CHECK_THAT(error_of({"-np", "2", "prog", "-host", "x"}),
             Catch::StartsWith("-host: no such option of tarantella; it comes after 'prog'"));
  // -h after the program: whose help was meant is not known; before, tarantella's was printed.
  CHECK(error_of({"-np", "2", "build/bin/pi", "-h"}) ==
        "-h comes after 'build/bin/pi': for tarantella's help, write tarantella -h; to pass it to the program, put "
        "'--' before the program (tarantella [options] -- build/bin/pi -h)");
  CHECK_THAT(error_of({"prog", "--version"}), Catch::StartsWith("--version comes after 'prog': for tarantella's version"));
  CHECK(parse_command_line({"-np", "2", "-h", "--", "build/bin/pi"}).help);
  CHECK(error_of({"-n", "2", "--hostfile"}) == "--hostfile: missing its value");
  CHECK(error_of({"-n"}) == "-n: missing its value");
  CHECK(parse_command_line({"-n2", "--", "p"}).ranks_per_node == 2);
  CHECK(parse_command_line({"--hostfile=f", "--", "p"}).hostfile == "f");
}

TEST_CASE("cli: help and version need no program", "[cli]") {
  CHECK(parse_command_line({"--help"}).help);
  CHECK(parse_command_line({"-h"}).help);
  CHECK(parse_command_line({"--version"}).version);
  const std::string help = help_text();
  for (const char* option : {"--hostfile", "--hosts", "--n-per-node", "--devices-per-node", "--no-gpu",
                             "--fusion-threshold", "--pin-to-socket", "--pin-memory-to-socket", "-x", "--log-level",
                             "--output-on-all-devices", "--log-on-all-devices", "--mpirun", "--mpi-args",
                             "--dry-run", "--version", "--help", "--topology", "SLURM", "Exit status"}) {
    INFO(option);
    CHECK_THAT(help, Catch::Contains(option));
  }
}

TEST_CASE("cli: --heartbeat-timeout, --max-restarts and --launch-agent", "[cli]") {
  auto o = parse_command_line({"--heartbeat-timeout", "30", "--max-restarts", "3", "--launch-agent",
                               "ssh -p 2222 -i /keys/cluster", "--", "p"});
  CHECK(o.heartbeat_timeout_s == 30.0);
  CHECK(o.max_restarts == 3);
  CHECK(o.launch_agent == "ssh -p 2222 -i /keys/cluster");
  auto d = parse_command_line({"--", "p"});
  CHECK_FALSE(d.heartbeat_timeout_s);
  CHECK(d.max_restarts == 0);
  CHECK_FALSE(d.launch_agent);
  CHECK(error_of({"--max-restarts", "-1", "--", "p"}) == "--max-restarts -1: must be an integer from 0 to 1000");
  CHECK(error_of({"--max-restarts", "many", "--", "p"}) == "--max-restarts many: must be an integer from 0 to 1000");
  CHECK(error_of({"--launch-agent", " ", "--", "p"}) == "--launch-agent: the command is empty");
  CHECK(error_of({"--heartbeat-timeout", "soon", "--", "p"}) ==
        "--heartbeat-timeout soon: must be a number of seconds from 0 (no limit) to a year (31622400)");
  CHECK_THAT(help_text(), Catch::Contains("--heartbeat-timeout SECONDS") && Catch::Contains("--max-restarts K") &&
                              Catch::Contains("--launch-agent CMD") && Catch::Contains("TNT_RESTART"));
}

TEST_CASE("cli: -np N is ranks in all, in mpirun's and horovodrun's spellings", "[cli]") {
  for (const Args& args : {Args{"-np", "4", "--", "p"}, Args{"-np4", "--", "p"}, Args{"-np=4", "--", "p"},
                           Args{"--np", "4", "--", "p"}, Args{"--np=4", "--", "p"}}) {
    INFO(args.front());
    const Options o = parse_command_line(args);
    CHECK(o.total_ranks == 4);
    CHECK_FALSE(o.ranks_per_node);
    CHECK_FALSE(o.oversubscribe);
    CHECK(o.program == Args{"p"});
    CHECK(o.total_ranks_flag == (args.front().rfind("--", 0) == 0 ? "--np" : "-np"));
  }
  const Options o = parse_command_line({"--hostfile", "h", "-np", "6", "--oversubscribe", "--", "p", "-np", "2"});
  CHECK(o.total_ranks == 6);
  CHECK(o.oversubscribe);
  CHECK(o.program == Args{"p", "-np", "2"});  // the program's words stay the program's

  CHECK(error_of({"-np", "0", "--", "p"}) == "-np 0: the number of ranks in all must be a positive integer (at most 1000000)");
  CHECK(error_of({"--np=-2", "--", "p"}) == "--np -2: the number of ranks in all must be a positive integer (at most 1000000)");
  CHECK(error_of({"-np", "four", "--", "p"}) == "-np four: the number of ranks in all must be a positive integer (at most 1000000)");
  CHECK(error_of({"-np=", "--", "p"}) == "-np : the number of ranks in all must be a positive integer (at most 1000000)");
  CHECK(error_of({"-np", "--", "p"}) == "-np: missing its value (the number of ranks in all)");
  CHECK(error_of({"-np", "2", "-np", "3", "--", "p"}) == "the number of ranks in all given 2 times (-np 2, -np 3); give it once");
  // -n followed by letters is a word, not -n and a value ("-n/--n-per-node px" before).
  CHECK(error_of({"-npx", "--", "p"}) == "-npx: no such option (see tarantella --help)");
  CHECK(error_of({"--npx", "--", "p"}) == "--npx: no such option (see tarantella --help)");
  CHECK(error_of({"--oversubscribe", "--", "p"}) ==
        "--oversubscribe only applies to -np (ranks in all); ranks per node (-n) are placed as given");
  CHECK(error_of({"-n", "2", "--oversubscribe", "--", "p"}) ==
        "--oversubscribe only applies to -np (ranks in all); ranks per node (-n) are placed as given");
}

TEST_CASE("cli: -np with ranks per node is an error naming both", "[cli]") {
  CHECK(error_of({"-np", "4", "-n", "2", "--", "p"}) ==
        "-np 4 and -n 2 both set the number of ranks: -np counts them in all (placed over the hosts by their slots), "
        "-n on every host; give one");
  CHECK_THAT(error_of({"--npernode", "2", "-np4", "--", "p"}), Catch::StartsWith("-np 4 and --npernode 2 both set"));
  CHECK_THAT(error_of({"--np=4", "--devices-per-node", "2", "--", "p"}),
             Catch::StartsWith("--np 4 and --devices-per-node 2 both set"));
  CHECK_THAT(error_of({"-np", "4", "--n-per-node=2", "--", "p"}), Catch::StartsWith("-np 4 and --n-per-node 2 both set"));
}

TEST_CASE("cli: --npernode, Tarantella's spelling of ranks per node", "[cli]") {
  // The advanced topics' pinning example, word for word but for the program.
  const Options o = parse_command_line({"--hostfile", "hostfile", "--npernode", "2", "--pin-to-socket", "--", "model"});
  CHECK(o.ranks_per_node == 2);
  CHECK(o.ranks_flag == "--npernode");
  CHECK(o.hostfile == "hostfile");
  CHECK(o.pin == PinMode::socket);
  CHECK(o.program == Args{"model"});
  CHECK(parse_command_line({"--npernode=3", "--", "p"}).ranks_per_node == 3);
  CHECK(parse_command_line({"-npernode", "5", "--", "p"}).ranks_per_node == 5);  // Open MPI's single dash
  CHECK(error_of({"--npernode", "0", "--", "p"}) == "--npernode 0: ranks per node must be an integer from 1 to 1000000");
  CHECK_THAT(error_of({"--npernode", "2", "-n", "2", "--", "p"}),
             Catch::Contains("(--npernode and -n/--n-per-node); -n, --n-per-node, --devices-per-node and --npernode "
                             "are the same option, give one"));
}

TEST_CASE("cli: --help says where -n's default comes from and --heartbeat-timeout's bounds", "[cli]") {
  // As one line: cxxopts wraps the descriptions at 100 columns.
  std::string help;
  for (char c : help_text()) {
    const bool space = c == ' ' || c == '\n';
    if (!space || (!help.empty() && help.back() != ' ')) help += space ? ' ' : c;
  }
  CHECK_THAT(help, Catch::Contains("Ranks per node, on every host; not in all as mpirun's -n (that is -np here)"));
  CHECK_THAT(help, Catch::Contains("--npernode N Alias of -n"));
  CHECK_THAT(help, Catch::Contains("--np N Ranks in all, as mpirun's and horovodrun's -np N"));
  CHECK_THAT(help, Catch::Contains("--oversubscribe With -np: allow more ranks than the hosts' slots"));
  CHECK_THAT(help, Catch::Contains("tarantella --hostfile hostfile --npernode 2 --pin-to-socket -- ./train"));
  CHECK_THAT(help, Catch::Contains("tarantella -np 4 -- ./train 4 ranks on this machine, as mpirun -np 4"));
  // The installed launcher has no build/ or hostfiles/ beside it: its examples name none.
  CHECK_THAT(help, !Catch::Contains("build/") && !Catch::Contains("hostfiles/"));
  CHECK_THAT(help, Catch::Contains("tarantella -np 6 -H node1:4,node2:4 -- ./train 6 ranks in all: 4 on node1, 2 on node2"));
  CHECK_THAT(help, Catch::Contains("(default: the host's slots, else the SLURM allocation's tasks on the node, else "
                                   "the GPUs of this node, else 1 CPU rank)"));
  CHECK_THAT(help, Catch::Contains("0: off; else at least 1)"));
}

TEST_CASE("cli: an option's value is taken as written, even where it looks like -x or -np", "[cli]") {
  // Before, every word starting with -x was split (-x NCCL_DEBUG=INFO -> "-x" and " NCCL...")
  // and -np words were taken as ranks in all, values of --mpi-args included.
  using Args = std::vector<std::string>;
  CHECK(parse_command_line({"-n", "2", "--mpi-args", "-x NCCL_DEBUG=INFO -x FOO=1", "--", "p"}).mpi_args ==
        Args{"-x", "NCCL_DEBUG=INFO", "-x", "FOO=1"});
  CHECK(parse_command_line({"--mpi-args", "-np=2", "--", "p"}).mpi_args == Args{"-np=2"});
  CHECK(parse_command_line({"-H", "-xhost", "--dry-run", "--", "p"}).hosts == "-xhost");
  // Outside a value, both still work as before.
  const Options o = parse_command_line({"-np", "3", "-xA=1", "--", "p"});
  CHECK(o.total_ranks == 3);
  REQUIRE(o.exports.size() == 1);
  CHECK(o.exports[0] == std::pair<std::string, std::string>{"A", "1"});
}
