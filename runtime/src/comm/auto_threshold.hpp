// --fusion-threshold auto (TNT_FUSION_THRESHOLD=auto): the Reducer's choice of threshold from
// its own first steps. After `warmup` steps it keeps the ready time of every gradient for
// `steps` steps; then, collectively, the allreduce is measured on the spot
// (comm/allreduce_probe), the master's median ready times are broadcast, the scaling model
// (comm/scaling_model) predicts backward plus the wait for the allreduces at every candidate
// threshold, and the master's pick is broadcast, so that every rank makes the same plan.
// A candidate must beat the current threshold by kMinGain to be taken: the model's error
// on a loaded machine is a few percent, and a change of plan on noise gains nothing.
#pragma once

#include "tarantella/comm.hpp"
#include "tarantella/reducer.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tnt::comm {

class AutoThreshold {
 public:
  static constexpr double kMinGain = 0.02;

  AutoThreshold(int warmup, int steps);

  // After each step (`timing`: its StepTiming). Returns the threshold to use from now on at
  // the step where the choice is made (collective then), else nullopt.
  std::optional<int64_t> step_done(const StepTiming& timing, const std::vector<int64_t>& gradient_bytes,
                                   int64_t current, Communicator& comm, Device device);
  const std::string& note() const { return note_; }  // the choice and its predicted gain

 private:
  int warmup_, steps_, seen_ = 0;
  std::vector<std::vector<double>> ready_;  // (steps, gradients) seconds before backward ended
  std::vector<double> backward_;            // (steps,) backward as the Reducer saw it
  std::string note_;
};

}  // namespace tnt::comm
