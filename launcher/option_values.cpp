#include "option_values.hpp"

#include "env_names.hpp"
#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace tnt::launcher {

int parse_ranks_per_node(const std::string& flag, const std::string& text) {
  if (auto n = parse_count(text)) return *n;
  throw InputError(fmt::format("{} {}: ranks per node must be an integer from 1 to 1000000", flag, text));
}

std::string normalize_log_level(const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (t == "WARN") t = "WARNING";
  if (t == "DEBUG" || t == "INFO" || t == "WARNING" || t == "ERROR") return t;
  throw InputError(fmt::format("--log-level {}: must be DEBUG, INFO, WARNING or ERROR", text));
}

bool valid_env_name(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::pair<std::string, std::string> parse_export(const std::string& text) {
  auto eq = text.find('=');
  if (text.empty()) throw InputError("-x: empty; expected KEY=VALUE");
  if (eq == std::string::npos) {
    throw InputError(fmt::format("-x {}: expected KEY=VALUE (to pass a variable of this environment, "
                                 "write -x {}=\"${}\")", text, text, text));
  }
  std::string key = text.substr(0, eq);
  if (!valid_env_name(key)) {
    throw InputError(fmt::format("-x {}: '{}' is not a valid environment variable name", text, key));
  }
  if (env::is_reserved(key)) {
    throw InputError(fmt::format("-x {}: {} is set by tarantella for each rank and cannot be exported", text, key));
  }
  return {key, text.substr(eq + 1)};
}

}  // namespace tnt::launcher
