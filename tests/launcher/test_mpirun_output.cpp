// The filter of mpirun's standard error (mpirun_output.hpp), on Open MPI 4.1's own texts as
// mpirun prints them when a rank fails.
#include "mpirun_output.hpp"

#include <catch2/catch.hpp>

#include <optional>
#include <string>

using namespace tnt::launcher;

namespace {

const std::string dashes(74, '-');

const std::string abort_banner = dashes + "\n" +
                                 "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n"
                                 "with errorcode 1.\n"
                                 "\n"
                                 "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n"
                                 "You may or may not see output from other processes, depending on\n"
                                 "exactly when Open MPI kills them.\n" +
                                 dashes + "\n";
const std::string error_log =
    "[vm:20499] [[15597,0],0] ORTE_ERROR_LOG: Out of resource in file ../../../orte/util/show_help.c at line 507\n";
const std::string primary_job = dashes + "\n" +
                                "Primary job  terminated normally, but 1 process returned\n"
                                "a non-zero exit code. Per user-direction, the job has been aborted.\n" +
                                dashes + "\n";
const std::string non_zero = dashes + "\n" +
                             "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
                             "the job to be terminated. The first process to do so was:\n"
                             "\n"
                             "  Process name: [[8647,1],0]\n"
                             "  Exit code:    2\n" +
                             dashes + "\n";
const std::string aggregate = "[vm:20499] 1 more process has sent help message help-mpi-api.txt / mpi-abort\n"
                              "[vm:20499] Set MCA parameter \"orte_base_help_aggregate\" to 0 to see all help / error "
                              "messages\n";

// Everything the filter gives out for `input` fed in pieces of `piece` bytes, then flushed.
std::string relayed(MpirunOutputFilter& f, const std::string& input, size_t piece) {
  std::string out;
  for (size_t i = 0; i < input.size(); i += piece) out += f.feed(input.substr(i, piece));
  return out + f.flush();
}

}  // namespace

TEST_CASE("mpirun output: Open MPI's account of a failure is held back, the program's passes", "[mpirun_output]") {
  const std::string program = "error (rank 0 of 2): --model=foo: expected cnn or mlp\n";
  const std::string input = program + abort_banner + error_log + aggregate + primary_job + non_zero;
  for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}}) {
    INFO("fed in pieces of " << piece);
    MpirunOutputFilter f;
    CHECK(relayed(f, input, piece) == program);
    CHECK(f.held_back() == abort_banner + error_log + aggregate + primary_job + non_zero);
  }
}

TEST_CASE("mpirun output: a rank's last line without its newline does not hide the separator behind it",
          "[mpirun_output]") {
  // Both come through mpirun's standard error: "partial" and the 74 dashes were one line,
  // not a separator, and Open MPI's account of the failure passed on in full.
  const std::string input = "rank 1 partial" + primary_job + non_zero;
  for (size_t piece : {size_t{1}, size_t{4096}}) {
    INFO("fed in pieces of " << piece);
    MpirunOutputFilter f;
    CHECK(relayed(f, input, piece) == "rank 1 partial\n");
    CHECK(f.held_back() == primary_job + non_zero);
  }
  // A program's own line that ends in fewer dashes is its own, unchanged.
  MpirunOutputFilter g;
  const std::string own = "table " + std::string(40, '-') + "\n";
  CHECK(relayed(g, own, 4096) == own);
}

TEST_CASE("mpirun output: everything else passes on unchanged and in order", "[mpirun_output]") {
  // Another help message of Open MPI (why a job could not start) is the only account there
  // is; a program's own separators, and lines in brackets, are the program's.
  const std::string cannot_start = dashes + "\n" +
                                   "mpirun was unable to start the specified application as it encountered an\n"
                                   "error:\n" +
                                   dashes + "\n";
  const std::string input = "step 1\n" + cannot_start + "-----\n" + dashes + "\n" + dashes + "\nsummary\n" +
                            "[rank 0] ORTE_ERROR_LOG is a word in this line\n" + "tail without newline";
  for (size_t piece : {size_t{1}, size_t{5}, size_t{4096}}) {
    INFO("fed in pieces of " << piece);
    MpirunOutputFilter f;
    CHECK(relayed(f, input, piece) == input);
    CHECK(f.held_back().empty());
  }
}

TEST_CASE("mpirun output: a separator or a partial line waits only until flushed", "[mpirun_output]") {
  MpirunOutputFilter f;
  CHECK(f.feed(dashes + "\n").empty());  // it may open a failure block: held for now
  CHECK(f.pending());
  CHECK(f.flush() == dashes + "\n");
  CHECK_FALSE(f.pending());
  CHECK(f.feed("Enter a value: ").empty());
  CHECK(f.flush() == "Enter a value: ");
  // A block that never ends (mpirun killed while writing) is passed on at the end.
  CHECK(f.feed(dashes + "\nMPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n").empty());
  CHECK(f.flush() == dashes + "\nMPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n");
  CHECK(f.held_back().empty());
}

