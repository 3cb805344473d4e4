#include "paths.hpp"

#include "shell_words.hpp"

#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fcntl.h>
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

std::optional<std::string> missing_interpreter(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  // The kernel reads at most this much of a "#!" line (BINPRM_BUF_SIZE).
  char head[256];
  ssize_t n = 0;
  do {
    n = ::read(fd, head, sizeof head);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n < 2 || head[0] != '#' || head[1] != '!') return std::nullopt;
  std::string_view line(head + 2, static_cast<size_t>(n) - 2);
  line = line.substr(0, line.find('\n'));
  line = trim(line);
  const std::string interpreter(line.substr(0, line.find_first_of(" \t")));
  struct stat st {};
  if (interpreter.empty() || ::stat(interpreter.c_str(), &st) == 0 || errno != ENOENT) return std::nullopt;
  return interpreter;
}

std::string exec_failure_reason(const std::string& program, int err) {
  if (err == ENOENT) {
    const char* path_env = std::getenv("PATH");
    const auto found = find_executable(program, path_env ? path_env : "/usr/local/bin:/usr/bin:/bin");
    if (found.problem == ExecutableProblem::none) {
      if (auto interpreter = missing_interpreter(found.path)) {
        return fmt::format("its interpreter '{}' (named on its #! line) was not found", excerpt(*interpreter, 200));
      }
    }
  }
  return std::strerror(err);
}

void check_program(const std::string& program, const Environment& env) {
  auto found = find_executable(program, lookup(env, "PATH").value_or("/usr/local/bin:/usr/bin:/bin"));
  if (found.problem != ExecutableProblem::none) {
    // "tarantella -- -n 2 ./train": the launcher's options came after the separator.
    const std::string hint = found.problem == ExecutableProblem::not_found && !program.empty() && program[0] == '-'
                                 ? " (options of the launcher go before '--': tarantella -n 2 -- PROGRAM)"
                                 : "";
    throw InputError(problem_text(fmt::format("program '{}'", program), found,
                                  program.find('/') == std::string::npos) +
                     hint);
  }
  if (auto interpreter = missing_interpreter(found.path)) {
    throw InputError(fmt::format("program '{}': its interpreter '{}' (named on its #! line) was not found", program,
                                 excerpt(*interpreter, 200)));
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

void check_launch_agent(const std::string& agent, const Environment& env) {
  const std::string path = lookup(env, "PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  std::vector<std::string> programs;
  for (auto alternative : split(agent, ':')) {
    std::vector<std::string> words;
    try {
      words = split_shell_words(alternative);
    } catch (const InputError& e) {
      throw InputError(fmt::format("--launch-agent '{}': {}", excerpt(agent, 200), e.what()));
    }
    if (words.empty()) {
      throw InputError(fmt::format("--launch-agent '{}': an alternative between ':' is empty", excerpt(agent, 200)));
    }
    programs.push_back(words.front());
  }
  std::string first_problem;
  for (const std::string& program : programs) {
    const auto found = find_executable(program, path);
    if (found.problem == ExecutableProblem::none) return;
    if (first_problem.empty()) {
      first_problem = problem_text(fmt::format("--launch-agent '{}': its program '{}'", excerpt(agent, 200),
                                               excerpt(program, 200)),
                                   found, program.find('/') == std::string::npos);
    }
  }
  throw InputError(fmt::format("{} (mpirun runs it to start ranks on other hosts, and refuses to start "
                               "without it)", first_problem));
}

std::string self_executable() {
  char buf[PATH_MAX] = {};
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw system_error("cannot find the launcher's own path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

namespace {

// Opens a device, FIFO or stream for writing, as `>> PATH` would (no truncation: /dev/stdout
// may be a file the shell opened). A FIFO whose reader is not there yet is waited for, up to
// 10 s; -1 with errno set on failure, ENXIO when no reader came.
int open_stream(const std::string& path) {
  for (int tries = 0;; ++tries) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      return fd;
    }
    if (errno != ENXIO || tries == 200) return -1;
    timespec tick{0, 50'000'000};
    ::nanosleep(&tick, nullptr);
  }
}

}  // namespace

void write_output_file(const std::string& option, const std::string& given, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A failed write is the machine's (a full disk): exit 1, not an input error's 2.
  auto failed = [&](int err) {
    return SystemError(fmt::format("{} {}: cannot write it: {}", option, given, std::strerror(err)));
  };
  // The kernel follows the links first: /dev/stdout and /dev/fd/N lead through /proc to a
  // pipe or a terminal, which no path names. A device, FIFO or stream (anything under /dev
  // or /proc) is written into, never replaced.
  const fs::file_status st = fs::status(given, ec);
  if (fs::is_directory(st)) throw InputError(fmt::format("{} {}: a directory, not a file", option, given));
  const bool stream = given.rfind("/dev/", 0) == 0 || given.rfind("/proc/", 0) == 0;
  if (fs::exists(st) && (stream || !fs::is_regular_file(st))) {
    const int fd = open_stream(given);
    if (fd < 0 && errno == ENXIO) {
      throw InputError(fmt::format("{} {}: a FIFO that nothing read within 10 s (start its reader first)", option,
                                   given));
    }
    if (fd < 0) throw failed(errno);
    std::FILE* f = ::fdopen(fd, "w");
    if (f == nullptr) {
      const int err = errno;
      ::close(fd);
      throw failed(err);
    }
    errno = 0;
    bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    int err = errno;
    if (std::fclose(f) != 0) {
      ok = false;
      err = errno;
    }
    if (!ok) throw failed(err != 0 ? err : EIO);
    return;
  }
  // A file, or none yet: links are followed by hand to the name they finally give (relative
  // to the link's folder, at most 40 hops as the kernel does), so that the file is replaced
  // and the links stay; a link to nothing is written through, as `> PATH` would create its
  // target, where the target's folder exists.
  fs::path path = given;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(path, ec)); ++hops) {
    const fs::path next = fs::read_symlink(path, ec);
    if (ec || hops == 40) throw InputError(fmt::format("{} {}: a link that leads nowhere (a loop)", option, given));
    path = next.is_absolute() ? next : path.parent_path() / next;
  }
  if (!fs::exists(fs::status(path, ec)) &&
      !fs::is_directory(path.has_parent_path() ? path.parent_path() : fs::path("."), ec)) {
    throw InputError(fmt::format("{} {}: its folder '{}' does not exist", option, given, path.parent_path().string()));
  }
  // Beside the target, then renamed: a failed write never leaves half a file where one stood.
  const std::string tmp = path.string() + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr;
  if (ok) {
    ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    ok = (std::fclose(f) == 0) && ok;
  }
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw failed(err);
  }
}

}  // namespace tnt::launcher
