// TNT_PROFILE_SCALING=FILE (the launcher's --profile-scaling): after a few warm-up steps,
// the training loop hands each step's phases here; after TNT_PROFILE_SCALING_STEPS steps
// (or at the end of fit, with fewer) every rank measures the allreduce on the spot
// (comm/allreduce_probe) and the master writes the profile the scaling model reads
// (comm/scaling_model.hpp, `tarantella predict`), atomically. Once per process: later fits
// do not profile again.
#pragma once

#include "comm/scaling_model.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/reducer.hpp"

#include <string>
#include <vector>

namespace tnt::detail {

// One training step as the loop measured it (seconds).
struct StepPhases {
  double input_s = 0;     // waiting for the batch
  double forward_s = 0;   // from the step's start to backward (forward, loss)
  double backward_s = 0;  // backward, gradients handed to the Reducer
  double exposed_s = 0;   // finalize(): waiting for the allreduces after backward
  double optimizer_s = 0;
  double step_s = 0;  // the whole step without the input wait (also metrics, callbacks)
  int64_t samples = 0;  // this rank's micro-batch
};

class ScalingProfiler {
 public:
  static constexpr int64_t kWarmupSteps = 5;
  // Then steps with all gradients in one bucket, allreduced after backward: their backward
  // is the one without communication beside it (backward_alone_s). Skipped with one rank
  // and while --fusion-threshold auto chooses.
  static constexpr int64_t kAloneSteps = 5;

  ScalingProfiler(std::string path, int64_t steps);

  StepPhases phases;  // the step in progress, filled in by the training loop

  // After each training step, on every rank alike: takes `phases` and that step's
  // reducer.last_step(). Collective once the profile is due (every rank reaches it after
  // the same step).
  void step_done(Reducer& reducer, Communicator& comm, Device device);
  // At the end of fit: writes what there is if not written yet (collective).
  void fit_end(Reducer& reducer, Communicator& comm, Device device);

 private:
  void write(const Reducer& reducer, Communicator& comm, Device device);

  std::string path_;
  int64_t wanted_;
  int64_t seen_ = 0;
  bool done_ = false;
  std::vector<StepPhases> phases_;
  std::vector<std::vector<double>> ready_;  // (steps, gradients) since backward began
  std::vector<double> comm_;                // (steps,) the allreduces' time, start to end
  std::vector<double> launch_delay_;        // (steps,) StepTiming::launch_delay_s
  std::vector<double> finish_;              // (steps,) StepTiming::finish_s
  std::vector<double> alone_;               // backward of the one-bucket steps
  int64_t alone_left_ = -1;                 // one-bucket steps still to run; -1 before they start
  int64_t threshold_ = 0;                   // the job's own, restored after them
};

}  // namespace tnt::detail