TEST_CASE("mpirun output: what is held back is bounded", "[mpirun_output]") {
  MpirunOutputFilter f;
  std::string input;
  while (input.size() <= MpirunOutputFilter::held_limit) input += error_log;
  CHECK(f.feed(input).empty());
  const std::string held = f.held_back();
  CHECK(held.size() < MpirunOutputFilter::held_limit + 100);
  CHECK_THAT(held, Catch::EndsWith(
                       std::to_string(input.size() - MpirunOutputFilter::held_limit) +
                       " more bytes of mpirun's messages not shown]\n"));
}

TEST_CASE("mpirun output: an error that several ranks print alike is shown once, the others named at the end",
          "[mpirun_output]") {
  const std::string msg = "--data_dir=/x: no such directory\n";
  // Ranks 3, 0, 1, 2, 5 refuse alike (in the order their lines come); rank 4 says something
  // else, rank 6 has a message of two lines (its continuation indented, as run_main writes
  // it) that rank 7 repeats; a line that only looks like an error passes.
  const std::string input = "error (rank 3 of 8): " + msg + "step 1\n" + "error (rank 0 of 8): " + msg +
                            "error (rank 4 of 8): checkpoint: other model\n" + "error (rank 1 of 8): " + msg +
                            "error (rank 6 of 8): two lines:\n  the second\n" + "error (rank 2 of 8): " + msg +
                            "error (rank 7 of 8): two lines:\n  the second\n" + "error (rank 5 of 8): " + msg +
                            "error (rank x of 8): " + msg + "error (rank 3 of 8): " + msg;
  for (size_t piece : {size_t{1}, size_t{9}, size_t{4096}}) {
    INFO("fed in pieces of " << piece);
    MpirunOutputFilter f;
    CHECK(relayed(f, input, piece) == "error (rank 3 of 8): " + msg + "step 1\n" +
                                          "error (rank 4 of 8): checkpoint: other model\n" +
                                          "error (rank 6 of 8): two lines:\n  the second\n" + "error (rank x of 8): " +
                                          msg + "error (rank 3 of 8): " + msg);
    CHECK(f.finish() ==
          "error (ranks 0-2, 5 of 8): the same error as rank 3\nerror (rank 7 of 8): the same error as rank 6\n");
    CHECK(f.finish().empty());  // said once
    CHECK(f.held_back().empty());
  }
}

TEST_CASE("mpirun output: without repeats, finish() adds nothing", "[mpirun_output]") {
  MpirunOutputFilter f;
  const std::string input = "error (rank 0 of 2): a\nerror (rank 1 of 2): b\n  indented line of rank 1\n";
  CHECK(relayed(f, input, 4096) == input);
  CHECK(f.finish().empty());
}

namespace {

// Open MPI 4.1 (help-plm-base.txt, no-local-orted... daemons), as mpirun prints it when
// the launch agent could not start its daemon on a host.
const std::string daemons_block = dashes + "\n" +
                                  "ORTE was unable to reliably start one or more daemons.\n"
                                  "This usually is caused by:\n"
                                  "\n"
                                  "* not finding the required libraries and/or binaries on\n"
                                  "  one or more nodes. Please check your PATH and LD_LIBRARY_PATH\n"
                                  "  settings, or configure OMPI with --enable-orterun-prefix-by-default\n"
                                  "\n"
                                  "* lack of authority to execute on one or more specified nodes.\n"
                                  "  Please verify your allocation and authorities.\n" +
                                  dashes + "\n";

}  // namespace

TEST_CASE("mpirun output: the hosts that the launch agent could not reach, and why", "[mpirun_output]") {
  auto host_of = [](const std::string& line) {
    auto p = host_problem(line);
    return p ? p->host : std::string("-");
  };
  CHECK(host_of("ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known\n") ==
        "nosuchhost.invalid");
  CHECK(host_of("ssh: Could not resolve hostname h2: Temporary failure in name resolution") == "h2");
  CHECK(host_of("ssh: connect to host 10.0.0.7 port 22: Connection refused\n") == "10.0.0.7");
  CHECK(host_of("ssh: connect to host h3 port 2222: Connection timed out") == "h3");
  CHECK(host_of("root@h4: Permission denied (publickey,password).") == "h4");
  CHECK(host_problem("ssh: connect to host 10.0.0.7 port 22: Connection refused")->said ==
        "ssh: connect to host 10.0.0.7 port 22: Connection refused");
  // Not a host problem.
  CHECK(host_of("error (rank 0 of 2): Permission denied: /data") == "-");
  CHECK(host_of("cannot open file: Permission denied") == "-");
  CHECK(host_of("ssh: connect to host") == "-");
  CHECK(host_of("Host key verification failed.") == "-");

  MpirunOutputFilter f;
  const std::string ssh_line = "ssh: connect to host h2 port 22: Connection refused\n";
  // The agent's own line passes; Open MPI's list of possible causes is held back.
  CHECK(f.feed(ssh_line + daemons_block) == ssh_line);
  CHECK(f.flush().empty());
  CHECK(f.daemons_failed());
  REQUIRE(f.host_problems().size() == 1);
  CHECK(f.host_problems()[0].host == "h2");
  CHECK(f.held_back() == daemons_block);
  // The same host again is not a second problem.
  f.feed(ssh_line);
  CHECK(f.host_problems().size() == 1);

  MpirunOutputFilter quiet;
  CHECK(quiet.feed("a rank's line\n") == "a rank's line\n");
  CHECK_FALSE(quiet.daemons_failed());
  CHECK(quiet.host_problems().empty());
}

