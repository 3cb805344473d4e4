// Finding executables the way execvp will, so that a missing program or mpirun is
// reported by the launcher, before any rank starts, instead of once per rank.
#pragma once

#include "environment.hpp"

#include <optional>
#include <string>

namespace tnt::launcher {

enum class ExecutableProblem { none, not_found, not_executable, is_directory };

struct ExecutableLookup {
  std::string path;  // the resolved path when found
  ExecutableProblem problem = ExecutableProblem::none;
};

// A name with '/' is a path (relative to the working directory); any other name is
// searched in `path_env` (a PATH value).
ExecutableLookup find_executable(const std::string& name, const std::string& path_env);

// The interpreter that the script at `path` names on its "#!" line, when that interpreter
// does not exist (execve then fails with ENOENT, as if the script itself were missing);
// nullopt for anything else (no such file, no "#!" line, an interpreter that exists).
std::optional<std::string> missing_interpreter(const std::string& path);

// Why `program` could not be started when exec failed with `err`: the interpreter of a
// script that names a missing one, else strerror(err).
std::string exec_failure_reason(const std::string& program, int err);

// Throws InputError naming the program and what is wrong with it (also a script whose
// interpreter does not exist).
void check_program(const std::string& program, const Environment& env);

// mpirun: --mpirun if given, else the one tarantella was built against, else mpirun on PATH.
// Throws InputError when none can be run.
std::string resolve_mpirun(const std::optional<std::string>& requested, const std::string& built_with,
                           const Environment& env);

// --launch-agent: the program of the command (its first word) must be one that mpirun can
// run, or even a job on this machine alone fails (Open MPI sets up its rsh launcher before
// it knows that no other host is needed). Open MPI's "ssh : rsh" form (alternatives, the
// first found is used) passes when any of them is found. Throws InputError naming
// --launch-agent, the program and the problem.
void check_launch_agent(const std::string& agent, const Environment& env);

// Absolute path of the running launcher binary, which mpirun starts as the per-rank step.
std::string self_executable();

// Writes a file the user named for output (OPTION, such as "--csv", names it in messages):
// a regular file beside it, then renamed (a failed write leaves the old one); through links
// to the name they lead to (the links stay); a device or FIFO (/dev/stdout) written
// directly, never replaced. InputError for a directory, a link loop, a missing folder or a
// FIFO nothing reads; SystemError for a failed write (a full disk).
void write_output_file(const std::string& option, const std::string& path, const std::string& text);

}  // namespace tnt::launcher
