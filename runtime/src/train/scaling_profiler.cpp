#include "train/scaling_profiler.hpp"

#include "comm/allreduce_probe.hpp"
#include "comm/auto_threshold.hpp"
#include "tarantella/check.hpp"
#include "tarantella/config.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tnt::detail {

namespace {

using comm::scaling::median;

template <typename F>
double median_of(const std::vector<StepPhases>& phases, F field) {
  std::vector<double> v;
  for (const StepPhases& p : phases) v.push_back(field(p));
  return median(v);
}

}  // namespace

ScalingProfiler::ScalingProfiler(std::string path, int64_t steps) : path_(std::move(path)), wanted_(steps) {
  TNT_INPUT_CHECK(wanted_ >= 1, "TNT_PROFILE_SCALING_STEPS={} must be at least 1", wanted_);
}

void ScalingProfiler::step_done(Reducer& reducer, Communicator& comm, Device device) {
  if (done_) return;
  if (++seen_ < kWarmupSteps) return;
  if (seen_ == kWarmupSteps) {
    // Every rank decides alike: the same size, the same auto state.
    alone_left_ = comm.size() > 1 && reducer.num_gradients() > 0 && !reducer.choosing_threshold() ? kAloneSteps : 0;
    if (alone_left_ > 0) {
      threshold_ = reducer.threshold_bytes();
      int64_t total = 0;
      for (int64_t b : reducer.gradient_bytes()) total += b;
      reducer.set_threshold(std::max<int64_t>(total, 1));
    }
    return;
  }
  if (alone_left_ > 0) {
    alone_.push_back(phases.backward_s);
    if (--alone_left_ == 0) reducer.set_threshold(threshold_);
    return;
  }
  phases_.push_back(phases);
  comm_.push_back(reducer.last_step().comm_s());
  launch_delay_.push_back(reducer.last_step().launch_delay_s());
  finish_.push_back(reducer.last_step().finish_s());
  // The Reducer's clock starts at the step's first gradient, a little after backward began;
  // its backward end is the finalize() call, where the loop's backward ends too.
  const StepTiming& t = reducer.last_step();
  std::vector<double> ready;
  for (double r : t.gradient_ready_s) ready.push_back(std::clamp(r + phases.backward_s - t.backward_end_s, 0.0, phases.backward_s));
  ready_.push_back(std::move(ready));
  if (static_cast<int64_t>(phases_.size()) >= wanted_) write(reducer, comm, device);
}

void ScalingProfiler::fit_end(Reducer& reducer, Communicator& comm, Device device) {
  if (done_ || phases_.empty()) return;
  log_warning("scaling profile: only {} step(s) after {} warm-up steps and {} with one bucket, not {} "
              "(TNT_PROFILE_SCALING_STEPS)",
              phases_.size(), kWarmupSteps, alone_.size(), wanted_);
  write(reducer, comm, device);
}

void ScalingProfiler::write(const Reducer& reducer, Communicator& comm, Device device) {
  done_ = true;
  comm::scaling::Profile p;
  p.ranks = comm.size();
  const int local = std::max(1, comm.local_size());
  // A job with a different rank count per host is described as one rank per node: the
  // model then charges every step of the ring to the inter-node link.
  p.ranks_per_node = p.ranks % local == 0 ? local : 1;
  p.nodes = p.ranks / p.ranks_per_node;
  p.device = device.str();
  p.transport = device.is_cuda() ? "nccl" : (config().allreduce_algo.empty() ? "ring" : config().allreduce_algo);
  p.steps = static_cast<int>(phases_.size());
  p.threshold_bytes = reducer.threshold_bytes();
  p.samples_per_rank = std::max<int64_t>(1, phases_.back().samples);
  p.input_s = median_of(phases_, [](const StepPhases& s) { return s.input_s; });
  p.forward_s = median_of(phases_, [](const StepPhases& s) { return s.forward_s; });
  p.backward_s = median_of(phases_, [](const StepPhases& s) { return s.backward_s; });
  p.optimizer_s = median_of(phases_, [](const StepPhases& s) { return s.optimizer_s; });
  p.exposed_comm_s = median_of(phases_, [](const StepPhases& s) { return s.exposed_s; });
  p.backward_alone_s = median(alone_);
  p.comm_s = comm.size() > 1 ? median(comm_) : 0;
  p.launch_delay_s = comm.size() > 1 ? median(launch_delay_) : 0;
  p.finish_s = comm.size() > 1 ? median(finish_) : 0;
  p.other_s = median_of(phases_, [](const StepPhases& s) {
    return std::max(0.0, s.step_s - s.forward_s - s.backward_s - s.exposed_s - s.optimizer_s);
  });
  p.step_s = median_of(phases_, [](const StepPhases& s) { return s.input_s + s.step_s; });
  // Every rank's input + forward + backward of every step (the spread across ranks is what
  // makes the slowest one late: the model's straggle term), gathered as auto gathers its own.
  {
    std::vector<double> mine;
    for (const StepPhases& s : phases_) mine.push_back(s.input_s + s.forward_s + s.backward_s);
    p.compute_samples_s = comm::gather_every_rank(comm, mine);
  }
  // Ranks' ready times differ a little; the master's are written.
  if (comm.size() > 1) {
    int64_t total = 0;
    for (int64_t b : reducer.gradient_bytes()) total += b;
    p.allreduce = comm::measure_allreduce(comm, device, total);
  }

  std::string error;
  if (comm.is_master()) {
    const std::vector<int64_t> sizes = reducer.gradient_bytes();
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<double> r;
      for (const auto& step : ready_) r.push_back(step[i]);
      p.gradients.push_back({reducer.gradient_names()[i], sizes[i], median(r)});
    }
    const std::string text = comm::scaling::profile_to_json(p);
    const std::string tmp = path_ + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    bool ok = f != nullptr;
    if (ok) {
      ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
      ok = (std::fclose(f) == 0) && ok;
    }
    if (ok) ok = std::rename(tmp.c_str(), path_.c_str()) == 0;
    if (!ok) {
      error = fmt::format("TNT_PROFILE_SCALING: cannot write '{}': {}", path_, std::strerror(errno));
      std::remove(tmp.c_str());
    }
  }
  comm.broadcast(error, Communicator::master_rank());
  if (!error.empty()) TNT_INPUT_ERROR("{}", error);
  print("scaling profile of {} steps on {} rank(s) written to {}", p.steps, p.ranks, path_);
}

}  // namespace tnt::detail
