#include "comm/auto_threshold.hpp"

#include "comm/allreduce_probe.hpp"
#include "tarantella/check.hpp"

#include <algorithm>
#include <chrono>

namespace tnt::comm {

namespace {

using scaling::median;

std::string kb(int64_t bytes) { return fmt::format("{:g} KB", static_cast<double>(bytes) / 1024); }

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<double> gather_every_rank(Communicator& comm, const std::vector<double>& mine) {
  if (comm.size() == 1 || mine.empty()) return mine;
  std::vector<double> all(mine.size() * static_cast<size_t>(comm.size()));
  comm.allgather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), DType::f64, Device::cpu());
  return all;
}

scaling::Profile auto_profile(const AutoMeasurement& m) {
  TNT_CHECK(m.ready_s.size() == m.gradient_bytes.size(), "auto_profile: {} ready times for {} gradients",
            m.ready_s.size(), m.gradient_bytes.size());
  scaling::Profile p;
  // The probe is of this job's own allreduce over all its ranks, taken as one flat ring: the
  // node split does not matter then (scaling::measured_network).
  p.ranks = m.ranks;
  p.nodes = 1;
  p.ranks_per_node = m.ranks;
  p.threshold_bytes = m.threshold_bytes;
  p.samples_per_rank = 1;
  p.backward_s = m.backward_s;
  p.comm_s = m.ranks > 1 ? m.comm_s : 0;
  p.launch_delay_s = m.ranks > 1 ? m.launch_delay_s : 0;
  p.compute_samples_s = m.compute_samples_s;
  p.allreduce = m.probe;
  for (size_t i = 0; i < m.gradient_bytes.size(); ++i) p.gradients.push_back({"", m.gradient_bytes[i], m.ready_s[i]});
  return p;
}

AutoThreshold::AutoThreshold(int warmup, int steps) : warmup_(std::max(0, warmup)), steps_(std::max(1, steps)) {}

AutoChoice AutoThreshold::choose(const scaling::Profile& profile) {
  const std::optional<scaling::Network> net = scaling::measured_network(profile);
  TNT_CHECK(net.has_value(), "AutoThreshold::choose: a profile of {} rank(s) {} a probe: nothing to predict with",
            profile.ranks, profile.allreduce ? "with" : "without");
  AutoChoice c;
  c.comm_factor = net->comm_factor;
  c.now = scaling::predict(profile, *net, profile.threshold_bytes);
  c.best = scaling::best_prediction(profile, *net);
  c.threshold_bytes = c.best.step_s < c.now.step_s * (1 - kMinGain) ? c.best.threshold_bytes : profile.threshold_bytes;
  c.gain = c.now.step_s > 0 ? 1 - c.best.step_s / c.now.step_s : 0;
  return c;
}

std::string AutoThreshold::describe(const AutoChoice& c, const scaling::Profile& profile) {
  const int64_t current = profile.threshold_bytes;
  const std::string choice =
      c.threshold_bytes == current && c.gain < 0.0005
          ? fmt::format("fusion threshold auto: {} kept (no threshold is predicted faster over backward and the "
                        "wait for gradients: {:.3f} ms)", kb(current), c.now.step_s * 1e3)
      : c.threshold_bytes == current
          ? fmt::format("fusion threshold auto: {} kept (the best, {}, is predicted {:.1f}% faster over backward "
                        "and the wait; {:.0f}% needed to change)",
                        kb(current), kb(c.best.threshold_bytes), 100 * c.gain, 100 * kMinGain)
          : fmt::format("fusion threshold auto: {} instead of {}: backward and the wait for gradients predicted "
                        "{:.3f} ms instead of {:.3f} ms ({:.1f}% faster)",
                        kb(c.threshold_bytes), kb(current), c.best.step_s * 1e3, c.now.step_s * 1e3, 100 * c.gain);
  // The corrections as `tarantella predict` prints them, so that a surprising choice can be
  // traced to what was measured.
  return choice + fmt::format("; measured on {} rank(s): the slowest rank's lag {:.3f} ms (from {} compute samples), "
                              "allreduces beside backward {:.2f} x the probe's time, a bucket's launch delay {:.3f} ms, "
                              "backward alone not measured (taken as {:.3f} ms beside allreduces)",
                              profile.ranks, c.now.straggle_s * 1e3, profile.compute_samples_s.size(), c.comm_factor,
                              profile.launch_delay_s * 1e3, profile.backward_s * 1e3);
}

std::optional<int64_t> AutoThreshold::step_done(const StepTiming& timing, const std::vector<int64_t>& gradient_bytes,
                                                int64_t current, Communicator& comm, Device device) {
  // The time between finalize() calls less this step's wait in finalize(): what a rank
  // computes while the others cannot start the next step's first collective.
  const double now = steady_now_s();
  const std::optional<double> last = last_return_s_;
  last_return_s_ = now;
  if (++seen_ <= warmup_) return std::nullopt;
  if (last) compute_.push_back(std::max(0.0, now - *last - (timing.finalize_end_s - timing.backward_end_s)));
  backward_.push_back(timing.backward_end_s);
  ready_.push_back(timing.gradient_ready_s);
  comm_.push_back(timing.comm_s());
  launch_delay_.push_back(timing.launch_delay_s());
  if (static_cast<int>(ready_.size()) < steps_) return std::nullopt;

  // (gradients + 3,) the master's medians: ready times, then backward, the allreduces' time
  // and their launch delay.
  std::vector<double> shared;
  for (size_t i = 0; i < gradient_bytes.size(); ++i) {
    std::vector<double> r;
    for (const auto& step : ready_) r.push_back(i < step.size() ? step[i] : 0);
    shared.push_back(median(r));
  }
  shared.push_back(median(backward_));
  shared.push_back(median(comm_));
  shared.push_back(median(launch_delay_));
  comm.broadcast(shared.data(), static_cast<int64_t>(shared.size()), DType::f64, Device::cpu());

  AutoMeasurement m;
  m.ranks = comm.size();
  m.threshold_bytes = current;
  m.gradient_bytes = gradient_bytes;
  m.ready_s.assign(shared.begin(), shared.begin() + static_cast<std::ptrdiff_t>(gradient_bytes.size()));
  m.backward_s = shared[gradient_bytes.size()];
  m.comm_s = shared[gradient_bytes.size() + 1];
  m.launch_delay_s = shared[gradient_bytes.size() + 2];
  // Every rank holds the same count (the same steps, the same warm-up).
  m.compute_samples_s = gather_every_rank(comm, compute_);
  int64_t total = 0;
  for (int64_t b : gradient_bytes) total += b;
  m.probe = measure_allreduce(comm, device, total);

  profile_ = auto_profile(m);
  const AutoChoice c = choose(profile_);
  int64_t choice = c.threshold_bytes;
  comm.broadcast(&choice, 1, DType::i64, Device::cpu());
  note_ = describe(c, profile_);
  return choice;
}

}  // namespace tnt::comm
