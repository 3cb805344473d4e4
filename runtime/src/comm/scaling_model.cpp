#include "comm/scaling_model.hpp"

#include "comm/bucket_plan.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tnt::comm::scaling {

using json = nlohmann::json;

Link link_from_fit(const AllreduceFit& fit) {
  if (fit.ranks < 2) throw std::invalid_argument("an allreduce fit over fewer than 2 ranks says nothing about a link");
  const double p = fit.ranks;
  Link link;
  link.latency_s = fit.a_s / (2 * (p - 1));
  // b = 2(p-1)/p / bandwidth; b == 0 (nothing measurable) reads as a very fast link.
  link.bytes_per_s = fit.b_s_per_byte > 0 ? 2 * (p - 1) / p / fit.b_s_per_byte : 1e15;
  return link;
}

AllreduceFit fit_allreduce(const std::vector<int64_t>& bytes, const std::vector<double>& seconds, int ranks) {
  if (bytes.size() != seconds.size()) throw std::invalid_argument("fit_allreduce: sizes and times differ in length");
  std::vector<std::pair<double, double>> points;  // (bytes, seconds), by size
  for (size_t i = 0; i < bytes.size(); ++i) points.emplace_back(static_cast<double>(bytes[i]), seconds[i]);
  std::sort(points.begin(), points.end());
  // The slope from the larger half of the sizes, the intercept from the smaller half. One
  // least-squares line over all of them lets either end decide the other: weighted toward
  // the large sizes, a line through curving costs (caches, a token bucket's burst) crosses
  // zero below the origin and the latency is lost; weighted toward the small ones, a single
  // small allreduce that happened to be fast sets the bandwidth (seen on the test bed: a
  // 4 KB allreduce at 10 us made the line through 4 MB at 254 ms pass at 107 ms).
  const size_t small = points.size() / 2;
  const size_t first_large = points.size() > 2 ? small : 0;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = first_large; i < points.size(); ++i) {
    const auto [x, y] = points[i];
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double den = n * sxx - sx * sx;
  if (points.size() < 2 || !(den > 1e-12 * n * sxx)) {
    throw std::invalid_argument("fit_allreduce: needs at least two distinct sizes");
  }
  AllreduceFit fit;
  fit.ranks = ranks;
  fit.b_s_per_byte = (n * sxy - sx * sy) / den;
  if (!(fit.b_s_per_byte > 0)) {
    // Noise turned the larger sizes' line flat or downhill (a loaded machine, sizes close
    // together): bytes still cost time, so take the line from the smallest to the largest.
    const auto& [x0, y0] = points.front();
    const auto& [x1, y1] = points.back();
    fit.b_s_per_byte = (y1 - y0) / (x1 - x0);
    // Even that is flat or downhill (the smallest size's median came out slower than the
    // largest's: seen in CI, two ranks beside other tests on two cores). The largest size's
    // time per byte bounds the cost from above; a slope of 0 would call the link infinitely
    // fast.
    if (!(fit.b_s_per_byte > 0)) fit.b_s_per_byte = x1 > 0 && y1 > 0 ? y1 / x1 : 0;
  }
  std::vector<double> intercepts;
  for (size_t i = 0; i < std::max<size_t>(small, 1); ++i) intercepts.push_back(points[i].second - fit.b_s_per_byte * points[i].first);
  std::sort(intercepts.begin(), intercepts.end());
  const size_t m = intercepts.size() / 2;
  fit.a_s = intercepts.size() % 2 ? intercepts[m] : 0.5 * (intercepts[m - 1] + intercepts[m]);
  if (!(fit.a_s > 0)) {
    // The line passes below the origin at the small sizes (a token bucket's burst carried
    // them, or a loaded machine made the larger ones' slope steep: seen in CI, two ranks on
    // two busy cores). No allreduce is free: the smallest size's own time bounds the latency
    // from above and is mostly latency, so it stands in.
    fit.a_s = std::max(0.0, points.front().second);
  }
  return fit;
}

namespace {

// One ring allreduce over p ranks on one kind of link.
double ring_s(double bytes, int p, const Link& link) {
  if (p <= 1) return 0;
  return 2.0 * (p - 1) * link.latency_s + 2.0 * (p - 1) / p * bytes / link.bytes_per_s;
}

}  // namespace

