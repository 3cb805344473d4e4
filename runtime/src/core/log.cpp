#include "tarantella/log.hpp"

#include "core/context.hpp"
#include "tarantella/runtime.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace tnt {

namespace {
// Before init, the rank comes from the environment the launcher (or mpirun) set.
int current_rank() {
  if (RuntimeContext* c = context_or_null()) return c->rank;
  for (const char* v : {"TNT_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 0;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::debug: return "DEBUG";
    case LogLevel::info: return "INFO";
    case LogLevel::warning: return "WARNING";
    case LogLevel::error: return "ERROR";
  }
  return "?";
}
std::mutex g_print_mutex;
}  // namespace

bool log_enabled(LogLevel level) {
  const Config& c = config();
  LogLevel threshold = LogLevel::warning;
  try {
    threshold = parse_log_level(c.log_level);
  } catch (...) {
  }
  if (level < threshold) return false;
  // Errors are worth seeing from whichever rank has them.
  return level == LogLevel::error || c.log_on_all_devices || current_rank() == master_rank();
}

void log_line(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::fprintf(stderr, "[tnt %d %s] %s\n", current_rank(), level_name(level), message.c_str());
  std::fflush(stderr);
}

bool output_enabled() { return config().output_on_all_devices || current_rank() == master_rank(); }

void print_line(const std::string& message) {
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::fputs(message.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace tnt
