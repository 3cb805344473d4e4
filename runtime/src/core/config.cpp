#include "tarantella/config.hpp"

#include "tarantella/check.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>

namespace tnt {

namespace {

// A value as an error message quotes it: at most 60 characters (a variable may hold
// anything, 100 KB of it), control characters escaped.
std::string shown(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 60; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, text[i]);
  }
  if (text.size() > 60) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

void parse_value(const char* env, const std::string& text, int64_t& out) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v < 0) {
    TNT_INPUT_ERROR("{}='{}' is not a non-negative integer", env, shown(text));
  }
  out = v;
}

void parse_value(const char* env, const std::string& text, double& out) {
  // Decimal only, the whole text (strtod took ' 30' and 0x10, and refused '30 ').
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !(v >= 0)) {
    TNT_INPUT_ERROR("{}='{}' is not a non-negative number", env, shown(text));
  }
  out = v;
}

// 16 GiB, as the launcher's --fusion-threshold (launcher/env_names.hpp): a larger value is
// almost always bytes (Horovod's HOROVOD_FUSION_THRESHOLD unit) given where KB are meant.
constexpr int64_t kMaxFusionThresholdKb = int64_t{16} * 1024 * 1024;

void parse_value(const char* env, const std::string& text, FusionThresholdKb& out) {
  if (text == "auto") {
    out = FusionThresholdKb{};
    out.automatic = true;
    return;
  }
  int64_t kb = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), kb);
  if (ec != std::errc() || ptr != text.data() + text.size() || kb < 0) {
    TNT_INPUT_ERROR("{}='{}' is not a non-negative integer (KB) or auto", env, shown(text));
  }
  if (kb > kMaxFusionThresholdKb) {
    TNT_INPUT_ERROR("{}='{}': at most {} KB (16 GiB); the value is in KB, not bytes as Horovod's "
                    "HOROVOD_FUSION_THRESHOLD (64 MB is {}=65536)", env, shown(text), kMaxFusionThresholdKb, env);
  }
  out = FusionThresholdKb(kb);
}

// Empty: as if unset, the knob's default stays (TNT_LAYER_FUSION= had turned fusion off, which
// is on by default, without a word), as for the auto switches.
void parse_value(const char* env, const std::string& text, bool& out) {
  if (!text.empty()) out = parse_bool_knob(env, text);
}

std::string lower(const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

bool is_bool_spelling(const std::string& text) {
  for (const char* s : {"1", "true", "yes", "on", "0", "false", "no", "off"})
    if (lower(text) == s) return true;
  return false;
}

void parse_value(const char* env, const std::string& text, AutoSwitch& out) {
  if (lower(text) == "auto" || text.empty()) {  // empty: as if unset
    out = AutoSwitch::Mode::automatic;
    return;
  }
  if (!is_bool_spelling(text)) {
    TNT_INPUT_ERROR("{}='{}' is not auto or a boolean (1/true/yes/on or 0/false/no/off)", env, shown(text));
  }
  out = parse_bool_knob(env, text) ? AutoSwitch::Mode::on : AutoSwitch::Mode::off;
}

void parse_value(const char*, const std::string& text, std::string& out) { out = text; }

std::string value_str(int64_t v) { return std::to_string(v); }
std::string value_str(double v) { return fmt::format("{}", v); }
std::string value_str(const FusionThresholdKb& v) { return v.automatic ? "auto" : std::to_string(v.kb); }
std::string value_str(bool v) { return v ? "1" : "0"; }
std::string value_str(const AutoSwitch& v) { return v.automatic() ? "auto" : v.on() ? "1" : "0"; }
std::string value_str(const std::string& v) { return v.empty() ? "(default)" : v; }

}  // namespace

bool parse_bool_knob(const char* env, const std::string& text) {
  const std::string t = lower(text);  // True, YES, On as well (Python's and YAML's spellings)
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off" || t.empty()) return false;
  TNT_INPUT_ERROR("{}='{}' is not a boolean (1/true/yes/on or 0/false/no/off)", env, shown(text));
}

namespace {
// Edits (insert, delete, replace) between a and b, counted up to limit + 1.
size_t edit_distance(const std::string& a, const std::string& b, size_t limit) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return limit + 1;
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// TNT_* variables that are not knobs: set by the launcher for each rank
// (TNT_LAUNCH_VARIABLES), or read by the project's scripts and tests. Never reported as typos.
#define TNT_LAUNCH_NAME(field, name, help) name,
constexpr const char* kOtherVariables[] = {
    TNT_LAUNCH_VARIABLES(TNT_LAUNCH_NAME)
    "TNT_GPU_KIT", "TNT_DEMO_DIR", "TNT_FASHION_MNIST_DIR", "TNT_TINY_IMAGENET_DIR", "TNT_MPIEXEC",
    "TNT_SETUP_BENCH", "TNT_E2E_TIMEOUT"};
#undef TNT_LAUNCH_NAME
}  // namespace

