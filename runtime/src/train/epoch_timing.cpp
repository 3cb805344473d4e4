// The epoch's step timing (tarantella/model.hpp: EpochTiming): its averages and the line
// that verbose 2 prints.
#include "tarantella/model.hpp"

#include <fmt/format.h>

#include <string>

namespace tnt {

namespace {
// Milliseconds to one decimal, and to three under 1 ms: a tiny model's waits read "0.0 ms"
// beside a percentage that says they matter.
std::string ms(double seconds) {
  const double v = seconds * 1e3;
  return v < 1.0 && v > 0.0 ? fmt::format("{:.3f}", v) : fmt::format("{:.1f}", v);
}
}  // namespace

std::string describe_epoch_timing(int epoch, const EpochTiming& t, int ranks) {
  std::string line = fmt::format("epoch {}: {} ms/step, backward {} ms", epoch, ms(t.step_seconds),
                                 ms(t.backward_seconds));
  if (const double f = t.input_fraction(); f >= kInputBoundFraction) {
    line += fmt::format("; waited {} ms a step for its batch ({:.0f}%: the input is too slow)", ms(t.input_seconds),
                        f * 100.0);
  }
  if (t.parameter_server) {
    return line + fmt::format("; parameter servers: pull {:.1f} ms a step, push {:.1f} ms (this worker's own "
                              "steps)",
                              t.pull_seconds * 1e3, t.push_seconds * 1e3);
  }
  if (ranks <= 1) return line + " (1 rank: no gradient allreduce)";
  // The buckets' allreduce time (summed over buckets) and the share of it before backward
  // ended; the wait after backward is the step's own time (it includes unpacking and is not
  // a part of the allreduce time, so the two are reported apart).
  line += fmt::format("; gradient allreduce {:.1f} ms a step, {:.0f}% of it while backward ran; after "
                      "backward the step waited {:.1f} ms for its gradients",
                      t.comm_seconds * 1e3, t.hidden_fraction() * 100.0, t.exposed_comm_seconds * 1e3);
  // Who the others waited for (train/rank_balance.hpp), where it was measured: the slowest
  // rank's own work a step against the median of the ranks that waited (not named with it).
  if (t.slowest_rank >= 0 && t.typical_own_seconds > 0) {
    line += fmt::format("; the slowest rank's own work: rank {}, {} ms against {} {} ms ({:.2f}x)", t.slowest_rank,
                        ms(t.slowest_own_seconds), ranks == 2 ? "the other rank's" : "the waiting ranks' median",
                        ms(t.typical_own_seconds), t.slowest_own_seconds / t.typical_own_seconds);
  }
  return line;
}

void EpochTiming::finish() {
  if (steps == 0) return;
  const double n = static_cast<double>(steps);
  step_seconds /= n;
  input_seconds /= n;
  backward_seconds /= n;
  comm_seconds /= n;
  hidden_comm_seconds /= n;
  exposed_comm_seconds /= n;
  pull_seconds /= n;
  push_seconds /= n;
}

}  // namespace tnt
