// Running the launcher from a test: spawn with a chosen environment, capture stdout and
// stderr, wait with a deadline, and send signals. A test that waits past its deadline
// kills the whole process group it started and reports a timeout rather than hanging.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <sys/types.h>
#include <vector>

namespace tnt_test {

using Env = std::map<std::string, std::string>;

// This process's environment without any TNT_* variable, plus what root needs for Open MPI.
Env clean_environment();

struct Outcome {
  int status = 0;  // as from waitpid
  std::string out, err;
  double seconds = 0;
  bool timed_out = false;

  bool exited(int code) const;
  bool signaled(int sig) const;
  std::string describe() const;  // for INFO(): status, stdout and stderr
};

class Process {
 public:
  Process(const std::vector<std::string>& argv, const Env& env);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const;
  // Reads output until the process has exited and its output is closed, or the deadline.
  Outcome wait(std::chrono::milliseconds deadline);

 private:
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  std::chrono::steady_clock::time_point start_;
  bool reaped_ = false;
};

Outcome run(const std::vector<std::string>& argv, const Env& env,
            std::chrono::milliseconds deadline = std::chrono::seconds(60));

// PIDs of live (non-zombie) processes whose command line contains `marker` as a whole
// argument, the test process itself excluded.
std::vector<pid_t> processes_with_argument(const std::string& marker);

// The command name (/proc/PID/comm), empty when the process is gone.
std::string process_name(pid_t pid);

// Whether `pid` is a live (non-zombie) process with `marker` among its arguments: a PID
// that a test recorded, checked so that a reused PID never counts as the same process.
bool alive_with_argument(pid_t pid, const std::string& marker);

// Every PID recorded in `files` (one number per file, missing files skipped) that is still
// alive with `marker` among its arguments; the guard kills those when it goes out of scope,
// so a test that fails leaves nothing behind for the next one.
struct RecordedPids {
  std::vector<std::string> files;
  std::string marker;
  std::vector<pid_t> alive() const;
  ~RecordedPids();
};

// Waits (at most `limit`) until every file exists; false when one is still missing.
bool wait_for_files(const std::vector<std::string>& files, std::chrono::milliseconds limit);

// Kills (and returns) whatever still carries `marker` 10 s from now, so that nothing a test
// started is left to the next one.
std::vector<pid_t> left_with(const std::string& marker);

// A fresh directory under the system's temporary one (PREFIX_XXXXXX), removed with
// everything in it; files for the ranks to write, and scripts for them to run.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& prefix);  // throws std::runtime_error
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  // An executable script `name`: first_line (its #! line), then text.
  std::string script(const std::string& name, const std::string& text,
                     const std::string& first_line = "#!/bin/sh") const;
};

}  // namespace tnt_test
