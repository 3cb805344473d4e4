// `tarantella predict PROFILE ...`: the step time, throughput and scaling efficiency of a job
// at several node counts, from a profile written by --profile-scaling, through the scaling
// model of the runtime (runtime/src/comm/scaling_model.hpp, compiled into the launcher).
// A table on stdout, optionally a CSV and a PNG plot (tnt_predict_plot.py beside the
// launcher, Python with matplotlib). docs/scaling.md explains the numbers.
#pragma once

#include "comm/scaling_model.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tnt::launcher {

struct PredictOptions {
  std::string profile;
  std::vector<int> nodes{1, 2, 4, 8, 16};
  std::optional<int> devices_per_node;           // default: the profile's ranks per node
  std::optional<std::string> network;            // inter-node preset
  std::optional<double> link_gbps, latency_us;   // inter-node, explicit
  std::optional<std::string> intra;              // intra-node preset
  std::optional<double> intra_gbps, intra_latency_us;
  std::optional<std::string> allreduce;          // hierarchical | flat
  std::optional<double> fusion_threshold_kb;     // default: the profile's
  std::optional<std::string> csv, plot;
  bool help = false;
};

// `args` follows the word "predict". Throws InputError naming the flag and the problem.
PredictOptions parse_predict_command_line(const std::vector<std::string>& args);
std::string predict_help_text();

struct LinkPreset {
  const char* name;
  double gbps;        // Gbit/s one way
  double latency_us;  // one message
  const char* what;   // where the numbers come from (docs/scaling.md cites them)
};
const std::vector<LinkPreset>& inter_node_presets();
const std::vector<LinkPreset>& intra_node_presets();

// The network the options describe, for a profile (its measured links fill in what the
// options leave out, where the profile measured them). `described` receives one line per
// link saying where its numbers come from. Throws InputError.
comm::scaling::Network resolve_network(const PredictOptions& options, const comm::scaling::Profile& profile,
                                       std::vector<std::string>* described);

std::string predict_csv(const std::vector<comm::scaling::SweepRow>& rows);
std::string predict_table(const std::vector<comm::scaling::SweepRow>& rows);

// Everything: read, predict, print, write. Returns the exit status; throws InputError.
int predict_main(const std::vector<std::string>& args);

}  // namespace tnt::launcher
