#include "comm/auto_threshold.hpp"

#include "comm/allreduce_probe.hpp"
#include "comm/scaling_model.hpp"
#include "tarantella/check.hpp"

#include <algorithm>

namespace tnt::comm {

namespace {

using scaling::median;

std::string kb(int64_t bytes) { return fmt::format("{:g} KB", static_cast<double>(bytes) / 1024); }

}  // namespace

AutoThreshold::AutoThreshold(int warmup, int steps) : warmup_(std::max(0, warmup)), steps_(std::max(1, steps)) {}

std::optional<int64_t> AutoThreshold::step_done(const StepTiming& timing, const std::vector<int64_t>& gradient_bytes,
                                                int64_t current, Communicator& comm, Device device) {
  if (++seen_ <= warmup_) return std::nullopt;
  // The Reducer's clock starts at the step's first gradient; backward up to there is the same
  // at every threshold, so the model sees backward from the first gradient on.
  backward_.push_back(timing.backward_end_s);
  ready_.push_back(timing.gradient_ready_s);
  if (static_cast<int>(ready_.size()) < steps_) return std::nullopt;

  // (gradients + 1,) the master's medians, then its backward.
  std::vector<double> shared;
  for (size_t i = 0; i < gradient_bytes.size(); ++i) {
    std::vector<double> r;
    for (const auto& step : ready_) r.push_back(i < step.size() ? step[i] : 0);
    shared.push_back(median(r));
  }
  shared.push_back(median(backward_));
  comm.broadcast(shared.data(), static_cast<int64_t>(shared.size()), DType::f64, Device::cpu());
  int64_t total = 0;
  for (int64_t b : gradient_bytes) total += b;
  const scaling::AllreduceFit fit = measure_allreduce(comm, device, total);

  scaling::Profile profile;
  profile.backward_s = shared.back();
  profile.samples_per_rank = 1;
  profile.threshold_bytes = current;
  for (size_t i = 0; i < gradient_bytes.size(); ++i) profile.gradients.push_back({"", gradient_bytes[i], shared[i]});
  // The fit is of this job's own allreduce over all its ranks: as one flat ring over links
  // that cost what the fit says, the model gives back exactly a + b * bytes.
  scaling::Network net;
  net.nodes = 1;
  net.ranks_per_node = comm.size();
  net.intra = net.inter = scaling::link_from_fit(fit);
  net.hierarchical = false;
  const scaling::Prediction now = scaling::predict(profile, net, current);
  const scaling::Prediction best = scaling::best_prediction(profile, net);
  int64_t choice = best.step_s < now.step_s * (1 - kMinGain) ? best.threshold_bytes : current;
  comm.broadcast(&choice, 1, DType::i64, Device::cpu());
  const double gain = now.step_s > 0 ? 1 - best.step_s / now.step_s : 0;
  note_ = choice == current && gain < 0.0005
              ? fmt::format("fusion threshold auto: {} kept (no threshold is predicted faster over backward and the "
                            "wait for gradients: {:.3f} ms)", kb(current), now.step_s * 1e3)
          : choice == current
              ? fmt::format("fusion threshold auto: {} kept (the best, {}, is predicted {:.1f}% faster over backward "
                            "and the wait; {:.0f}% needed to change)",
                            kb(current), kb(best.threshold_bytes), 100 * gain, 100 * kMinGain)
              : fmt::format("fusion threshold auto: {} instead of {}: backward and the wait for gradients predicted "
                            "{:.3f} ms instead of {:.3f} ms ({:.1f}% faster)",
                            kb(choice), kb(current), best.step_s * 1e3, now.step_s * 1e3, 100 * gain);
  return choice;
}

}  // namespace tnt::comm
