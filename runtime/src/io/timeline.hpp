// The timeline recorder behind tarantella/timeline.hpp, and the hooks the training step and
// the transports call. Every hook first asks active(): without a timeline, or outside its
// window, that is one load of the context pointer and one of a flag, and nothing else runs
// (no clock read, no allocation), so a hook costs nothing that can be measured.
//
//   timeline::Span span(timeline::Lane::compute, "forward");   // a complete event, RAII
//   timeline::Span span(timeline::Lane::communication, "allreduce", [&] { return args; });
//
// Events: Chrome's complete events ("ph": "X"), ts and dur in microseconds on rank 0's clock
// (see tarantella/timeline.hpp), pid = rank, tid = the lane. Each event's args carry the
// step it belongs to; a hook may add more (a JSON object's members, without braces).
//
// On a rank that trains on a GPU, spans marked on_device also measure the GPU's time and
// appear on the lanes "GPU compute" and "GPU comm" (io/timeline_gpu.hpp says how):
//   timeline::Span span(timeline::Lane::compute, "forward", timeline::on_device);
// Without a GPU those spans are host spans like the others: a CPU run's trace is unchanged.
#pragma once

#include "core/clock.hpp"
#include "tarantella/device.hpp"
#include "tarantella/layer.hpp"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace tnt {
class Communicator;
}

namespace tnt::timeline {

// Host threads (compute, communication) and the GPU's streams (gpu_compute: the compute
// stream; gpu_comm: the NCCL stream). The value is the trace's tid.
enum class Lane : int { compute = 1, communication = 2, gpu_compute = 3, gpu_comm = 4 };

class DeviceEvents;
class GpuLanes;
struct GpuEvent;

// Marks a span whose GPU time is measured too (on a GPU rank).
struct OnDevice {};
inline constexpr OnDevice on_device{};

// Where a recorder's path and window came from, for its messages; and whether the window
// counts from the first step the recorder sees (TNT_TIMELINE_STEPS unset: a resumed run
// records its own first steps, not steps that an earlier process ran).
struct Origin {
  std::string path_text;                       // e.g. "TNT_TIMELINE='t.json'"; empty: the path quoted
  std::string window_from = "start_timeline";  // "TNT_TIMELINE_STEPS", ...
  bool window_from_first_step = false;
};

class Recorder {
 public:
  // Collective over comm: refuses a path that is a directory (every rank alike, nothing
  // written), then aligns the clocks (see the header). window: 1-based, inclusive.
  Recorder(Communicator& comm, std::string path, int64_t first_step, int64_t last_step, Origin origin = {});
  ~Recorder();  // removes this rank's part unless it holds events not merged yet
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  bool recording() const { return recording_.load(std::memory_order_relaxed); }
  const std::string& path() const { return path_; }

  // The training loop: step `step` (1-based) of `epoch` (0-based) begins, its batch in hand
  // since now (waited for since input_start_s). Opens or closes the window, appends the
  // events before to this rank's part, and records the input wait when in the window.
  // device: where the model trains; on a CUDA device the GPU lanes start with the window.
  void step_begin(int64_t step, int epoch, double input_start_s, Device device = Device::cpu());
  // The epoch's training steps are done (before validation and the callbacks that write
  // history.csv): appends the events so far to the part, so that a run killed after a history
  // row has that epoch's steps on disk.
  void epoch_end() { flush_part(); }
  // Any thread. t0, t1: detail::now_s() seconds on this rank's clock.
  void add(Lane lane, std::string name, const char* category, double t0, double t1, std::string args = {});
  // Collective: every rank's events to the master, which writes path(); the parts are removed.
  void merge(Communicator& comm);
  bool has_unmerged() const { return unmerged_; }
  // The window (moved to the first step seen when it counts from there).
  int64_t first_step() const { return first_step_; }
  int64_t last_step() const { return last_step_; }
  int64_t first_step_seen() const { return first_step_seen_; }  // the lowest step begun (0: none)
  int64_t last_step_seen() const { return last_step_seen_; }    // the highest step begun (0: none)
  // Master only, once: nothing recorded although steps ran (a window not reached yet, or
  // passed before this run began), named with this run's steps and what chose the window.
  void warn_if_window_missed();

  // The GPU lanes (io/timeline_gpu.hpp); nothing when this rank trains on no GPU.
  bool on_gpu() const { return gpu_ != nullptr; }
  // Tests: the GPU lanes from these events (fakes) instead of CUDA's.
  void use_device_events(std::unique_ptr<DeviceEvents> events);
  void* device_mark();  // an event recorded now on the compute stream, or nullptr
  void device_span(Lane lane, std::string name, void* begin, void* end, std::string args);
  // Events the caller keeps (the NCCL transport's), already complete.
  void device_span_complete(Lane lane, std::string name, void* begin, void* end, std::string args);
  void readback_begin();
  void readback_end();
  GpuLanes* gpu_lanes() { return gpu_.get(); }

