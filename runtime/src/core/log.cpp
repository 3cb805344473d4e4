#include "tarantella/log.hpp"

#include "core/context.hpp"
#include "tarantella/runtime.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace tnt {

namespace {
// Before init, the rank comes from the environment the launcher (or mpirun) set.
int current_rank() {
  if (RuntimeContext* c = context_or_null()) return c->rank;
  for (const char* v : {env::rank, "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 0;
}

int current_size() {
  if (RuntimeContext* c = context_or_null()) return c->size;
  for (const char* v : {env::size, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 1;
}

// The tags' numbers: the job's, whatever communicator is in use.
int job_rank() {
  if (RuntimeContext* c = context_or_null()) return c->job_rank;
  return current_rank();
}

int job_size() {
  if (RuntimeContext* c = context_or_null()) return c->job_size;
  return current_size();
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
  std::fprintf(stderr, "[tnt %d %s] %s\n", job_rank(), level_name(level), message.c_str());
  std::fflush(stderr);
}

bool output_enabled() { return config().output_on_all_devices || current_rank() == master_rank(); }

std::string output_tag() {
  const int p = job_size();
  if (!config().output_on_all_devices || p <= 1) return "";
  return fmt::format("[rank {:>{}}] ", job_rank(), std::to_string(p - 1).size());
}

void print_line(const std::string& message) {
  // Tagged line by line (a model's summary is one message of many lines), in one write.
  const std::string tag = output_tag();
  std::string text;
  size_t start = 0;
  while (true) {
    const size_t end = message.find('\n', start);
    text += tag;
    text.append(message, start, end == std::string::npos ? std::string::npos : end - start);
    text += '\n';
    if (end == std::string::npos) break;
    start = end + 1;
  }
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace tnt
