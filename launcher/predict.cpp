#include "predict.hpp"

#include "env_names.hpp"
#include "error.hpp"
#include "paths.hpp"
#include "text.hpp"

#define CXXOPTS_NO_REGEX true
#include <cxxopts.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace tnt::launcher {

namespace sc = comm::scaling;

namespace {

// Far beyond any job: a row's ranks stay in an int, a threshold's bytes in 64 bits.
constexpr int64_t kMaxRanks = int64_t{1} << 24;
constexpr double kMaxThresholdKb = kMaxFusionThresholdKb;

}  // namespace

namespace {

constexpr const char* usage_line =
    "tarantella predict PROFILE [--nodes 1,2,4] [--devices-per-node K] (--network PRESET | --link-gbps G "
    "--latency-us L) [--csv FILE] [--plot FILE.png]";

cxxopts::Options make_parser() {
  cxxopts::Options o("tarantella predict",
                     "Predicts step time, throughput and scaling efficiency at several node counts from a profile "
                     "written by `tarantella --profile-scaling FILE -- PROGRAM`.");
  o.custom_help("PROFILE [options]");
  o.positional_help("");
  o.set_width(100);
  o.add_options("Job")
      ("profile", "", cxxopts::value<std::string>())
      ("nodes", "Node counts to predict, comma-separated (default: 1,2,4,8,16)", cxxopts::value<std::string>(), "LIST")
      ("devices-per-node", "Ranks per node (default: the profile's)", cxxopts::value<std::string>(), "K")
      ("fusion-threshold", "The fusion threshold to predict, in KB (default: the profile's); the best one is "
       "searched for anyway", cxxopts::value<std::string>(), "KB");
  o.add_options("Between nodes")
      ("network", "A named interconnect (list below) (default: the profile's measurement, when it spans nodes)", cxxopts::value<std::string>(), "PRESET")
      ("link-gbps", "Link bandwidth of a node, Gbit/s one way", cxxopts::value<std::string>(), "G")
      ("latency-us", "Latency of one message between nodes, microseconds", cxxopts::value<std::string>(), "L");
  o.add_options("Within a node")
      ("intra", "A named intra-node link (list below) (default: the profile's measurement, when it ran several "
       "ranks on one node)", cxxopts::value<std::string>(), "PRESET")
      ("intra-gbps", "Bandwidth between two ranks of a node, Gbit/s one way", cxxopts::value<std::string>(), "G")
      ("intra-latency-us", "Latency between two ranks of a node, microseconds", cxxopts::value<std::string>(), "L")
      ("allreduce", "hierarchical (within nodes, then across: NCCL) or flat (one ring over all ranks: the host "
       "transport) (default: hierarchical for a GPU profile, flat for a CPU one)",
       cxxopts::value<std::string>(), "KIND");
  o.add_options("Output")
      ("csv", "Also write the table as CSV", cxxopts::value<std::string>(), "FILE")
      ("plot", "Also draw efficiency and throughput against nodes (PNG; needs python3 with matplotlib)",
       cxxopts::value<std::string>(), "FILE.png")
      ("h,help", "This help");
  o.parse_positional({"profile"});
  return o;
}

double positive_number(const std::string& flag, const std::string& text, const char* unit) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  // At most 1e9: beyond any link (Gbit/s) or latency (us) a model could say anything of.
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v <= 0 || v > 1e9) {
    throw InputError(fmt::format("--{} {}: must be a positive number of {}, at most 1e9", flag, excerpt(text, 40), unit));
  }
  return v;
}

// At most `max` (1e9 for a latency: beyond any a model could say anything of).
double non_negative_number(const std::string& flag, const std::string& text, const char* unit, double max = 1e9) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v < 0) {
    throw InputError(fmt::format("--{} {}: must be a non-negative number of {}", flag, excerpt(text, 40), unit));
  }
  if (v > max) throw InputError(fmt::format("--{} {}: at most {:g} {}", flag, excerpt(text, 40), max, unit));
  return v;
}