double allreduce_s(int64_t bytes, const Network& net) {
  const int p = net.nodes * net.ranks_per_node;
  if (p <= 1) return 0;
  const double n = static_cast<double>(bytes);
  if (net.nodes == 1) return ring_s(n, net.ranks_per_node, net.intra);
  if (net.ranks_per_node == 1) return ring_s(n, net.nodes, net.inter);
  if (net.hierarchical) return ring_s(n, net.ranks_per_node, net.intra) + ring_s(n, net.nodes, net.inter);
  // Every step of a flat ring moves a chunk over each edge at once, some within a node and
  // some across: the slower edge sets the pace.
  const double within = net.intra.latency_s + n / p / net.intra.bytes_per_s;
  const double across = net.inter.latency_s + n / p / net.inter.bytes_per_s;
  return 2.0 * (p - 1) * std::max(within, across);
}

double straggle_s(const Profile& profile, int ranks) {
  std::vector<double> x = profile.compute_samples_s;
  if (ranks < 2 || x.size() < 2) return 0;
  std::sort(x.begin(), x.end());
  const double n = static_cast<double>(x.size());
  double expected_max = 0;
  for (size_t i = 1; i <= x.size(); ++i) {
    expected_max += x[i - 1] * (std::pow(i / n, ranks) - std::pow((i - 1) / n, ranks));
  }
  return std::max(0.0, expected_max - median(x));
}

namespace {

// The channel over one backward: buckets in order, each from when it is ready (the
// profile's ready times times `scale`, the backward's length `backward_s`) and the one
// before it is done.
struct Channel {
  int buckets = 0;
  double free_s = 0;    // when the last bucket is done, since backward began
  double comm_s = 0;    // all allreduces together
  double hidden_s = 0;  // the part of them before backward ended
  double straggle_s = 0;
};

Channel run_channel(const Profile& profile, const Network& net, int64_t threshold_bytes, double backward_s) {
  std::vector<GradientInfo> infos;
  infos.reserve(profile.gradients.size());
  for (const ProfiledGradient& g : profile.gradients) {
    // The plan reads bytes, dtype and device only; one dtype and one device for all, as in
    // a Reducer over one model's gradients.
    GradientInfo info;
    info.bytes = g.bytes;
    info.numel = g.bytes / 4;
    infos.push_back(info);
  }
  const BucketPlan plan = plan_buckets(infos, threshold_bytes);
  Channel c;
  c.buckets = static_cast<int>(plan.buckets.size());
  if (net.nodes * net.ranks_per_node <= 1) return c;
  const double scale = profile.backward_s > 0 ? backward_s / profile.backward_s : 1;
  // Every collective starts when its last rank arrives: the master's ready times, late by
  // the slowest rank's lag (stragglers: more ranks, a later slowest one).
  c.straggle_s = straggle_s(profile, net.nodes * net.ranks_per_node);
  for (const PlannedBucket& b : plan.buckets) {
    double ready = 0;
    for (size_t g : b.gradients) ready = std::max(ready, std::clamp(profile.gradients[g].ready_s, 0.0, profile.backward_s));
    ready = ready * scale + c.straggle_s;
    const double start = std::max(ready, c.free_s) + profile.launch_delay_s;
    // comm_factor times slower while backward runs beside it, the probe's speed after.
    const double work = allreduce_s(b.bytes, net);
    const double f = std::max(1.0, net.factor_at(net.nodes));
    double end = start + work;
    if (start < backward_s) end = start + work * f <= backward_s ? start + work * f : backward_s + (work - (backward_s - start) / f);
    c.free_s = end;
    c.comm_s += end - start;
    c.hidden_s += std::max(0.0, std::min(c.free_s, backward_s) - start);
  }
  return c;
}

// The network the profile ran on, as its probe measured it (nullopt without a probe).
std::optional<Network> own_network(const Profile& profile) {
  if (!profile.allreduce || profile.ranks < 2) return std::nullopt;
  Network own;
  own.nodes = profile.nodes;
  own.ranks_per_node = profile.ranks_per_node;
  own.intra = own.inter = link_from_fit(*profile.allreduce);
  own.hierarchical = false;  // the fit is of the whole ring as the job ran it
  return own;
}

}  // namespace

