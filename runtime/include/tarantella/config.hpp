// Every tunable of the runtime, declared once: field, type, environment variable, default,
// unit and a line of help. The resolved set is printed by the master at start when
// TNT_LOG_LEVEL is INFO or DEBUG. A value that does not parse is an InputError naming the
// variable and the value.
#pragma once

#include "tarantella/config_table.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

// TNT_FUSION_THRESHOLD: a number of KB, or "auto": start at 32 KB, time the first steps and
// take the threshold the scaling model predicts fastest (docs/scaling.md). Reads as its KB
// where a number is expected.
struct FusionThresholdKb {
  int64_t kb = 32;
  bool automatic = false;
  FusionThresholdKb(int64_t v = 32) : kb(v) {}  // NOLINT: a plain number is a threshold
  operator int64_t() const { return kb; }        // NOLINT
};

// A switch with a third setting, "auto": the runtime decides per case at run time (for
// TNT_CUDNN_ATTENTION: each shape's first use times the engines and checks them against each
// other). Spelled 1/0 like every boolean knob, or auto.
struct AutoSwitch {
  enum class Mode { off, on, automatic };
  Mode mode = Mode::off;
  AutoSwitch(Mode m = Mode::off) : mode(m) {}  // NOLINT: the table's defaults are modes
  bool off() const { return mode == Mode::off; }
  bool on() const { return mode == Mode::on; }
  bool automatic() const { return mode == Mode::automatic; }
};

struct Config {
  // TNT_NUM_THREADS above this is refused: more compute threads than any machine gives one
  // rank only time-slices them (OpenMP then fails to create them or crashes well before).
  static constexpr int64_t kMaxThreads = 1024;
#define TNT_CONFIG_FIELD(field, type, env, def, unit, help) type field = def;
  TNT_CONFIG_KNOBS(TNT_CONFIG_FIELD)
#undef TNT_CONFIG_FIELD

  // Reads every TNT_* variable of the environment; throws InputError on a bad value.
  static Config from_env();

  struct Row {
    std::string env, value, unit, help;
  };
  std::vector<Row> rows() const;  // for printing
  std::string table() const;      // the resolved set, one knob a line

  // For each name of `names` (variables of the environment) that starts with TNT_, is not a
  // variable of this project, and is within two edits of a knob above: "TNT_FUSIO_THRESHOLD
  // is not a tarantella variable (ignored); did you mean TNT_FUSION_THRESHOLD?". A typo
  // would otherwise leave the default in place without a word.
  static std::vector<std::string> misspelled(const std::vector<std::string>& names);

  // Whether the environment sets `env` now, which must be a knob of the table (a programming
  // error otherwise): for a module whose default depends on whether a knob was given
  // (the timeline's window counts from the run's first step when TNT_TIMELINE_STEPS is not).
  static bool is_set(const char* env);
};

// The one spelling of a boolean knob: 1/true/TRUE/yes/on or 0/false/FALSE/no/off/"" (off);
// anything else is an InputError naming env and text. For modules that read their knob
// again later (Config::from_env has checked it at start).
bool parse_bool_knob(const char* env, const std::string& text);

// A window of training steps "a-b" or "a" (1 <= a <= b; steps count from 1), as
// TNT_TIMELINE_STEPS and --profile_steps give it; anything else is an InputError naming what.
std::pair<int64_t, int64_t> parse_step_window(const std::string& text, const std::string& what);

enum class LogLevel { debug = 0, info = 1, warning = 2, error = 3 };
LogLevel parse_log_level(const std::string& text);  // throws InputError

}  // namespace tnt
