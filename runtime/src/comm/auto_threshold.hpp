// --fusion-threshold auto (TNT_FUSION_THRESHOLD=auto): the Reducer's choice of threshold from
// its own first steps. After `warmup` steps it keeps, for `steps` steps, the ready time of
// every gradient, the allreduces' time in training and the time each rank computes between
// two finalize() calls; then, collectively, the allreduce is measured on the spot
// (comm/allreduce_probe), the master's medians are broadcast and every rank's compute times
// gathered, the scaling model (comm/scaling_model) predicts backward plus the wait for the
// allreduces at every candidate threshold, and the master's pick is broadcast, so that
// every rank makes the same plan.
//
// The model is the one `tarantella predict` uses, with two of its three corrections
// measured on these steps as --profile-scaling measures them: the slowest rank's lag (from
// the spread of every rank's compute times) and the allreduces' slowdown beside backward
// (their time in training against the probe's). The third, backward with no allreduce
// beside it, needs steps run with one bucket sent after backward, that is steps at another
// plan than the job's: auto does not run them, and the model takes backward as measured.
//
// A candidate must beat the current threshold by kMinGain to be taken: the model's error
// on a loaded machine is a few percent, and a change of plan on noise gains nothing.
#pragma once

#include "comm/scaling_model.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/reducer.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tnt::comm {

// Every rank's `mine` (the same count on each), rank after rank, on every rank: the
// profile's compute_samples_s, as --profile-scaling and auto gather them. Collective.
std::vector<double> gather_every_rank(Communicator& comm, const std::vector<double>& mine);

// What the tuner measured, as every rank holds it once the master's medians are broadcast.
struct AutoMeasurement {
  int ranks = 1;
  int64_t threshold_bytes = 0;          // the plan the timed steps ran at
  std::vector<int64_t> gradient_bytes;  // (gradients,) registration order
  // (gradients,) the master's median ready times, since the step's first gradient; the
  // Reducer's clock starts there, and backward before it is the same at every threshold.
  std::vector<double> ready_s;
  double backward_s = 0;  // the master's median, on the same clock
  double comm_s = 0;      // the master's median of StepTiming::comm_s(): allreduces in training
  double launch_delay_s = 0;  // the master's median of StepTiming::launch_delay_s()
  // (ranks * steps,) every rank's time from one finalize() return to the next finalize()
  // call: the compute between two points where the ranks are together.
  std::vector<double> compute_samples_s;
  std::optional<scaling::AllreduceFit> probe;  // the on-the-spot allreduce over `ranks`
};

// The profile the model sees: backward and the gradients (no input, forward or optimizer:
// they are the same at every threshold), with the corrections' inputs.
scaling::Profile auto_profile(const AutoMeasurement& m);

struct AutoChoice {
  int64_t threshold_bytes = 0;  // the pick, or the profile's threshold where it gains < kMinGain
  scaling::Prediction now;      // at the profile's threshold
  scaling::Prediction best;     // scaling::best_prediction on the profile's own ranks
  double comm_factor = 1;       // the network's, scaling::comm_factor of the profile
  double gain = 0;              // 1 - best / now
};

class AutoThreshold {
 public:
  static constexpr double kMinGain = 0.02;

  AutoThreshold(int warmup, int steps);

  // Pure: the choice on the profile's own ranks over its measured network (the plain
  // network of the probe without one, as for a profile of one rank).
  static AutoChoice choose(const scaling::Profile& profile);
  // The log line of a choice: the pick, its predicted gain and the corrections used.
  static std::string describe(const AutoChoice& choice, const scaling::Profile& profile);

  // After each step (`timing`: its StepTiming). Returns the threshold to use from now on at
  // the step where the choice is made (collective then), else nullopt.
  std::optional<int64_t> step_done(const StepTiming& timing, const std::vector<int64_t>& gradient_bytes,
                                   int64_t current, Communicator& comm, Device device);
  const std::string& note() const { return note_; }  // the choice, its predicted gain, the corrections
  const scaling::Profile& profile() const { return profile_; }  // what the choice was made on

 private:
  int warmup_, steps_, seen_ = 0;
  std::vector<std::vector<double>> ready_;  // (steps, gradients) since the step's first gradient
  std::vector<double> backward_;            // (steps,) backward as the Reducer saw it
  std::vector<double> comm_;                // (steps,) the allreduces' time, start to end, summed
  std::vector<double> launch_delay_;        // (steps,) StepTiming::launch_delay_s
  std::vector<double> compute_;             // (steps or steps - 1,) finalize() return to the next call
  std::optional<double> last_return_s_;     // the previous step's finalize() return (steady clock)
  scaling::Profile profile_;
  std::string note_;
};

}  // namespace tnt::comm
