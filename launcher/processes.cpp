#include "processes.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <dirent.h>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace tnt::launcher {

namespace {

void reap_all() {
  int status = 0;
  while (::waitpid(-1, &status, WNOHANG) > 0) {
  }
}

}  // namespace

std::optional<ProcStat> read_stat(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last ')'.
  const auto paren = line.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  ProcStat st;
  // Fields 3 and 4, then 22 (starttime); the 17 in between are skipped.
  if (std::sscanf(line.c_str() + paren + 1,
                  " %c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &st.state,
                  &st.ppid, &st.start_time) != 3) {
    return std::nullopt;
  }
  return st;
}

std::vector<pid_t> own_children() {
  std::vector<pid_t> out;
  const pid_t self = ::getpid();
  std::ifstream listed("/proc/self/task/" + std::to_string(self) + "/children");
  if (listed) {
    long pid = 0;
    while (listed >> pid) out.push_back(static_cast<pid_t>(pid));
    return out;
  }
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* d = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(d->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    if (auto st = read_stat(static_cast<pid_t>(pid)); st && st->ppid == self) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return out;
}

void end_children(pid_t group, std::chrono::milliseconds grace) {
  using Clock = std::chrono::steady_clock;
  auto signal_all = [&](int sig) {
    bool any = group > 0 && ::kill(-group, sig) == 0;
    for (pid_t p : own_children()) any = (::kill(p, sig) == 0) || any;
    return any;
  };
  reap_all();
  if (!signal_all(SIGTERM)) return;
  signal_all(SIGCONT);
  const auto term_deadline = Clock::now() + grace;
  const auto give_up = term_deadline + grace;
  while (Clock::now() < give_up) {
    reap_all();
    const bool group_left = group > 0 && ::kill(-group, 0) == 0;
    int ignored = 0;
    const bool children_left = ::waitpid(-1, &ignored, WNOHANG) != -1;  // -1 (ECHILD): none at all
    if (!group_left && !children_left) return;
    if (Clock::now() >= term_deadline) signal_all(SIGKILL);
    timespec tick{0, 10'000'000};
    ::nanosleep(&tick, nullptr);
  }
}

}  // namespace tnt::launcher
