// TNT_PROFILE_SCALING=FILE (the launcher's --profile-scaling): after a few warm-up steps,
// the training loop hands each step's phases here; after TNT_PROFILE_SCALING_STEPS steps
// (or at the end of fit, with fewer) every rank measures the allreduce on the spot
// (comm/allreduce_probe) and the master writes the profile the scaling model reads
// (comm/scaling_model.hpp, `tarantella predict`), atomically. Once per process: later fits
// do not profile again.
//
// On a GPU rank the phases are the GPU's: the host only queues a step's kernels (and runs a
// backward ahead of them, Model's early readback), so the loop marks each phase's start on
// the compute stream with a timed event (mark), and each gradient's readiness too
// (gradient_ready); a step's events are read at the next step's end (by then the stream has
// passed them: nothing waits inside a step) and at the profile's end. The step's total and
// the input wait stay host times; `other_s` is then what the GPU spent outside the four
// phases (idle, waiting for the host). On a CPU rank the loop's host times are the phases.
#pragma once

#include "comm/scaling_model.hpp"
#include "io/timeline_gpu.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/reducer.hpp"

#include <array>
#include <memory>
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
  // The step's small collectives outside the buckets (collective()), host time: all of
  // them, and the part of them inside forward_s as the loop measured it.
  double collectives_s = 0;
  double forward_collectives_s = 0;
  int collectives = 0;
  int64_t collective_bytes = 0;
};

class ScalingProfiler {
 public:
  static constexpr int64_t kWarmupSteps = 5;
  // Then steps with all gradients in one bucket, allreduced after backward: their backward
  // is the one without communication beside it (backward_alone_s). Skipped with one rank
  // and while --fusion-threshold auto chooses.
  static constexpr int64_t kAloneSteps = 5;

  // device: where the network trains; on a GPU the phases come from CUDA events on its
  // compute stream. events: a stand-in for those (tests); null on a CPU.
  ScalingProfiler(std::string path, int64_t steps, Device device);
  ScalingProfiler(std::string path, int64_t steps, std::unique_ptr<timeline::DeviceEvents> events);
  ~ScalingProfiler();
  ScalingProfiler(const ScalingProfiler&) = delete;
  ScalingProfiler& operator=(const ScalingProfiler&) = delete;

  // Collective, before training: the master (which writes the profile) makes sure it can
  // create `path`'s temporary file there, so that a path in a missing or read-only directory
  // is refused at the start, not after the profiled steps. Throws InputError on every rank.
  static void check_writable(Communicator& comm, const std::string& path);

  StepPhases phases;  // the step in progress, filled in by the training loop

  // Where a step's phases begin, in order: forward at `start`, backward, the wait for the
  // sums after it (`backward_end`), the step's readback (`reduced`: on a GPU the time to
  // `optimizer` is idle, not a phase), the optimizer; `end` follows it.
  enum Point : int { start, backward, backward_end, reduced, optimizer, end, kPoints };
  // The training loop at each point of every step, and at each gradient's readiness during
  // backward (registration index): an event on the GPU's compute stream while the step
  // counts; nothing on a CPU rank or otherwise.
  void mark(Point point);
  void gradient_ready(size_t index);
  // The training loop after each small collective of a step outside the gradient buckets
  // (the metrics' allreduce after the step, a token-level loss's count in forward): its host
  // seconds and bytes. The profile keeps them apart from the phases (Profile::collectives_s),
  // and the model prices them on the network at every rank count. `in_forward`: timed inside
  // forward_s (taken out of it).
  void collective(double seconds, int64_t bytes, bool in_forward);

  // After each training step, on every rank alike: takes `phases` and that step's
  // reducer.last_step(). Collective once the profile is due (every rank reaches it after
  // the same step).
  void step_done(Reducer& reducer, Communicator& comm, Device device);
  // At the end of fit: writes what there is if not written yet (collective).
  void fit_end(Reducer& reducer, Communicator& comm, Device device);

 private:
  void write(const Reducer& reducer, Communicator& comm, Device device);

  // The GPU's events of one counted step, and where their times go once read.
  struct DeviceStep {
    std::array<void*, kPoints> points{};
    std::vector<void*> ready;  // (gradients,) null where a gradient was not marked
    bool alone = false;        // a one-bucket step: only backward is kept (alone_)
    size_t index = 0;          // into alone_ or phases_/ready_
  };
  bool counting() const { return !done_ && seen_ >= kWarmupSteps; }
  void* event();
  void keep_device_step(bool alone, size_t index);  // after step_done took a counted step
  void read_device_steps(bool all);  // all: also the newest (waits for its end)
  void read(DeviceStep& s);

  std::string path_;
  int64_t wanted_;
  int64_t seen_ = 0;
  bool done_ = false;
  std::vector<StepPhases> phases_;
  StepPhases collectives_;  // the step in progress's collectives (only those fields)
  std::vector<std::vector<double>> ready_;  // (steps, gradients) since backward began
  std::vector<double> comm_;                // (steps,) the allreduces' time, start to end
  std::vector<double> launch_delay_;        // (steps,) StepTiming::launch_delay_s
  std::vector<double> finish_;              // (steps,) StepTiming::finish_s
  std::vector<double> sums_after_;          // (steps,) StepTiming::exposed_s: sums after backward
  std::vector<double> alone_;               // backward of the one-bucket steps
  int64_t alone_left_ = -1;                 // one-bucket steps still to run; -1 before they start
  int64_t threshold_ = 0;                   // the job's own, restored after them
  std::unique_ptr<timeline::DeviceEvents> events_;  // GPU ranks only
  std::vector<void*> free_, all_;                   // the event pool
  DeviceStep recording_;                            // the step in progress
  std::vector<DeviceStep> unread_;                  // counted steps not read yet, oldest first
  void* last_end_ = nullptr;  // the `end` of the step read last (the next one's gap starts there)
};

}  // namespace tnt::detail
