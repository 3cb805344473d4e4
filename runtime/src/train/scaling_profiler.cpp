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
#include <filesystem>
#include <utility>

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

ScalingProfiler::ScalingProfiler(std::string path, int64_t steps, Device device)
    : ScalingProfiler(std::move(path), steps, device.is_cuda() ? timeline::cuda_events(device.index) : nullptr) {}

ScalingProfiler::ScalingProfiler(std::string path, int64_t steps, std::unique_ptr<timeline::DeviceEvents> events)
    : path_(std::move(path)), wanted_(steps), events_(std::move(events)) {
  TNT_INPUT_CHECK(wanted_ >= 1, "TNT_PROFILE_SCALING_STEPS={} must be at least 1", wanted_);
}

void ScalingProfiler::check_writable(Communicator& comm, const std::string& path) {
  std::string error;
  if (comm.is_master()) {
    const std::string tmp = path + ".tmp";  // the name the profile is written under first
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    std::FILE* f = nullptr;
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
      // The rename at the end would replace a directory's entry, a device or a FIFO.
      error = fmt::format("TNT_PROFILE_SCALING (tarantella --profile-scaling): '{}' is not a regular file (a {}); "
                          "the profile is written beside it and renamed into place: give a file's path",
                          path, std::filesystem::is_directory(st) ? "directory" : "device, FIFO or socket");
    } else if ((f = std::fopen(tmp.c_str(), "w")) == nullptr) {
      error = fmt::format("TNT_PROFILE_SCALING (tarantella --profile-scaling): cannot write '{}': {}", path,
                          std::strerror(errno));
    } else {
      std::fclose(f);
      std::remove(tmp.c_str());
    }
  }
  comm.broadcast(error, Communicator::master_rank());
  if (!error.empty()) TNT_INPUT_ERROR("{}", error);
}

ScalingProfiler::~ScalingProfiler() {
  // Destroying an event whose work is still queued is allowed: CUDA frees it when it runs.
  if (events_) {
    for (void* e : all_) events_->destroy(e);
  }
}

void* ScalingProfiler::event() {
  if (free_.empty()) {
    all_.push_back(events_->create());
    free_.push_back(all_.back());
  }
  void* e = free_.back();
  free_.pop_back();
  events_->record(e);
  return e;
}

void ScalingProfiler::mark(Point point) {
  if (!events_ || !counting()) return;
  if (point == start) {  // a step that never ended (it threw) leaves its events to the pool
    for (void*& e : recording_.points) {
      if (e) free_.push_back(std::exchange(e, nullptr));
    }
    for (void*& e : recording_.ready) {
      if (e) free_.push_back(std::exchange(e, nullptr));
    }
  }
  void*& slot = recording_.points[point];
  if (slot) free_.push_back(slot);
  slot = event();
}

void ScalingProfiler::gradient_ready(size_t index) {
  if (!events_ || !counting()) return;
  if (recording_.ready.size() <= index) recording_.ready.resize(index + 1, nullptr);
  if (!recording_.ready[index]) recording_.ready[index] = event();
}

void ScalingProfiler::collective(double seconds, int64_t bytes, bool in_forward) {
  collectives_.collectives_s += seconds;
  if (in_forward) collectives_.forward_collectives_s += seconds;
  collectives_.collectives += 1;
  collectives_.collective_bytes += bytes;
}

// Every step but the newest has been passed by the stream by the time the newest ends (the
// newest's readback waited for its loss, queued after all of them): reading those waits for
// nothing. The newest is read at the profile's end.
void ScalingProfiler::read_device_steps(bool all) {
  const size_t n = all ? unread_.size() : (unread_.empty() ? 0 : unread_.size() - 1);
  for (size_t i = 0; i < n; ++i) read(unread_[i]);
  unread_.erase(unread_.begin(), unread_.begin() + static_cast<std::ptrdiff_t>(n));
}

void ScalingProfiler::read(DeviceStep& s) {
  auto& p = s.points;
  void* last = nullptr;
  for (void* e : p) last = e ? e : last;
  if (last && !events_->complete(last)) events_->synchronize(last);  // only the newest step waits
  auto seconds = [&](void* from, void* to) { return std::max(0.0, events_->elapsed_ms(from, to) * 1e-3); };
  if (s.alone) {
    if (p[backward] && p[backward_end]) alone_[s.index] = seconds(p[backward], p[backward_end]);
  } else if (std::all_of(p.begin(), p.end(), [](void* e) { return e != nullptr; })) {
    StepPhases& ph = phases_[s.index];
    // The host's wait for its batch overlaps the GPU's work on the step before: what the GPU
    // lost to it is its gap between that step's end and this one's start (the first
    // counted step keeps the host's wait). The host's period (input + step) is kept.
    if (last_end_) {
      const double gap = seconds(last_end_, p[start]);
      ph.step_s += ph.input_s - gap;
      ph.input_s = gap;
    }
    // The host's wait in a collective inside forward held the GPU up as long, at most.
    ph.forward_s = std::max(0.0, seconds(p[start], p[backward]) - ph.forward_collectives_s);
    ph.backward_s = seconds(p[backward], p[backward_end]);
    ph.exposed_s = seconds(p[backward_end], p[reduced]);
    ph.optimizer_s = seconds(p[optimizer], p[end]);
    // A device transport's own times end at the last sum (the unpacking after it is not
    // timed there): the rest of the GPU's wait is the host's wake-up and the unpacking.
    finish_[s.index] = std::max(0.0, ph.exposed_s - sums_after_[s.index]);
    // A gradient the backward never reached (its parameter unused) is final at its end.
    std::vector<double>& ready = ready_[s.index];
    for (size_t i = 0; i < ready.size(); ++i) {
      void* e = i < s.ready.size() ? s.ready[i] : nullptr;
      ready[i] = e ? std::min(seconds(p[backward], e), ph.backward_s) : ph.backward_s;
    }
  }
  if (last_end_) free_.push_back(last_end_);
  last_end_ = std::exchange(p[end], nullptr);
  for (void* e : p) {
    if (e) free_.push_back(e);
  }
  for (void* e : s.ready) {
    if (e) free_.push_back(e);
  }
  s = DeviceStep{};
}