TEST_CASE("mpirun output: the rank Open MPI ended the job for, when it exited improperly", "[mpirun_output]") {
  // Open MPI 4.1's help-orterun.txt block, as mpirun printed it when rank 1 exited 0 while
  // rank 0 was in MPI_Init (the line breaks before "node ... exiting improperly").
  const std::string improper = dashes + "\n" +
                               "mpirun has exited due to process rank 1 with PID 0 on\n"
                               "node vm exiting improperly. There are three reasons this could occur:\n"
                               "\n"
                               "1. this process did not call \"init\" before exiting, but others in\n"
                               "the job did. This can cause a job to hang indefinitely while it waits\n"
                               "for all processes to call \"init\". By rule, if one process calls \"init\",\n"
                               "then ALL processes must call \"init\" prior to termination.\n" +
                               dashes + "\n";
  for (size_t piece : {size_t{1}, size_t{4096}}) {
    INFO("fed in pieces of " << piece);
    MpirunOutputFilter f;
    CHECK(relayed(f, "a rank's line\n" + improper, piece) == "a rank's line\n");
    CHECK(f.improper_exit_rank() == std::optional<int>(1));
    CHECK(f.held_back() == improper);
  }
  // Other exits Open MPI reports name no improper rank; neither does a program's own line.
  MpirunOutputFilter other;
  other.feed(abort_banner + non_zero + "my job has exited due to process rank 12 with PID 5 on node x\n");
  CHECK_FALSE(other.improper_exit_rank().has_value());
  MpirunOutputFilter one_line;
  one_line.feed("mpirun has exited due to process rank 12 with PID 5 on node x exiting improperly.\n");
  CHECK(one_line.improper_exit_rank() == std::optional<int>(12));
  MpirunOutputFilter not_a_rank;
  not_a_rank.feed("mpirun has exited due to process rank x with PID 5 on\nnode vm exiting improperly.\n");
  CHECK_FALSE(not_a_rank.improper_exit_rank().has_value());
}

TEST_CASE("mpirun output: mpirun's own crash report is held back, a rank's passes", "[mpirun_output]") {
  // Open MPI 4.1's mpirun crashes when a signal finds it ending the job already (a terminal's
  // Ctrl-C reaches it directly); the same report from a rank's program (another PID) is the
  // program's and passes on.
  auto crash = [](long pid) {
    const std::string p = "[vm:0" + std::to_string(pid) + "] ";  // Open MPI pads the id
    return p + "*** Process received signal ***\n" + p + "Signal: Segmentation fault (11)\n" + p +
           "[ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7f66b4202050]\n" + p + "*** End of error message ***\n";
  };
  const std::string abort_note = "mpirun: abort is already in progress...hit ctrl-c again to forcibly terminate\n\n";
  MpirunOutputFilter f;
  f.set_mpirun_pid(4242);
  const std::string after = "tarantella: next line\n";
  CHECK(relayed(f, abort_note + crash(4242) + after, 4096) == after);
  CHECK(f.held_back() == abort_note + crash(4242));
  MpirunOutputFilter g;
  g.set_mpirun_pid(4242);
  CHECK(relayed(g, crash(777), 4096) == crash(777));
}

TEST_CASE("mpirun output: a transport's lost-peer line is held back, a program's look-alike passes", "[mpirun_output]") {
  // Open MPI's shared-memory transport on a rank whose peer was killed: the launcher names
  // the killed rank, so these lines are shown only when nothing else explains the end.
  MpirunOutputFilter f;
  const std::string lost = "[vm:28251] Read -1, expected 2101248, errno = 3\n";
  const std::string program = "Read -1, expected 8, errno = 3: my own message\n";
  CHECK(relayed(f, lost + program, 4096) == program);
  CHECK(f.held_back() == lost);
}

TEST_CASE("mpirun output: PMIx's error line about a rank that is gone is held back", "[mpirun_output]") {
  // Printed when a parameter-server worker is dropped: the launcher says which, and users
  // took this line for the job's error.
  MpirunOutputFilter f;
  const std::string pmix = "[vm:14065] PMIX ERROR: BAD-PARAM in file ../../../src/event/pmix_event_notification.c at line 1033\n";
  const std::string program = "PMIX ERROR: in file my_model.cpp, my own words\n";
  CHECK(relayed(f, pmix + program, 4096) == program);
  CHECK(f.held_back() == pmix);
}

TEST_CASE("mpirun output: mpirun's word that it forwards a signal is dropped", "[mpirun_output]") {
  MpirunOutputFilter f;
  const std::string program = "fashion_mnist: SIGUSR1 received\n";
  CHECK(relayed(f, "mpirun: Forwarding signal 10 to job\n" + program, 4096) == program);
  CHECK(f.held_back().empty());  // not shown at the job's end either
}
