#include "paths.hpp"

#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>

#include <climits>
#include <sys/stat.h>
#include <unistd.h>

namespace tnt::launcher {

namespace {

ExecutableProblem examine(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ExecutableProblem::not_found;
  if (S_ISDIR(st.st_mode)) return ExecutableProblem::is_directory;
  if (::access(path.c_str(), X_OK) != 0) return ExecutableProblem::not_executable;
  return ExecutableProblem::none;
}

std::string problem_text(const std::string& what, const ExecutableLookup& found, bool searched_path) {
  switch (found.problem) {
    case ExecutableProblem::not_found:
      return searched_path ? fmt::format("{}: not found in PATH", what) : fmt::format("{}: no such file", what);
    case ExecutableProblem::not_executable:
      return fmt::format("{}: '{}' is not executable (chmod +x?)", what, found.path);
    case ExecutableProblem::is_directory: return fmt::format("{}: '{}' is a directory", what, found.path);
    case ExecutableProblem::none: break;
  }
  return what;
}

}  // namespace

ExecutableLookup find_executable(const std::string& name, const std::string& path_env) {
  if (name.find('/') != std::string::npos) return {name, examine(name)};
  ExecutableLookup first_problem{name, ExecutableProblem::not_found};
  for (auto dir : split(path_env, ':')) {
    // An empty PATH entry means the working directory, as for execvp.
    std::string candidate = dir.empty() ? name : fmt::format("{}/{}", dir, name);
    auto problem = examine(candidate);
    if (problem == ExecutableProblem::none) return {candidate, problem};
    if (problem != ExecutableProblem::not_found && first_problem.problem == ExecutableProblem::not_found) {
      first_problem = {candidate, problem};
    }
  }
  return first_problem;
}

void check_program(const std::string& program, const Environment& env) {
  auto found = find_executable(program, lookup(env, "PATH").value_or("/usr/local/bin:/usr/bin:/bin"));
  if (found.problem != ExecutableProblem::none) {
    throw InputError(problem_text(fmt::format("program '{}'", program), found,
                                  program.find('/') == std::string::npos));
  }
}

std::string resolve_mpirun(const std::optional<std::string>& requested, const std::string& built_with,
                           const Environment& env) {
  const std::string path = lookup(env, "PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  if (requested) {
    auto found = find_executable(*requested, path);
    if (found.problem != ExecutableProblem::none) {
      throw InputError(problem_text(fmt::format("--mpirun '{}'", *requested), found,
                                    requested->find('/') == std::string::npos));
    }
    return found.path;
  }
  if (!built_with.empty() && find_executable(built_with, path).problem == ExecutableProblem::none) return built_with;
  auto found = find_executable("mpirun", path);
  if (found.problem != ExecutableProblem::none) {
    throw InputError(
        "mpirun not found in PATH: install Open MPI (Debian package openmpi-bin) or give --mpirun PATH");
  }
  return found.path;
}

std::string self_executable() {
  char buf[PATH_MAX] = {};
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw system_error("cannot find the launcher's own path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace tnt::launcher