void ScalingProfiler::step_done(Reducer& reducer, Communicator& comm, Device device) {
  const StepPhases c = std::exchange(collectives_, StepPhases{});
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
    keep_device_step(true, alone_.size() - 1);
    if (--alone_left_ == 0) reducer.set_threshold(threshold_);
    return;
  }
  phases.collectives_s = c.collectives_s;
  phases.forward_collectives_s = c.forward_collectives_s;
  phases.collectives = c.collectives;
  phases.collective_bytes = c.collective_bytes;
  phases.forward_s = std::max(0.0, phases.forward_s - c.forward_collectives_s);
  phases_.push_back(phases);
  comm_.push_back(reducer.last_step().comm_s());
  launch_delay_.push_back(reducer.last_step().launch_delay_s());
  finish_.push_back(reducer.last_step().finish_s());
  sums_after_.push_back(std::max(0.0, reducer.last_step().exposed_s()));
  // The Reducer's clock starts at the step's first gradient, a little after backward began;
  // its backward end is the finalize() call, where the loop's backward ends too.
  const StepTiming& t = reducer.last_step();
  std::vector<double> ready;
  for (double r : t.gradient_ready_s) ready.push_back(std::clamp(r + phases.backward_s - t.backward_end_s, 0.0, phases.backward_s));
  ready_.push_back(std::move(ready));
  keep_device_step(false, phases_.size() - 1);
  if (static_cast<int64_t>(phases_.size()) >= wanted_) write(reducer, comm, device);
}

void ScalingProfiler::fit_end(Reducer& reducer, Communicator& comm, Device device) {
  if (done_) return;
  if (phases_.empty()) {
    const int64_t ran = seen_;
    // Ended among the one-bucket steps: the fusion threshold goes back, and a later fit of
    // this model starts that phase again (its backward-alone median from whole steps). The
    // GPU's unread steps point into alone_: read first (as write() does), then dropped with
    // it; the last step's end is no gap for the next fit's first step.
    if (alone_left_ > 0) {
      reducer.set_threshold(threshold_);
      if (events_) read_device_steps(true);
      if (last_end_) free_.push_back(std::exchange(last_end_, nullptr));
      alone_left_ = 0;
      alone_.clear();
      seen_ = kWarmupSteps - 1;
    }
    // Before, nothing was written and nothing said: the user found no file.
    const bool alone = comm.size() > 1;
    log_warning("scaling profile: nothing written to '{}' (yet): training ended after {} step(s), and a profile "
                "takes its steps after {} warm-up steps{}; train at least {} steps (more for a profile over "
                "TNT_PROFILE_SCALING_STEPS={})",
                path_, ran, kWarmupSteps, alone ? fmt::format(" and {} with one bucket", kAloneSteps) : "",
                kWarmupSteps + (alone ? kAloneSteps : 0) + 1, wanted_);
    return;
  }
  log_warning("scaling profile: only {} step(s) after {} warm-up steps and {} with one bucket, not {} "
              "(TNT_PROFILE_SCALING_STEPS)",
              phases_.size(), kWarmupSteps, alone_.size(), wanted_);
  write(reducer, comm, device);
}

void ScalingProfiler::keep_device_step(bool alone, size_t index) {
  if (!events_ || !recording_.points[start]) return;
  recording_.alone = alone;
  recording_.index = index;
  unread_.push_back(std::exchange(recording_, DeviceStep{}));
  read_device_steps(false);
}

void ScalingProfiler::write(const Reducer& reducer, Communicator& comm, Device device) {
  if (events_) read_device_steps(true);
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
  // forward_s is already without the collectives inside it: all of them come off the rest.
  p.other_s = median_of(phases_, [](const StepPhases& s) {
    return std::max(0.0, s.step_s - s.forward_s - s.backward_s - s.exposed_s - s.optimizer_s - s.collectives_s);
  });
  p.collectives_s = median_of(phases_, [](const StepPhases& s) { return s.collectives_s; });
  p.collectives = phases_.back().collectives;
  p.collective_bytes = phases_.back().collective_bytes;
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
  if (!error.empty()) throw Error(error);  // a full disk: exit 1, not an input error's 2
  print("scaling profile of {} steps on {} rank(s) written to {}", p.steps, p.ranks, path_);
}

}  // namespace tnt::detail
