#include "ps/process.hpp"

#include <signal.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

namespace tnt::ps {
namespace {

// Field 22 of /proc/PID/stat (after the command in parentheses, which may hold spaces);
// -1 if the process is gone (or a zombie: dead, only not reaped) or this is not Linux.
int64_t process_start(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return -1;
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field) || (i == 3 && field == "Z")) return -1;
  }
  int64_t start = -1;
  std::from_chars(field.data(), field.data() + field.size(), start);
  return start;
}

}  // namespace

Process this_process() {
  Process p;
  p.pid = static_cast<int64_t>(::getpid());
  p.start = process_start(p.pid);
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  p.host = static_cast<int64_t>(std::hash<std::string>{}(name));
  return p;
}

void end_dropped_worker(int rank, const Process& p, const Process& here) {
  if (p.host != here.host || p.pid <= 0 || p.start < 0) return;
  if (process_start(p.pid) != p.start) return;
  if (::kill(static_cast<pid_t>(p.pid), SIGKILL) != 0) return;
  std::fprintf(stderr,
               "warning: parameter-server training: dropped worker rank %d (process %lld on this host) ended with "
               "SIGKILL, so that the job does not wait for it\n",
               rank, static_cast<long long>(p.pid));
  std::fflush(stderr);
}

}  // namespace tnt::ps