const LinkPreset* find_preset(const std::vector<LinkPreset>& presets, const std::string& name) {
  for (const LinkPreset& p : presets) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

std::string preset_names(const std::vector<LinkPreset>& presets) {
  std::vector<std::string> names;
  for (const LinkPreset& p : presets) names.emplace_back(p.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

sc::Link link_of(double gbps, double latency_us) { return {latency_us * 1e-6, gbps * 1e9 / 8}; }

std::string describe(const sc::Link& l) {
  return fmt::format("{:.3g} us, {:.4g} Gbit/s", l.latency_s * 1e6, l.bytes_per_s * 8 / 1e9);
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError(fmt::format("profile '{}': no such file", path));
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(fmt::format("profile '{}': not a regular file", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("profile '{}': cannot open it: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string kb(int64_t bytes) { return fmt::format("{:g}", static_cast<double>(bytes) / 1024); }

}  // namespace

const std::vector<LinkPreset>& inter_node_presets() {
  // Line rates of the standards; latencies typical of one MPI/NCCL message (kernel TCP for
  // Ethernet, RDMA for InfiniBand). docs/scaling.md gives the sources.
  static const std::vector<LinkPreset> presets{
      {"10gbe", 10, 25, "10 Gbit/s Ethernet (IEEE 802.3ae), TCP"},
      {"25gbe", 25, 20, "25 Gbit/s Ethernet (IEEE 802.3by), TCP"},
      {"50gbe", 50, 15, "50 Gbit/s Ethernet (IEEE 802.3cd), TCP"},
      {"100gbe", 100, 10, "100 Gbit/s Ethernet (IEEE 802.3ba), TCP"},
      {"ib-edr", 100, 1.0, "InfiniBand EDR 4x (100 Gbit/s), RDMA"},
      {"ib-hdr", 200, 1.0, "InfiniBand HDR 4x (200 Gbit/s), RDMA"},
      {"ib-ndr", 400, 1.0, "InfiniBand NDR 4x (400 Gbit/s), RDMA"},
  };
  return presets;
}

const std::vector<LinkPreset>& intra_node_presets() {
  static const std::vector<LinkPreset> presets{
      {"nvlink-p100", 640, 3, "NVLink 1 on P100 SXM2: 160 GB/s both ways, 80 GB/s one way"},
      {"nvlink-v100", 1200, 3, "NVLink 2 on V100 SXM2: 300 GB/s both ways, 150 GB/s one way"},
      {"nvlink-a100", 2400, 3, "NVLink 3 on A100 SXM4: 600 GB/s both ways, 300 GB/s one way"},
      {"nvlink", 3600, 3, "NVLink 4 on H100/H200 SXM5: 900 GB/s both ways, 450 GB/s one way"},
      {"pcie3", 128, 5, "PCIe 3.0 x16: 16 GB/s one way"},
      {"pcie4", 256, 5, "PCIe 4.0 x16: 32 GB/s one way"},
      {"pcie5", 512, 5, "PCIe 5.0 x16: 64 GB/s one way"},
  };
  return presets;
}

PredictOptions parse_predict_command_line(const std::vector<std::string>& args) {
  std::vector<std::string> words{"tarantella predict"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  cxxopts::ParseResult result;
  try {
    result = make_parser().parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw InputError(fmt::format("predict: {} ({})", e.what(), usage_line));
  }
  PredictOptions o;
  o.help = result.count("help") > 0;
  if (o.help) return o;
  for (const auto& kv : result.arguments()) {
    size_t n = 0;
    for (const auto& other : result.arguments()) n += other.key() == kv.key();
    if (n > 1) throw InputError(fmt::format("predict: --{} given {} times; give it once", kv.key(), n));
  }
  if (!result.count("profile")) throw InputError(fmt::format("predict: no PROFILE given: {}", usage_line));
  o.profile = result["profile"].as<std::string>();
  if (!result.unmatched().empty()) {
    throw InputError(fmt::format("predict: unexpected argument '{}' (one PROFILE only)", excerpt(result.unmatched()[0], 80)));
  }
  if (result.count("nodes")) {
    const std::string text = result["nodes"].as<std::string>();
    o.nodes.clear();
    for (std::string_view part : split(text, ',')) {
      auto n = parse_count(trim(part));
      if (!n) {
        throw InputError(fmt::format("--nodes {}: '{}' is not a positive node count (a list such as 1,2,4,8)",
                                     excerpt(text, 80), excerpt(part, 20)));
      }
      o.nodes.push_back(*n);
    }
  }
  if (result.count("devices-per-node")) {
    const std::string text = result["devices-per-node"].as<std::string>();
    auto n = parse_count(text);
    if (!n) throw InputError(fmt::format("--devices-per-node {}: must be a positive integer", excerpt(text, 40)));
    o.devices_per_node = *n;
  }
  if (result.count("fusion-threshold")) {
    o.fusion_threshold_kb = non_negative_number("fusion-threshold", result["fusion-threshold"].as<std::string>(), "KB",
                                                HUGE_VAL);
    // Beyond any model's gradients (16 GiB); the bytes must fit their 64-bit count.
    if (*o.fusion_threshold_kb > kMaxThresholdKb) {
      throw InputError(fmt::format("--fusion-threshold {}: at most {} KB (16 GiB, more than any model's gradients)",
                                   result["fusion-threshold"].as<std::string>(), kMaxThresholdKb));
    }
  }
  if (result.count("network")) o.network = result["network"].as<std::string>();
  if (result.count("link-gbps")) o.link_gbps = positive_number("link-gbps", result["link-gbps"].as<std::string>(), "Gbit/s");
  if (result.count("latency-us")) {
    o.latency_us = non_negative_number("latency-us", result["latency-us"].as<std::string>(), "microseconds");
  }
  if (result.count("intra")) o.intra = result["intra"].as<std::string>();
  if (result.count("intra-gbps")) {
    o.intra_gbps = positive_number("intra-gbps", result["intra-gbps"].as<std::string>(), "Gbit/s");
  }
  if (result.count("intra-latency-us")) {
    o.intra_latency_us = non_negative_number("intra-latency-us", result["intra-latency-us"].as<std::string>(), "microseconds");
  }
  if (result.count("allreduce")) {
    o.allreduce = result["allreduce"].as<std::string>();
    if (*o.allreduce != "hierarchical" && *o.allreduce != "flat") {
      throw InputError(fmt::format("--allreduce {}: must be hierarchical or flat", excerpt(*o.allreduce, 40)));
    }
  }
  if (o.network && (o.link_gbps || o.latency_us)) {
    throw InputError("--network and --link-gbps/--latency-us both describe the network between nodes; give one");
  }
  if (o.link_gbps.has_value() != o.latency_us.has_value()) {
    throw InputError(fmt::format("{} without {}: give both, or a --network preset",
                                 o.link_gbps ? "--link-gbps" : "--latency-us", o.link_gbps ? "--latency-us" : "--link-gbps"));
  }
  if (o.intra && (o.intra_gbps || o.intra_latency_us)) {
    throw InputError("--intra and --intra-gbps/--intra-latency-us both describe the link within a node; give one");
  }
  if (o.intra_gbps.has_value() != o.intra_latency_us.has_value()) {
    throw InputError(fmt::format("{} without {}: give both, or an --intra preset",
                                 o.intra_gbps ? "--intra-gbps" : "--intra-latency-us",
                                 o.intra_gbps ? "--intra-latency-us" : "--intra-gbps"));
  }
  if (o.network && !find_preset(inter_node_presets(), *o.network)) {
    throw InputError(fmt::format("--network {}: not a preset; presets: {}", excerpt(*o.network, 40),
                                 preset_names(inter_node_presets())));
  }
  if (o.intra && !find_preset(intra_node_presets(), *o.intra)) {
    throw InputError(fmt::format("--intra {}: not a preset; presets: {}", excerpt(*o.intra, 40),
                                 preset_names(intra_node_presets())));
  }
  // The outputs' directories, before the table (before: a bad --csv was refused after it).
  auto check_output = [](const char* flag, const std::string& path) {
    if (path.empty()) throw InputError(fmt::format("--{}: the path is empty", flag));
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
    std::error_code ec;
    const fs::file_status st = fs::status(dir, ec);
    const char* problem = !fs::exists(st)                       ? "no such directory"
                          : !fs::is_directory(st)               ? "not a directory"
                          : ::access(dir.c_str(), W_OK) != 0    ? "a directory this user cannot write"
                                                                : nullptr;
    if (problem) throw InputError(fmt::format("--{} {}: {} is {}", flag, path, dir.string(), problem));
  };
  if (result.count("csv")) {
    o.csv = result["csv"].as<std::string>();
    check_output("csv", *o.csv);
  }
  if (result.count("plot")) {
    o.plot = result["plot"].as<std::string>();
    check_output("plot", *o.plot);
    // matplotlib takes the format from the extension (before: its traceback).
    std::string ext = std::filesystem::path(*o.plot).extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static const char* const kFormats[] = {".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps",
                                           ".tif", ".tiff", ".webp", ".pgf"};
    if (std::find(std::begin(kFormats), std::end(kFormats), ext) == std::end(kFormats)) {
      throw InputError(fmt::format("--plot {}: the extension gives the image's format: .png, .pdf or .svg (also .jpg, "
                                   ".eps, .ps, .tif, .webp, .pgf)",
                                   *o.plot));
    }
  }
  return o;
}

namespace {

// The profile's step in its parts; on a GPU, the time the GPU spent waiting (for its
// input, for the host at the readback), which more GPUs do not shorten, said where it is
// a share worth acting on.
std::string step_parts(const sc::Profile& p) {
  std::string out = fmt::format(
      "  a step: input {:.3f}, forward {:.3f}, backward {:.3f}, wait for gradients {:.3f}, optimizer {:.3f}, other "
      "{:.3f} ms\n",
      p.input_s * 1e3, p.forward_s * 1e3, p.backward_s * 1e3, p.exposed_comm_s * 1e3, p.optimizer_s * 1e3,
      p.other_s * 1e3);
  if (p.collectives > 0) {
    out += fmt::format("  small collectives outside the buckets (metrics): {} a step, {} bytes, {:.3f} ms measured; "
                       "priced on the network at each rank count\n",
                       p.collectives, p.collective_bytes, p.collectives_s * 1e3);
  }
  if (p.device.rfind("cuda", 0) != 0 || p.step_s <= 0) return out;
  constexpr double kWorthSaying = 0.05;  // of the step
  if (p.input_s >= kWorthSaying * p.step_s) {
    out += fmt::format("  the GPU waited {:.3f} ms a step ({:.0f}%) for its input: more GPUs do not shorten that; more "
                       "loader threads or a cheaper input pipeline do\n",
                       p.input_s * 1e3, 100 * p.input_s / p.step_s);
  }
  if (p.other_s >= kWorthSaying * p.step_s) {
    out += fmt::format("  the GPU idled {:.3f} ms a step ({:.0f}%) waiting for the host (the step's readback, "
                       "callbacks): more GPUs do not shorten that; a larger batch per GPU or less host work a step "
                       "does\n",
                       p.other_s * 1e3, 100 * p.other_s / p.step_s);
  }
  return out;
}

}  // namespace

sc::Network resolve_network(const PredictOptions& o, const sc::Profile& profile, std::vector<std::string>* described) {
  sc::Network net;
  net.ranks_per_node = o.devices_per_node.value_or(profile.ranks_per_node);
  for (int n : o.nodes) {
    const int64_t ranks = int64_t{n} * net.ranks_per_node;
    if (ranks > kMaxRanks) {
      throw InputError(fmt::format("--nodes {} with {} rank(s) a node: {} ranks, beyond the {} this prediction takes",
                                   n, net.ranks_per_node, ranks, kMaxRanks));
    }
  }
  net.hierarchical = o.allreduce ? *o.allreduce == "hierarchical" : profile.transport == "nccl";
  std::optional<sc::Link> measured;
  if (profile.allreduce) measured = sc::link_from_fit(*profile.allreduce);
  auto say = [&](const std::string& line) {
    if (described) described->push_back(line);
  };

  bool any_multi_node = false;
  bool inter_measured = false, intra_measured = false;
  for (int n : o.nodes) any_multi_node |= n > 1;
  if (o.network) {
    const LinkPreset* p = find_preset(inter_node_presets(), *o.network);
    net.inter = link_of(p->gbps, p->latency_us);
    say(fmt::format("between nodes: {} ({}): {}", p->name, p->what, describe(net.inter)));
  } else if (o.link_gbps) {
    net.inter = link_of(*o.link_gbps, *o.latency_us);
    say(fmt::format("between nodes: {} (--link-gbps, --latency-us)", describe(net.inter)));
  } else if (measured && profile.nodes > 1) {
    net.inter = *measured;
    inter_measured = true;
    say(fmt::format("between nodes: {} (measured over the profile's {} nodes)", describe(net.inter), profile.nodes));
  } else if (any_multi_node) {
    throw InputError(fmt::format(
        "predict: the network between nodes is unknown (profile '{}' ran on one node): give --network PRESET "
        "({}) or --link-gbps G --latency-us L",
        o.profile, preset_names(inter_node_presets())));
  }

  if (o.intra) {
    const LinkPreset* p = find_preset(intra_node_presets(), *o.intra);
    net.intra = link_of(p->gbps, p->latency_us);
    say(fmt::format("within a node: {} ({}): {}", p->name, p->what, describe(net.intra)));
  } else if (o.intra_gbps) {
    net.intra = link_of(*o.intra_gbps, *o.intra_latency_us);
    say(fmt::format("within a node: {} (--intra-gbps, --intra-latency-us)", describe(net.intra)));
  } else if (measured && profile.nodes == 1) {
    net.intra = *measured;
    intra_measured = true;
    say(fmt::format("within a node: {} (measured over the profile's {} ranks)", describe(net.intra), profile.ranks));
  } else if (net.ranks_per_node > 1) {
    throw InputError(fmt::format(
        "predict: the link within a node is unknown (profile '{}' {}): give --intra PRESET ({}) or --intra-gbps G "
        "--intra-latency-us L",
        o.profile, profile.ranks == 1 ? "ran one rank" : "spans nodes", preset_names(intra_node_presets())));
  }
  if (net.ranks_per_node > 1) say(net.hierarchical ? "allreduce: hierarchical" : "allreduce: one flat ring");
  // The probe's links as they ran in training: the same factor for every allreduce over
  // them. Given links (presets, numbers) are taken as they are. Decided for rows of one node
  // and of several apart, so that a row does not change with the other rows asked for.
  const bool within_known = intra_measured || net.ranks_per_node == 1;
  const bool one_node = within_known && (inter_measured || intra_measured);
  const bool several = inter_measured && within_known;
  if (one_node || several) {
    const double f = sc::comm_factor(profile);
    net.comm_factor = several ? f : 1;
    net.comm_factor_one_node = one_node ? f : 1;
    if (profile.comm_s > 0) {
      say(fmt::format("allreduces beside backward: {:.2f} x the probe's time{} (measured at the profile's {} ranks; "
                      "applied to its measured links{})",
                      f, f >= sc::kMaxCommFactor * 0.999 ? ", the most the model takes: the measured time is more than "
                                                          "it explains" : "",
                      profile.ranks, several || !any_multi_node ? "" : ", so to the rows of one node"));
    }
  }
  return net;
}

std::string predict_csv(const std::vector<sc::SweepRow>& rows) {
  std::string out =
      "nodes,ranks,step_ms,throughput,efficiency,hidden_comm,threshold_kb,best_threshold_kb,best_step_ms,"
      "best_throughput,best_efficiency,best_hidden_comm\n";
  for (const sc::SweepRow& r : rows) {
    out += fmt::format("{},{},{:.4f},{:.2f},{:.4f},{:.4f},{},{},{:.4f},{:.2f},{:.4f},{:.4f}\n", r.nodes,
                       r.at_threshold.ranks, r.at_threshold.step_s * 1e3, r.at_threshold.throughput, r.efficiency,
                       r.at_threshold.hidden_share, kb(r.at_threshold.threshold_bytes), kb(r.best.threshold_bytes),
                       r.best.step_s * 1e3, r.best.throughput, r.best_efficiency, r.best.hidden_share);
  }
  return out;
}

std::string predict_table(const std::vector<sc::SweepRow>& rows) {
  std::string out = fmt::format("{:>6} {:>6} {:>10} {:>12} {:>10} {:>8}   {:>9} {:>10} {:>12} {:>10}\n", "nodes",
                                "ranks", "step ms", "samples/s", "efficiency", "hidden", "best KB", "step ms",
                                "samples/s", "efficiency");
  for (const sc::SweepRow& r : rows) {
    out += fmt::format("{:>6} {:>6} {:>10.3f} {:>12.1f} {:>9.1f}% {:>7.0f}%   {:>9} {:>10.3f} {:>12.1f} {:>9.1f}%\n",
                       r.nodes, r.at_threshold.ranks, r.at_threshold.step_s * 1e3, r.at_threshold.throughput,
                       100 * r.efficiency, 100 * r.at_threshold.hidden_share, kb(r.best.threshold_bytes),
                       r.best.step_s * 1e3, r.best.throughput, 100 * r.best_efficiency);
  }
  return out;
}

std::string predict_help_text() {
  std::string text = make_parser().help({"Job", "Between nodes", "Within a node", "Output"});
  text += "\nPresets between nodes (--network):\n";
  for (const LinkPreset& p : inter_node_presets()) {
    text += fmt::format("  {:<12} {:>6g} Gbit/s {:>5g} us   {}\n", p.name, p.gbps, p.latency_us, p.what);
  }
  text += "Presets within a node (--intra):\n";
  for (const LinkPreset& p : intra_node_presets()) {
    text += fmt::format("  {:<12} {:>6g} Gbit/s {:>5g} us   {}\n", p.name, p.gbps, p.latency_us, p.what);
  }
  text += R"(
The per-rank batch stays as profiled (weak scaling); efficiency is throughput against N times
one node's, for the threshold asked for and for the best threshold found (0, 1 KB, 2 KB, ...).
"hidden" is the share of the allreduce time that overlaps backward. docs/scaling.md says what
the model leaves out.

Examples:
  tarantella -n 2 --profile-scaling profile.json -- ./train --batch_size=64
  tarantella predict profile.json --nodes 1,2,4,8 --devices-per-node 2 --network 100gbe
  tarantella predict profile.json --nodes 1,4,16,64 --devices-per-node 8 --intra nvlink --network ib-ndr
  tarantella predict profile.json --nodes 2,4 --link-gbps 25 --latency-us 15 --csv pred.csv --plot pred.png
  tarantella predict profile.json --nodes 1,2 --fusion-threshold 512 --network 10gbe

Exit status: 0; 2 for bad input (a flag, a profile that does not read), naming it; 1 when the
plot could not be drawn (the table and the CSV are written first).
)";
  return text;
}

int predict_main(const std::vector<std::string>& args) {
  const PredictOptions o = parse_predict_command_line(args);
  if (o.help) {
    std::fputs(predict_help_text().c_str(), stdout);
    return 0;
  }
  sc::Profile profile;
  try {
    profile = sc::profile_from_json(read_file(o.profile), "profile '" + o.profile + "'");
    // Every figure of the table is against the measured step (before: +inf%).
    if (!(profile.step_s > 0)) {
      throw InputError(fmt::format("profile '{}': field 'step_s' is 0: a measured step takes time", o.profile));
    }
  } catch (const std::invalid_argument& e) {
    throw InputError(e.what());
  }
  std::vector<std::string> described;
  const sc::Network net = resolve_network(o, profile, &described);
  const int64_t threshold =
      o.fusion_threshold_kb ? static_cast<int64_t>(std::llround(*o.fusion_threshold_kb * 1024)) : profile.threshold_bytes;
  const std::vector<sc::SweepRow> rows = sc::sweep(profile, net, o.nodes, threshold);

  std::string head = fmt::format(
      "profile {}: {} rank(s) on {} node(s), {}, {} steps; {} samples a rank a step; step {:.3f} ms measured\n",
      o.profile, profile.ranks, profile.nodes, profile.device, profile.steps, profile.samples_per_rank,
      profile.step_s * 1e3);
  // The model at the profile's own setting, against what was measured there: how far to
  // trust the rest.
  if (profile.ranks == 1 || profile.allreduce) {
    sc::Network own;
    own.nodes = profile.nodes;
    own.ranks_per_node = profile.ranks_per_node;
    if (profile.allreduce) own.intra = own.inter = sc::link_from_fit(*profile.allreduce);
    own.hierarchical = false;  // the measured fit is of the whole ring as the job ran it
    own.comm_factor = sc::comm_factor(profile);  // as the rows below at the profile's nodes
    const sc::Prediction p = sc::predict(profile, own, profile.threshold_bytes);
    head += fmt::format("  the model at the profile's own {} rank(s): {:.3f} ms ({:+.1f}% against the measurement)\n",
                        profile.ranks, p.step_s * 1e3, 100 * (p.step_s / profile.step_s - 1));
  }
  for (const std::string& line : described) head += "  " + line + "\n";
  head += step_parts(profile);
  if (profile.backward_alone_s > 0) {
    head += fmt::format("  backward: {:.3f} ms alone, {:.3f} ms beside allreduces (as far as they overlap)\n",
                        profile.backward_alone_s * 1e3, profile.backward_s * 1e3);
  }
  if (profile.ranks > 1) {
    head += fmt::format("  a bucket's allreduce starts {:.3f} ms after it is ready and the channel free (the communication "
                        "thread's wake-up); the wait for gradients ends {:.3f} ms after the last allreduce (wake-up, "
                        "unpacking)\n",
                        profile.launch_delay_s * 1e3, profile.finish_s * 1e3);
  }
  if (profile.compute_samples_s.size() >= 2) {
    std::string lags;
    for (int n : o.nodes) {
      const int p = n * net.ranks_per_node;
      if (p > 1) lags += fmt::format("{}{:.1f} ms at {}", lags.empty() ? "" : ", ", sc::straggle_s(profile, p) * 1e3, p);
    }
    if (!lags.empty()) {
      head += fmt::format("  the slowest rank's lag (from {} compute samples): {} rank(s)\n",
                          profile.compute_samples_s.size(), lags);
    }
  }
  head += fmt::format("  {} rank(s) a node; fusion threshold {} KB{}\n\n", net.ranks_per_node, kb(threshold),
                      o.fusion_threshold_kb ? "" : " (the profile's)");
  std::fputs(head.c_str(), stdout);
  std::fputs(predict_table(rows).c_str(), stdout);
  std::fflush(stdout);

  const std::string csv = predict_csv(rows);
  if (o.csv) write_output_file("--csv", *o.csv, csv);
  if (!o.plot) return 0;

  // The plot: the CSV handed to a small Python script installed beside the launcher.
  const std::filesystem::path script = std::filesystem::path(self_executable()).parent_path() / "tnt_predict_plot.py";
  std::error_code ec;
  if (!std::filesystem::exists(script, ec)) {
    std::fprintf(stderr, "tarantella: error: --plot: %s is missing (a broken installation)\n", script.c_str());
    return 1;
  }
  std::string csv_path = o.csv.value_or("");
  std::string tmp_dir;
  if (csv_path.empty()) {
    char dir_template[] = "/tmp/tnt_predict.XXXXXX";
    if (!::mkdtemp(dir_template)) throw system_error("predict: cannot create a temporary directory");
    tmp_dir = dir_template;
    csv_path = tmp_dir + "/predict.csv";
    write_output_file("--plot", csv_path, csv);
  }
  const std::string title = fmt::format("{} ({} samples a rank)", std::filesystem::path(o.profile).filename().string(),
                                        profile.samples_per_rank);
  // As scripts/bench/scaling: $PYTHON, else Debian's python3 (python3-matplotlib), else the
  // python3 on PATH; the script exits 3 when its Python has no matplotlib.
  std::vector<std::string> pythons;
  if (const char* p = std::getenv("PYTHON"); p && *p) pythons.emplace_back(p);
  pythons.emplace_back("/usr/bin/python3");
  pythons.emplace_back("python3");
  int status = 0;
  bool drawn = false, tried_any = false;
  for (const std::string& python : pythons) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execlp(python.c_str(), python.c_str(), script.c_str(), csv_path.c_str(), o.plot->c_str(), title.c_str(),
               static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (pid < 0 || ::waitpid(pid, &status, 0) < 0) break;
    if (WIFEXITED(status) && (WEXITSTATUS(status) == 127 || WEXITSTATUS(status) == 3)) continue;
    tried_any = true;
    drawn = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    break;
  }
  if (!tmp_dir.empty()) std::filesystem::remove_all(tmp_dir, ec);
  if (!tried_any) {
    std::fprintf(stderr, "tarantella: error: --plot needs Python with matplotlib; none of %s has it (apt install "
                 "python3-matplotlib, or set PYTHON=)\n", fmt::format("{}", fmt::join(pythons, ", ")).c_str());
    return 1;
  }
  if (!drawn) return 1;  // the script said why
  std::printf("plot written to %s\n", o.plot->c_str());
  return 0;
}

}  // namespace tnt::launcher
