// Every tunable of the runtime, declared once: field, type, environment variable, default,
// unit and a line of help. The resolved set is printed by the master at start when
// TNT_LOG_LEVEL is INFO or DEBUG. A value that does not parse is an InputError naming the
// variable and the value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

// X(field, type, ENV, default, unit, help)
#define TNT_CONFIG_KNOBS(X)                                                                     \
  X(fusion_threshold_kb, int64_t, "TNT_FUSION_THRESHOLD", 32, "KB",                             \
    "gradient fusion bucket size; 0 = one bucket per tensor")                                  \
  X(allreduce_algo, std::string, "TNT_ALLREDUCE_ALGO", "", "",                                 \
    "ring|mpi|nccl; empty = ring for host buffers, nccl for device buffers")                   \
  X(collective_timeout_s, double, "TNT_COLLECTIVE_TIMEOUT", 600.0, "s",                         \
    "a collective not complete after this long fails on the waiting ranks; 0 = never")        \
  X(log_level, std::string, "TNT_LOG_LEVEL", "WARNING", "", "DEBUG|INFO|WARNING|ERROR")         \
  X(output_on_all_devices, bool, "TNT_OUTPUT_ON_ALL_DEVICES", false, "",                        \
    "progress output from every rank, not only the master (files: the master's only)")         \
  X(log_on_all_devices, bool, "TNT_LOG_ON_ALL_DEVICES", false, "", "log lines from every rank")  \
  X(timeline, std::string, "TNT_TIMELINE", "", "", "Chrome trace file of a window of steps; empty = off") \
  X(timeline_steps, std::string, "TNT_TIMELINE_STEPS", "1-10", "steps",                         \
    "the timeline's window a-b (1-based, over the whole run); unset = this run's first 10 steps")  \
  X(deterministic, bool, "TNT_DETERMINISTIC", false, "", "deterministic kernels only")          \
  X(device, std::string, "TNT_DEVICE", "", "",                                                 \
    "cpu or cuda:K (set by the launcher); empty = cuda:local_rank%GPUs, else cpu")             \
  X(num_threads, int64_t, "TNT_NUM_THREADS", 0, "threads",                                     \
    "CPU compute threads per rank; 0 = the cores of the rank's affinity mask")                 \
  X(ring_segment_kb, int64_t, "TNT_RING_SEGMENT", 256, "KB",                                    \
    "segment size of the ring allreduce pipeline")                                            \
  X(cudnn_autotune, bool, "TNT_CUDNN_AUTOTUNE", true, "",                                       \
    "time cuDNN's convolution algorithms once per shape; 0 = cuDNN's heuristics")              \
  X(pinned_staging, bool, "TNT_PINNED_STAGING", true, "",                                       \
    "copy GPU inputs through page-locked buffers on a copy stream; 0 = plain copies")          \
  X(fused_attention, bool, "TNT_FUSED_ATTENTION", false, "",                                    \
    "fused CUDA attention (bf16/fp16, head depth 16..128 in steps of 16; else unfused); 0 = cuBLAS products around a softmax kernel")

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