bool Config::is_set(const char* env) {
  bool knob = false;
#define TNT_CONFIG_IS(field, type, name, def, unit, help) knob = knob || std::strcmp(env, name) == 0;
  TNT_CONFIG_KNOBS(TNT_CONFIG_IS)
#undef TNT_CONFIG_IS
  TNT_CHECK(knob, "Config::is_set: {} is not a knob of the configuration table", env);
  return std::getenv(env) != nullptr;
}

std::vector<std::string> Config::misspelled(const std::vector<std::string>& names) {
  std::vector<std::string> knobs;
#define TNT_CONFIG_NAME(field, type, env, def, unit, help) knobs.emplace_back(env);
  TNT_CONFIG_KNOBS(TNT_CONFIG_NAME)
#undef TNT_CONFIG_NAME
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (name.rfind("TNT_", 0) != 0) continue;
    if (std::find(knobs.begin(), knobs.end(), name) != knobs.end()) continue;
    if (std::any_of(std::begin(kOtherVariables), std::end(kOtherVariables),
                    [&](const char* other) { return name == other; })) {
      continue;
    }
    if (name == "TNT_SEED") {  // what Horovod or TF users may set, expecting a seeded run
      out.push_back("TNT_SEED is not read (ignored): the seed is the programs' --seed, or tnt::Model(network, "
                    "seed) in a program of your own");
      continue;
    }
    const std::string* best = nullptr;
    size_t best_distance = 3;
    for (const std::string& knob : knobs) {
      const size_t d = edit_distance(name, knob, 2);
      if (d < best_distance) {
        best_distance = d;
        best = &knob;
      }
    }
    if (best) out.push_back(fmt::format("{} is not a tarantella variable (ignored); did you mean {}?", name, *best));
  }
  return out;
}

LogLevel parse_log_level(const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (t == "DEBUG") return LogLevel::debug;
  if (t == "INFO") return LogLevel::info;
  if (t == "WARNING" || t == "WARN") return LogLevel::warning;
  if (t == "ERROR") return LogLevel::error;
  TNT_INPUT_ERROR("TNT_LOG_LEVEL='{}' is not DEBUG, INFO, WARNING or ERROR", shown(text));
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
    TNT_INPUT_ERROR("TNT_ALLREDUCE_ALGO='{}' is not ring, mpi or nccl", shown(c.allreduce_algo));
  }
  if (c.ring_segment_kb == 0) TNT_INPUT_ERROR("TNT_RING_SEGMENT must be at least 1 (KB)");
  // Checked here, not only when a profile is asked for (every value is checked at the start).
  if (c.profile_scaling_steps < 1) {
    TNT_INPUT_ERROR("TNT_PROFILE_SCALING_STEPS={} must be at least 1", c.profile_scaling_steps);
  }
  // Asked for both: cuDNN's attention backward sums dQ with atomics, so runs would differ.
  if (c.deterministic && c.cudnn_attention.on()) {
    TNT_INPUT_ERROR("TNT_CUDNN_ATTENTION=1 with TNT_DETERMINISTIC=1: cuDNN's attention backward adds with atomics "
                    "(not deterministic); leave TNT_CUDNN_ATTENTION unset (auto takes the fused kernels in "
                    "deterministic mode) or set it to 0");
  }
  if (c.fused_attention_rows != 16 && c.fused_attention_rows != 32) {
    TNT_INPUT_ERROR("TNT_FUSED_ATTENTION_ROWS={} is not 16 or 32 (query rows per warp of the fused attention forward)",
                    c.fused_attention_rows);
  }
  if (c.conv_pad_channels != "auto" && c.conv_pad_channels != "0" && c.conv_pad_channels != "4" &&
      c.conv_pad_channels != "8") {
    TNT_INPUT_ERROR("TNT_CONV_PAD_CHANNELS='{}' is not auto, 0, 4 or 8 (the channels a 1-3 channel convolution input is "
                    "widened to)",
                    shown(c.conv_pad_channels));
  }
  // Checked whether or not a timeline is asked for: a bad window is a mistake either way.
  (void)parse_step_window(c.timeline_steps, "TNT_TIMELINE_STEPS");
  if (!c.cuda_profile_steps.empty()) (void)parse_step_window(c.cuda_profile_steps, "TNT_CUDA_PROFILE_STEPS");
  if (c.num_threads > kMaxThreads) {
    TNT_INPUT_ERROR("TNT_NUM_THREADS={} is more than {} compute threads per rank (0: the cores the rank may run on)",
                    c.num_threads, kMaxThreads);
  }
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

std::pair<int64_t, int64_t> parse_step_window(const std::string& text, const std::string& what) {
  auto number = [&](std::string_view s, int64_t& out) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && p == s.data() + s.size() && out >= 1;
  };
  int64_t a = 0, b = 0;
  const size_t dash = text.find('-');
  bool ok = dash == std::string::npos ? number(text, a) && number(text, b)
                                      : number(std::string_view(text).substr(0, dash), a) &&
                                            number(std::string_view(text).substr(dash + 1), b);
  if (!ok || b < a)
    TNT_INPUT_ERROR("{}='{}': expected a step window a-b with 1 <= a <= b (steps count from 1), or one step a", what,
                    shown(text));
  return {a, b};
}

}  // namespace tnt