double comm_factor(const Profile& profile) {
  std::optional<Network> own = own_network(profile);
  if (!own || profile.comm_s <= 0) return 1;
  // The factor that makes the channel at the profile's own setting take the measured time
  // (less the lag the first bucket waited for the slowest rank): the channel's time grows
  // with the factor, so bisection finds it. At 1 the probe's time already reaches it: 1
  // (training faster than the probe, on the test bed a token bucket's burst refilled while
  // a step computes, is not carried to other rank counts).
  const double target = std::max(0.0, profile.comm_s - straggle_s(profile, profile.ranks));
  auto channel_at = [&](double f) {
    own->comm_factor = f;
    return run_channel(profile, *own, profile.threshold_bytes, profile.backward_s).comm_s;
  };
  double lo = 1, hi = kMaxCommFactor;
  if (channel_at(lo) >= target) return 1;
  // Nothing overlapped backward at the profile: no factor explains the time; 1.
  if (channel_at(hi) <= target) return channel_at(hi) > channel_at(lo) ? hi : 1;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (channel_at(mid) < target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double small_allreduce_s(int64_t bytes, const Network& net) {
  // ceil(log2 k) rounds among k peers.
  auto rounds = [](int k) {
    int r = 0;
    while ((1 << r) < k) ++r;
    return r;
  };
  // A link with no rounds on it adds nothing, measured or not (a profile of one rank a node
  // has no intra-node link: 0 bytes/s, and 0 x infinity would be NaN).
  const double n = static_cast<double>(bytes);
  auto over = [n](int k, const Link& link) {
    if (k == 0) return 0.0;
    return k * (link.latency_s + (link.bytes_per_s > 0 ? n / link.bytes_per_s : 0.0));
  };
  return over(rounds(net.ranks_per_node), net.intra) + over(rounds(net.nodes), net.inter);
}

double collectives_s(const Profile& profile, const Network& net) {
  if (profile.collectives <= 0) return profile.collectives_s;
  // Each of them with its share of the bytes (the cost is linear in the bytes: exact).
  auto network_s = [&](const Network& on) {
    return profile.collectives * small_allreduce_s(profile.collective_bytes / profile.collectives, on);
  };
  const std::optional<Network> own = own_network(profile);
  const double own_s = own ? network_s(*own) : 0.0;
  if (own_s > 0) return profile.collectives_s * network_s(net) / own_s;
  return profile.collectives_s + network_s(net);
}

std::optional<Network> measured_network(const Profile& profile) {
  std::optional<Network> own = own_network(profile);
  if (own) own->comm_factor = comm_factor(profile);
  return own;
}

Prediction predict(const Profile& profile, const Network& net, int64_t threshold_bytes) {
  Prediction out;
  out.ranks = net.nodes * net.ranks_per_node;
  out.threshold_bytes = threshold_bytes;
  Channel c = run_channel(profile, net, threshold_bytes, profile.backward_s);
  // Backward with allreduces beside it is slower than alone where they share the cores:
  // the profile measured both, at its own overlap; here the difference goes with the
  // overlap predicted (none on one rank, none when every bucket waits for backward's end).
  double backward_s = profile.backward_s;
  if (profile.backward_alone_s > 0 && profile.backward_alone_s < profile.backward_s) {
    double at_profile = 0;
    if (const std::optional<Network> own = measured_network(profile)) {
      at_profile = run_channel(profile, *own, profile.threshold_bytes, profile.backward_s).hidden_s;
    }
    const double share = at_profile > 0 ? std::clamp(c.hidden_s / at_profile, 0.0, 1.0) : (c.hidden_s > 0 ? 1.0 : 0.0);
    backward_s = profile.backward_alone_s + share * (profile.backward_s - profile.backward_alone_s);
    if (backward_s != profile.backward_s) c = run_channel(profile, net, threshold_bytes, backward_s);
  }
  out.buckets = c.buckets;
  out.straggle_s = c.straggle_s;
  out.comm_s = c.comm_s;
  out.backward_s = backward_s;
  // With more than one rank finalize() also waits for the communication thread's last
  // signal and unpacks: the profile's finish_s, whatever the overlap.
  out.exposed_s = std::max(0.0, c.free_s - backward_s) + (out.ranks > 1 ? profile.finish_s : 0.0);
  out.hidden_share = out.comm_s > 0 ? c.hidden_s / out.comm_s : 1.0;
  out.collectives_s = collectives_s(profile, net);
  out.step_s = profile.input_s + profile.forward_s + backward_s + out.exposed_s + profile.optimizer_s +
               profile.other_s + out.collectives_s;
  out.throughput = out.step_s > 0 ? static_cast<double>(profile.samples_per_rank) * out.ranks / out.step_s : 0;
  return out;
}

std::vector<int64_t> candidate_thresholds(const Profile& profile) {
  int64_t total = 0;
  for (const ProfiledGradient& g : profile.gradients) total += g.bytes;
  std::vector<int64_t> out{0};
  for (int64_t t = 1024;; t *= 2) {
    out.push_back(t);
    if (t >= total) break;
  }
  out.push_back(profile.threshold_bytes);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Prediction best_prediction(const Profile& profile, const Network& net) {
  std::optional<Prediction> best;
  for (int64_t t : candidate_thresholds(profile)) {
    Prediction p = predict(profile, net, t);
    // Strictly better by more than rounding: a tie keeps the smaller threshold, so every
    // rank that evaluates the same inputs picks the same one.
    if (!best || p.step_s < best->step_s * (1 - 1e-12)) best = p;
  }
  return *best;
}

std::vector<SweepRow> sweep(const Profile& profile, Network net, const std::vector<int>& nodes,
                            int64_t threshold_bytes) {
  net.nodes = 1;
  const Prediction one = predict(profile, net, threshold_bytes);
  const Prediction one_best = best_prediction(profile, net);
  std::vector<SweepRow> rows;
  for (int n : nodes) {
    net.nodes = n;
    SweepRow row;
    row.nodes = n;
    row.at_threshold = predict(profile, net, threshold_bytes);
    row.best = best_prediction(profile, net);
    row.efficiency = one.throughput > 0 ? row.at_threshold.throughput / (n * one.throughput) : 0;
    row.best_efficiency = one_best.throughput > 0 ? row.best.throughput / (n * one_best.throughput) : 0;
    rows.push_back(row);
  }
  return rows;
}

// ---- the profile file ----

std::string profile_to_json(const Profile& p) {
  json j;
  j["format"] = "tarantella-scaling-profile";
  j["version"] = 1;
  j["ranks"] = p.ranks;
  j["nodes"] = p.nodes;
  j["ranks_per_node"] = p.ranks_per_node;
  j["device"] = p.device;
  j["transport"] = p.transport;
  j["steps"] = p.steps;
  j["threshold_bytes"] = p.threshold_bytes;
  j["samples_per_rank"] = p.samples_per_rank;
  j["input_s"] = p.input_s;
  j["forward_s"] = p.forward_s;
  j["backward_s"] = p.backward_s;
  j["optimizer_s"] = p.optimizer_s;
  j["other_s"] = p.other_s;
  j["collectives_s"] = p.collectives_s;
  j["collectives"] = p.collectives;
  j["collective_bytes"] = p.collective_bytes;
  j["step_s"] = p.step_s;
  j["exposed_comm_s"] = p.exposed_comm_s;
  j["comm_s"] = p.comm_s;
  j["backward_alone_s"] = p.backward_alone_s;
  j["launch_delay_s"] = p.launch_delay_s;
  j["finish_s"] = p.finish_s;
  if (p.allreduce) {
    j["allreduce"] = {{"ranks", p.allreduce->ranks}, {"a_s", p.allreduce->a_s},
                      {"b_s_per_byte", p.allreduce->b_s_per_byte}};
  }
  if (!p.compute_samples_s.empty()) j["compute_samples_s"] = p.compute_samples_s;
  json grads = json::array();
  for (const ProfiledGradient& g : p.gradients) grads.push_back({{"name", g.name}, {"bytes", g.bytes}, {"ready_s", g.ready_s}});
  j["gradients"] = grads;
  return j.dump(1) + "\n";
}

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& field, const std::string& problem) {
  throw std::invalid_argument(what + ": field '" + field + "' " + problem);
}

// `name` is the key in j, `at` where j is in the file ("" at the top, "gradients[3]." ...).
const json& field(const json& j, const std::string& what, const std::string& name, const std::string& at) {
  auto it = j.find(name);
  if (it == j.end()) bad(what, at + name, "is missing");
  return *it;
}

double seconds(const json& j, const std::string& what, const std::string& name, const std::string& at = "") {
  const json& v = field(j, what, name, at);
  if (!v.is_number()) bad(what, at + name, "is not a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) bad(what, at + name, "is not a finite non-negative number");
  return d;
}

int64_t count(const json& j, const std::string& what, const std::string& name, int64_t min, const std::string& at = "") {
  const json& v = field(j, what, name, at);
  if (!v.is_number_integer()) bad(what, at + name, "is not an integer");
  const int64_t n = v.get<int64_t>();
  if (n < min) bad(what, at + name, "is below " + std::to_string(min));
  return n;
}

std::string text(const json& j, const std::string& what, const std::string& name, const std::string& at = "") {
  const json& v = field(j, what, name, at);
  if (!v.is_string()) bad(what, at + name, "is not a string");
  return v.get<std::string>();
}

}  // namespace

Profile profile_from_json(const std::string& body, const std::string& what) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw std::invalid_argument(what + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw std::invalid_argument(what + ": not a JSON object");
  if (text(j, what, "format") != "tarantella-scaling-profile") {
    bad(what, "format", "is not \"tarantella-scaling-profile\" (not a profile written by --profile-scaling)");
  }
  if (count(j, what, "version", 1) != 1) bad(what, "version", "is not 1 (written by a newer tarantella?)");
  Profile p;
  p.ranks = static_cast<int>(count(j, what, "ranks", 1));
  p.nodes = static_cast<int>(count(j, what, "nodes", 1));
  p.ranks_per_node = static_cast<int>(count(j, what, "ranks_per_node", 1));
  if (p.ranks != p.nodes * p.ranks_per_node) {
    bad(what, "ranks", "is not nodes * ranks_per_node (" + std::to_string(p.nodes) + " * " +
                           std::to_string(p.ranks_per_node) + ")");
  }
  p.device = text(j, what, "device");
  p.transport = text(j, what, "transport");
  p.steps = static_cast<int>(count(j, what, "steps", 1));
  p.threshold_bytes = count(j, what, "threshold_bytes", 0);
  p.samples_per_rank = count(j, what, "samples_per_rank", 1);
  p.input_s = seconds(j, what, "input_s");
  p.forward_s = seconds(j, what, "forward_s");
  p.backward_s = seconds(j, what, "backward_s");
  p.optimizer_s = seconds(j, what, "optimizer_s");
  p.other_s = seconds(j, what, "other_s");
  p.step_s = seconds(j, what, "step_s");
  p.exposed_comm_s = seconds(j, what, "exposed_comm_s");
  // Optional: older profiles lack them.
  if (j.contains("comm_s")) p.comm_s = seconds(j, what, "comm_s");
  if (j.contains("backward_alone_s")) p.backward_alone_s = seconds(j, what, "backward_alone_s");
  if (j.contains("launch_delay_s")) p.launch_delay_s = seconds(j, what, "launch_delay_s");
  if (j.contains("finish_s")) p.finish_s = seconds(j, what, "finish_s");
  // Without them (older profiles) the metrics' allreduce is inside other_s: constant.
  if (j.contains("collectives_s")) p.collectives_s = seconds(j, what, "collectives_s");
  if (j.contains("collectives")) p.collectives = static_cast<int>(count(j, what, "collectives", 0));
  if (j.contains("collective_bytes")) p.collective_bytes = count(j, what, "collective_bytes", 0);
  if (j.contains("allreduce")) {
    const json& a = j["allreduce"];
    if (!a.is_object()) bad(what, "allreduce", "is not an object");
    p.allreduce = AllreduceFit{static_cast<int>(count(a, what, "ranks", 2, "allreduce.")), 0, 0};
    p.allreduce->a_s = seconds(a, what, "a_s", "allreduce.");
    p.allreduce->b_s_per_byte = seconds(a, what, "b_s_per_byte", "allreduce.");
  }
  if (j.contains("compute_samples_s")) {  // optional: profiles before it lack it
    const json& c = j["compute_samples_s"];
    if (!c.is_array()) bad(what, "compute_samples_s", "is not an array");
    for (size_t i = 0; i < c.size(); ++i) {
      if (!c[i].is_number() || !std::isfinite(c[i].get<double>()) || c[i].get<double>() < 0) {
        bad(what, "compute_samples_s[" + std::to_string(i) + "]", "is not a finite non-negative number");
      }
      p.compute_samples_s.push_back(c[i].get<double>());
    }
  }
  const json& grads = field(j, what, "gradients", "");
  if (!grads.is_array()) bad(what, "gradients", "is not an array");
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string at = "gradients[" + std::to_string(i) + "]";
    if (!grads[i].is_object()) bad(what, at, "is not an object");
    ProfiledGradient g;
    g.name = text(grads[i], what, "name", at + ".");
    g.bytes = count(grads[i], what, "bytes", 0, at + ".");
    g.ready_s = seconds(grads[i], what, "ready_s", at + ".");
    p.gradients.push_back(g);
  }
  return p;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace tnt::comm::scaling