 private:
  struct Event {
    Lane lane;
    std::string name;
    const char* category;
    double t0, t1;
    int64_t step;
    std::string args;
  };
  void format(const Event& e, std::string& out) const;  // appends one line
  void flush_part();  // pending_ -> the part file
  void gpu_event(GpuEvent e);
  void finish_gpu();  // the window closes: the GPU lanes' last spans placed

  std::string path_, part_path_, host_;
  int rank_ = 0, size_ = 1;
  int64_t first_step_, last_step_;
  double offset_s_ = 0;  // rank 0's clock - this rank's clock
  double origin_s_ = 0;  // rank 0's clock at the start: time 0 of the trace
  std::atomic<bool> recording_{false};
  std::atomic<int64_t> step_{0};
  std::mutex mu_;
  std::vector<Event> pending_;  // not yet in the part file
  std::string events_;          // every formatted event of this rank (for the merge)
  std::FILE* part_ = nullptr;
  bool part_failed_ = false;  // this rank cannot write its part (not the master): memory only
  bool unmerged_ = false;
  Origin origin_;
  bool recorded_ = false;  // a step of the window has begun
  bool warned_ = false;
  int64_t first_step_seen_ = 0, last_step_seen_ = 0;
  std::unique_ptr<GpuLanes> gpu_;
  std::string gpu_metadata_;  // the GPU lanes' names, written with the next events
};

// The recorder when one records now, else nullptr.
Recorder* active();
// The recorder when one exists (recording or not), else nullptr.
Recorder* current();

// The training loop's hooks (nothing without a timeline). step_begin: see Recorder. start:
// collective, TNT_TIMELINE from the configuration at the start of fit() (once); `path`, when
// given, instead of TNT_TIMELINE's (a parameter server's trace beside its workers').
void start_from_config(Communicator& comm, const std::string& path = {});
void step_begin(int64_t step, int epoch, double input_start_s, Device device = Device::cpu());
void epoch_end();
// Collective, at the end of fit(): merges when anything new was recorded.
void fit_end(Communicator& comm);
// Every rank alike: lets the recorder go without writing its file (a window that training
// has not reached: an empty trace would say nothing). Its parts are removed.
void discard();

// A complete event from construction to destruction, on this thread's lane.
class Span {
 public:
  Span(Lane lane, std::string_view name) : recorder_(active()) {
    if (recorder_) begin(lane, name, {});
  }
  // args: a callable returning the args' JSON members, called only when recording.
  template <typename F>
  Span(Lane lane, std::string_view name, F&& args) : recorder_(active()) {
    if (recorder_) begin(lane, name, args());
  }
  // Also on the GPU lane (on a GPU rank; see the top of the file).
  Span(Lane lane, std::string_view name, OnDevice) : recorder_(active()) {
    if (recorder_) begin(lane, name, {}, true);
  }
  template <typename F>
  Span(Lane lane, std::string_view name, OnDevice, F&& args) : recorder_(active()) {
    if (recorder_) begin(lane, name, args(), true);
  }
  ~Span() {
    if (recorder_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  void begin(Lane lane, std::string_view name, std::string args, bool device = false);
  void end();
  Recorder* recorder_;
  Lane lane_ = Lane::compute;
  std::string name_, args_;
  double t0_ = 0;
  void* device_begin_ = nullptr;  // the GPU lane's begin event
};

// The step's one readback, for the GPU lanes' clock: construct just before it, destroy just
// after (see io/timeline_gpu.hpp). Nothing without a GPU rank's timeline.
class Readback {
 public:
  Readback() : recorder_(active()) {
    if (recorder_) recorder_->readback_begin();
  }
  ~Readback() {
    if (recorder_) recorder_->readback_end();
  }
  Readback(const Readback&) = delete;
  Readback& operator=(const Readback&) = delete;

 private:
  Recorder* recorder_;
};

// Backward per layer, from the gradient hook: the span of a layer ends when its gradients
// are final and starts where the previous one ended (so it includes the parameter-free
// layers before it, in backward order). params: the hook's indices' parameters, named
// "<layer>.<param>".
class LayerSpans {
 public:
  explicit LayerSpans(const std::vector<NamedParameter>* params) : recorder_(active()), params_(params) {
    if (recorder_) {
      last_ = detail::now_s();
      last_device_ = recorder_->device_mark();
    }
  }
  ~LayerSpans();
  LayerSpans(const LayerSpans&) = delete;
  LayerSpans& operator=(const LayerSpans&) = delete;
  void gradient_ready(size_t index) {
    if (recorder_) mark(index);
  }

 private:
  void mark(size_t index);
  Recorder* recorder_;
  const std::vector<NamedParameter>* params_;
  std::string last_layer_;
  double last_ = 0;
  void* last_device_ = nullptr;  // where the next layer's GPU span begins
};

// JSON string contents (quotes, backslashes and control characters escaped).
std::string escape(std::string_view text);

}  // namespace tnt::timeline
