// mpirun's standard error, as the launcher relays it to the user. When a rank fails, Open
// MPI adds its own account: the MPI_ABORT banner ("MPI_ABORT was invoked on rank 0 ...
// NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes ..."), "Primary job
// terminated normally, but 1 process returned a non-zero exit code", "mpirun detected that
// one or more processes exited with non-zero status", ORTE_ERROR_LOG lines that name Open
// MPI's source files, notes about aggregated help messages. The program has said what went
// wrong, and the launcher names the rank that failed first; those blocks only bury both.
//
// The filter holds them back and passes everything else on unchanged, in order. What it
// held back is not lost: when the launcher has no account of its own (no rank reported a
// failure, mpirun failed by itself), it prints it after all.
//
// Open MPI writes each help message between two separator lines of dashes, in one write.
// A separator is held only until the next line shows whether a known block follows, and a
// line without its newline only until more output comes or the caller flushes (a program's
// prompt is not kept from the user).
//
// When mpirun cannot start its daemon on a host, Open MPI's block "ORTE was unable to
// reliably start one or more daemons" (a list of possible causes, none of them named) is
// held back too, and the filter keeps what the launch agent said about which host it could
// not reach and why (host_problem()): the launcher names the host in one line, and prints
// the block only when it cannot.
//
// A refusal that every rank makes alike ("error (rank 5 of 512): --data_dir=...: no such
// directory") would fill the screen at scale: the first rank's line passes, the same line
// from other ranks (and its indented continuation lines) is held, and at the job's end
// finish() gives one line naming them: "error (ranks 1-511 of 512): the same error as rank 0".
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tnt::launcher {

// 1, 2, 3, 5, 7, 8 -> "1-3, 5, 7-8".
std::string rank_ranges(std::vector<long> ranks);

// A host that mpirun could not start its daemon on, as ssh (or an agent like it) said:
// "ssh: Could not resolve hostname h2: ...", "ssh: connect to host h2 port 22: Connection
// refused", "user@h2: Permission denied (publickey)."
struct HostProblem {
  std::string host;
  std::string said;  // the line, without its newline
};

// The host problem a line of mpirun's standard error reports, if any. Pure, for tests.
std::optional<HostProblem> host_problem(std::string_view line);

class MpirunOutputFilter {
 public:
  // Bytes read from mpirun's standard error; returns what to write to the user's now.
  std::string feed(std::string_view bytes);
  // Whether something waits for more output (a partial line, a separator).
  bool pending() const { return !partial_.empty() || !block_.empty(); }
  // Gives out what waits, as it is: nothing more came for a while, or mpirun's output ended.
  std::string flush();
  // What was held back, in order (at most `held_limit` bytes; more is counted, not kept).
  std::string held_back() const;
  // At the job's end (after the last flush): a line per error that other ranks repeated.
  std::string finish();

  // Hosts whose launch agent said why it could not reach them (each host once, in order).
  const std::vector<HostProblem>& host_problems() const { return host_problems_; }
  // Whether Open MPI said that it could not start its daemons ("ORTE was unable to
  // reliably start one or more daemons"); that block is held back.
  bool daemons_failed() const { return daemons_failed_; }
  // The rank Open MPI blamed for ending the job because it "exited improperly" ("mpirun has
  // exited due to process rank 1 with PID ... exiting improperly"): it exited without
  // MPI_Init while other ranks had called it, or after MPI_Init without MPI_Finalize; mpirun
  // then ends the others with SIGTERM. That block is held back (the launcher names the rank).
  std::optional<int> improper_exit_rank() const { return improper_ ? improper_rank_ : std::nullopt; }

  // mpirun's own process id: the report of its crash ("[host:PID] *** Process received
  // signal ***" to "*** End of error message ***", Open MPI 4.1's mpirun crashes when a signal
  // finds it ending the job already) is held back like the failure blocks; a rank's
  // program's report in the same form (another PID) passes on.
  void set_mpirun_pid(long pid) { mpirun_pid_ = pid; }

  static constexpr size_t held_limit = 64 * 1024;
  static constexpr size_t max_distinct_errors = 256;  // more distinct ones pass on as they are

 private:
  struct RankError {
    std::string size;     // "2" of "error (rank 0 of 2): ..."
    std::string message;  // what follows "): ", its newline included
    std::string first;    // the rank whose line passed
    std::vector<long> repeated_by;
  };
  bool repeated_error(const std::string& text);
  void line(std::string text, std::string& out);
  void hold(const std::string& text);

  long mpirun_pid_ = -1;             // mpirun's process id (-1 unknown)
  bool in_crash_ = false;            // inside mpirun's crash report
  bool after_abort_note_ = false;    // the line before was mpirun's "abort is already in progress"
  size_t crash_lines_ = 0;
  std::string partial_;              // the last line, until its newline comes
  std::vector<std::string> block_;   // a block that began with a separator, being read
  std::string held_;
  size_t dropped_bytes_ = 0;         // held back beyond held_limit
  std::vector<RankError> errors_;
  bool in_repeat_ = false;           // the last line was a repeated error: its continuation goes too
  std::vector<HostProblem> host_problems_;
  bool daemons_failed_ = false;      // "ORTE was unable to reliably start one or more daemons" seen
  std::optional<int> improper_rank_;  // "has exited due to process rank N" seen
  bool improper_ = false;             // and "exiting improperly" after it
};

}  // namespace tnt::launcher
