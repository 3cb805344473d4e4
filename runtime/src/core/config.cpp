#include "tarantella/config.hpp"

#include "tarantella/check.hpp"

#include <charconv>
#include <cstdlib>

namespace tnt {

namespace {

void parse_value(const char* env, const std::string& text, int64_t& out) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v < 0) {
    TNT_INPUT_ERROR("{}='{}' is not a non-negative integer", env, text);
  }
  out = v;
}

void parse_value(const char* env, const std::string& text, double& out) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= 0)) {
    TNT_INPUT_ERROR("{}='{}' is not a non-negative number", env, text);
  }
  out = v;
}

void parse_value(const char* env, const std::string& text, bool& out) { out = parse_bool_knob(env, text); }

void parse_value(const char*, const std::string& text, std::string& out) { out = text; }

std::string value_str(int64_t v) { return std::to_string(v); }
std::string value_str(double v) { return fmt::format("{}", v); }
std::string value_str(bool v) { return v ? "1" : "0"; }
std::string value_str(const std::string& v) { return v.empty() ? "(default)" : v; }

}  // namespace

bool parse_bool_knob(const char* env, const std::string& text) {
  if (text == "1" || text == "true" || text == "TRUE" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "FALSE" || text == "no" || text == "off" || text.empty()) return false;
  TNT_INPUT_ERROR("{}='{}' is not a boolean (1/0, true/false)", env, text);
}

LogLevel parse_log_level(const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (t == "DEBUG") return LogLevel::debug;
  if (t == "INFO") return LogLevel::info;
  if (t == "WARNING" || t == "WARN") return LogLevel::warning;
  if (t == "ERROR") return LogLevel::error;
  TNT_INPUT_ERROR("TNT_LOG_LEVEL='{}' is not DEBUG, INFO, WARNING or ERROR", text);
}

Config Config::from_env() {
  Config c;
#define TNT_CONFIG_READ(field, type, env, def, unit, help)   \
  if (const char* v = std::getenv(env)) parse_value(env, v, c.field);
  TNT_CONFIG_KNOBS(TNT_CONFIG_READ)
#undef TNT_CONFIG_READ
  parse_log_level(c.log_level);  // validate early
  if (!c.allreduce_algo.empty() && c.allreduce_algo != "ring" && c.allreduce_algo != "mpi" &&
      c.allreduce_algo != "nccl") {
    TNT_INPUT_ERROR("TNT_ALLREDUCE_ALGO='{}' is not ring, mpi or nccl", c.allreduce_algo);
  }
  if (c.ring_segment_kb == 0) TNT_INPUT_ERROR("TNT_RING_SEGMENT must be at least 1 (KB)");
  return c;
}

std::vector<Config::Row> Config::rows() const {
  std::vector<Row> rows;
#define TNT_CONFIG_ROW(field, type, env, def, unit, help) rows.push_back({env, value_str(field), unit, help});
  TNT_CONFIG_KNOBS(TNT_CONFIG_ROW)
#undef TNT_CONFIG_ROW
  return rows;
}

std::string Config::table() const {
  std::string out;
  for (const Row& r : rows()) {
    out += fmt::format("  {:<26} {:>10} {:<8} {}\n", r.env, r.value, r.unit, r.help);
  }
  return out;
}

}  // namespace tnt
