// The timeline's event recording, the part that layers, comm and train call: lanes, spans and
// the sink they record into. The recorder behind it (the window, the part files, the merge,
// the GPU lanes) is io/timeline.hpp; the layer-aware backward spans are train/layer_spans.hpp.
// Every hook first asks active(): without a timeline, or outside its window, that is one load
// of the context pointer and one of a flag, and nothing else runs (no clock read, no
// allocation), so a hook costs nothing that can be measured.
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

#include <atomic>
#include <string>
#include <string_view>

namespace tnt::timeline {

// Host threads (compute, communication) and the GPU's streams (gpu_compute: the compute
// stream; gpu_comm: the NCCL stream). The value is the trace's tid.
enum class Lane : int { compute = 1, communication = 2, gpu_compute = 3, gpu_comm = 4 };

// Marks a span whose GPU time is measured too (on a GPU rank).
struct OnDevice {};
inline constexpr OnDevice on_device{};

// What spans record into: the recorder (io/timeline.hpp) is the one implementation; core
// holds it in the runtime context without knowing it.
class Events {
 public:
  virtual ~Events() = default;
  bool recording() const { return recording_.load(std::memory_order_relaxed); }
  // Any thread. t0, t1: detail::now_s() seconds on this rank's clock.
  virtual void add(Lane lane, std::string name, const char* category, double t0, double t1,
                   std::string args = {}) = 0;
  virtual void* device_mark() = 0;  // an event recorded now on the compute stream, or nullptr
  virtual void device_span(Lane lane, std::string name, void* begin, void* end, std::string args) = 0;
  // Events the caller keeps (the NCCL transport's), already complete.
  virtual void device_span_complete(Lane lane, std::string name, void* begin, void* end, std::string args) = 0;
  virtual void readback_begin() = 0;
  virtual void readback_wait() {}  // just before the host waits for the readback
  virtual void readback_end() = 0;

 protected:
  std::atomic<bool> recording_{false};
};

// The sink when one records now, else nullptr.
Events* active();

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
  Events* recorder_;
  Lane lane_ = Lane::compute;
  std::string name_, args_;
  double t0_ = 0;
  void* device_begin_ = nullptr;  // the GPU lane's begin event
};

// The step's one readback, for the GPU lanes' clock: construct just before the work the
// readback waits for is complete (the copy of the step's results), call waiting() just
// before the host waits, destroy just after (see io/timeline_gpu.hpp). Nothing without a
// GPU rank's timeline.
class Readback {
 public:
  Readback() : recorder_(active()) {
    if (recorder_) recorder_->readback_begin();
  }
  void waiting() {
    if (recorder_) recorder_->readback_wait();
  }
  // It may end while an exception unwinds (a failed backward): a device error seen here
  // again is left to that exception, or to the next call that reaches the device.
  ~Readback() {
    if (!recorder_) return;
    try {
      recorder_->readback_end();
    } catch (...) {
    }
  }
  Readback(const Readback&) = delete;
  Readback& operator=(const Readback&) = delete;

 private:
  Events* recorder_;
};

// JSON string contents (quotes, backslashes and control characters escaped).
std::string escape(std::string_view text);

}  // namespace tnt::timeline
