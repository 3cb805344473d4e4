// Logging and output. Log lines go to stderr with a "[tnt rank R LEVEL]" prefix, from the
// master only unless TNT_LOG_ON_ALL_DEVICES=1. print() is for a program's own output
// (progress, results): master only unless TNT_OUTPUT_ON_ALL_DEVICES=1, and then each line
// starts with "[rank R] " so that the ranks' lines, mixed on one terminal, can be told apart.
#pragma once

#include "tarantella/config.hpp"

#include <fmt/format.h>

#include <string>

namespace tnt {

bool log_enabled(LogLevel level);
void log_line(LogLevel level, const std::string& message);
bool output_enabled();  // this rank prints program output
void print_line(const std::string& message);  // tags each line (output_tag), adds the newline; flushes
// "[rank R] " (R right-aligned to the widest rank) when every rank prints its output
// (TNT_OUTPUT_ON_ALL_DEVICES=1) and the job has several ranks; "" otherwise.
std::string output_tag();

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::debug)) log_line(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::info)) log_line(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warning(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::warning)) log_line(LogLevel::warning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::error)) log_line(LogLevel::error, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void print(fmt::format_string<Args...> f, Args&&... args) {
  if (output_enabled()) print_line(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tnt
