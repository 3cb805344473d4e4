#include "process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace tnt_test {

Env clean_environment() {
  Env env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s(*e);
    auto eq = s.find('=');
    if (eq == std::string::npos || s.compare(0, 4, "TNT_") == 0) continue;
    env[s.substr(0, eq)] = s.substr(eq + 1);
  }
  return env;
}

bool Outcome::exited(int code) const { return !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == code; }
bool Outcome::signaled(int sig) const { return !timed_out && WIFSIGNALED(status) && WTERMSIG(status) == sig; }

std::string Outcome::describe() const {
  std::ostringstream s;
  if (timed_out) {
    s << "TIMED OUT";
  } else if (WIFEXITED(status)) {
    s << "exit " << WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    s << "signal " << WTERMSIG(status);
  }
  s << " after " << seconds << " s\n--- stdout\n" << out << "--- stderr\n" << err;
  return s.str();
}

Process::Process(const std::vector<std::string>& argv, const Env& env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so a timeout can take down everything it started.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) sigaddset(&defaults, s);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  start_ = std::chrono::steady_clock::now();
  int rc = ::posix_spawn(&pid_, args[0], &fa, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  out_ = out[0];
  err_ = err[0];
  if (rc != 0) throw std::runtime_error(std::string("posix_spawn ") + argv[0] + ": " + std::strerror(rc));
}

Process::~Process() {
  if (!reaped_ && pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_ >= 0) ::close(out_);
  if (err_ >= 0) ::close(err_);
}

void Process::signal(int sig) const { ::kill(pid_, sig); }

Outcome Process::wait(std::chrono::milliseconds deadline) {
  Outcome o;
  const auto until = start_ + deadline;
  bool out_open = true, err_open = true;
  char buf[4096];
  while (!reaped_ || out_open || err_open) {
    if (!reaped_ && ::waitpid(pid_, &o.status, WNOHANG) == pid_) {
      reaped_ = true;
      o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      o.timed_out = true;
      ::kill(-pid_, SIGKILL);
      if (!reaped_) ::waitpid(pid_, &o.status, 0);
      reaped_ = true;
      break;
    }
    pollfd fds[2] = {{out_open ? out_ : -1, POLLIN, 0}, {err_open ? err_ : -1, POLLIN, 0}};
    ::poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 20)));
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? o.out : o.err).append(buf, static_cast<size_t>(n));
      } else {
        (i == 0 ? out_open : err_open) = false;
      }
    }
  }
  if (o.seconds == 0) {
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  return o;
}

Outcome run(const std::vector<std::string>& argv, const Env& env, std::chrono::milliseconds deadline) {
  Process p(argv, env);
  return p.wait(deadline);
}

std::vector<pid_t> processes_with_argument(const std::string& marker) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  const pid_t self = ::getpid();
  while (dirent* d = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(d->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) continue;
    std::ifstream stat("/proc/" + std::string(d->d_name) + "/stat");
    std::string stat_line;
    std::getline(stat, stat_line);
    auto close_paren = stat_line.rfind(')');
    if (close_paren == std::string::npos || close_paren + 2 >= stat_line.size()) continue;
    if (stat_line[close_paren + 2] == 'Z') continue;
    std::ifstream cmdline("/proc/" + std::string(d->d_name) + "/cmdline");
    std::string arg;
    while (std::getline(cmdline, arg, '\0')) {
      if (arg == marker) {
        found.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  ::closedir(proc);
  return found;
}

std::string process_name(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

bool alive_with_argument(pid_t pid, const std::string& marker) {
  if (pid <= 0) return false;
  const std::string dir = "/proc/" + std::to_string(pid);
  std::ifstream stat(dir + "/stat");
  std::string stat_line;
  std::getline(stat, stat_line);
  auto close_paren = stat_line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat_line.size()) return false;
  if (stat_line[close_paren + 2] == 'Z') return false;
  std::ifstream cmdline(dir + "/cmdline");
  std::string arg;
  while (std::getline(cmdline, arg, '\0')) {
    if (arg == marker) return true;
  }
  return false;
}

std::vector<pid_t> RecordedPids::alive() const {
  std::vector<pid_t> out;
  for (const auto& f : files) {
    std::ifstream in(f);
    long pid = 0;
    if (in >> pid && alive_with_argument(static_cast<pid_t>(pid), marker)) out.push_back(static_cast<pid_t>(pid));
  }
  return out;
}

RecordedPids::~RecordedPids() {
  for (pid_t pid : alive()) ::kill(pid, SIGKILL);
}

ScratchDir::ScratchDir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
  path = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string ScratchDir::script(const std::string& name, const std::string& text, const std::string& first_line) const {
  const std::string f = file(name);
  std::ofstream(f) << first_line << "\n" << text << "\n";
  if (::chmod(f.c_str(), 0755) != 0) throw std::runtime_error("chmod " + f + ": " + std::strerror(errno));
  return f;
}

bool wait_for_files(const std::vector<std::string>& files, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (const auto& f : files) all = all && std::filesystem::exists(f);
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::vector<pid_t> left_with(const std::string& marker) {
  std::vector<pid_t> left = processes_with_argument(marker);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    left = processes_with_argument(marker);
  }
  for (pid_t p : left) ::kill(p, SIGKILL);
  return left;
}

}  // namespace tnt_test
