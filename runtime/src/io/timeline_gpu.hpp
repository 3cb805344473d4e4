// The timeline's GPU lanes: what the device did, from CUDA events, on the host's clock.
//
// Host spans say when the training thread queued work; on a GPU that is not when it ran
// (a bf16 ResNet-50 step queues its forward in ~13 ms of host time whatever the GPU does).
// While a timeline records on a rank that trains on a GPU:
//   - each step begins with a reference event R on the compute stream (step_begin);
//   - a span marked on the device records a timed event where it begins and one where it
//     ends, on the compute stream, from a pool (mark); the Reducer's NCCL transport hands
//     over the events it records anyway around each bucket's allreduce on the NCCL stream
//     (add_complete, after its wait for the buckets);
//   - nothing waits for these events inside a step. At the step's one readback the host
//     waits for the copy of the step's results anyway (queued after the loss, Model's
//     train_step; after everything with the loss scaler): an anchor event A recorded just
//     before that copy has run by the time the readback returns, so the host clock read
//     then is an upper bound of when A ran (too late by the copy and the wake-up:
//     microseconds). Where A had run before the host even began to wait (the host queued
//     the backward more slowly than the GPU ran the forward), the moment the host was about
//     to wait bounds it if that came within kTightS of A's record; else this readback
//     gives no bound. Then
//         host(R) = host_after_readback - elapsed(R, A)
//     (never before the host queued R, nor before the end of any span of an earlier step
//     as already placed: each anchor has its own slack, and a step runs after the one
//     before it). Every event e of the step then lands at host(R) + elapsed(R, e). An event not complete yet (the optimizer's, queued after the
//     readback) waits for a later anchor; when the window closes the host waits once, for
//     an anchor after everything (outside every recorded step).
// Events of one rank's GPU lanes are exact relative to each other (the GPU's clock); their
// place on the host lanes is off by the anchor's slack.
//
// The logic is pure over DeviceEvents (CUDA's events in CUDA builds: cuda_events; tests
// give a fake with chosen times), so core/io need no CUDA header.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tnt::timeline {

enum class Lane : int;  // io/timeline.hpp

// Timed events on one device. record: on its compute stream.
class DeviceEvents {
 public:
  virtual ~DeviceEvents() = default;
  virtual void* create() = 0;
  virtual void destroy(void* event) = 0;
  virtual void record(void* event) = 0;
  virtual bool complete(void* event) = 0;  // never waits
  virtual void synchronize(void* event) = 0;  // the host waits
  virtual double elapsed_ms(void* from, void* to) = 0;  // both complete
};

// CUDA's events on `device` through core/device_api.hpp (throws in CPU-only builds).
std::unique_ptr<DeviceEvents> cuda_events(int device);

// host(R) from an anchor known complete at host_after_s, elapsed(R, A) = anchor_ms, and the
// host time R was queued (R cannot have run before it was queued).
double reference_host_s(double host_after_s, double anchor_ms, double ref_queued_s);

// A span placed on the host clock: what the recorder writes.
struct GpuEvent {
  Lane lane;
  std::string name;
  int64_t step;
  double t0, t1;  // host seconds (detail::now_s)
  std::string args;
};

class GpuLanes {
 public:
  using Sink = std::function<void(GpuEvent)>;
  explicit GpuLanes(std::unique_ptr<DeviceEvents> events);
  ~GpuLanes();
  GpuLanes(const GpuLanes&) = delete;
  GpuLanes& operator=(const GpuLanes&) = delete;

  // Step `step` begins (queued at host time now_s): records its reference event.
  void step_begin(int64_t step, double now_s);
  // A pooled event recorded now on the compute stream; nullptr before the first step.
  void* mark();
  // A span between two events of mark() (owned from here on). end == nullptr: the span is
  // dropped and begin goes back to the pool.
  void add(Lane lane, std::string name, void* begin, void* end, std::string args);
  // A span between two complete events that stay the caller's (it records them again next
  // step): measured now against the current step's reference; dropped (counted) if either
  // is not complete.
  void add_complete(Lane lane, std::string name, void* begin, void* end, std::string args);
  // Around the step's readback: the anchor (recorded at host time now_s; NaN: unknown),
  // the moment the host is about to wait (now_s), then what is complete goes to `sink`.
  // An anchor already complete when the host is about to wait ran somewhere between its
  // record and that moment: a bound only when that stretch is short (kTightS), else none
  // (its spans wait for a later anchor).
  void readback_begin(double now_s = std::numeric_limits<double>::quiet_NaN());
  void readback_wait(double now_s);
  void readback_end(double now_s, const Sink& sink);
  static constexpr double kTightS = 50e-6;
  // The window closes: waits for everything recorded, then places it.
  void finish(const std::function<double()>& now_s, const Sink& sink);

  bool idle() const;                       // nothing left to place
  size_t events_made() const { return made_; }  // the pool's size (tests)
  size_t dropped() const { return dropped_; }   // spans that could not be measured

 private:
  struct Ref {
    int64_t step;
    void* event;
    double queued_s;
    double host_s;  // NaN until an anchor places it
  };
  struct Pending {
    Lane lane;
    std::string name;
    int64_t step;
    std::string args;
    void* begin = nullptr;  // pooled events, until measured
    void* end = nullptr;
    double begin_ms = 0, end_ms = 0;  // from the step's reference, once measured
    bool measured = false;
  };
  void* take();
  void give(void* event);
  Ref* ref_of(int64_t step);
  void anchor_locked(void* anchor, double host_after_s);
  void place_locked(const Sink& sink);

  std::unique_ptr<DeviceEvents> ev_;
  mutable std::mutex mu_;
  std::vector<void*> free_;
  std::vector<void*> all_;
  std::deque<Ref> refs_;  // oldest first; the last is the current step's
  std::vector<Pending> pending_;
  void* anchor_ = nullptr;
  double anchor_at_s_ = 0;  // host time of the anchor's record (NaN: unknown)
  bool anchor_early_ = false;  // complete before the host waited
  double waited_s_ = 0;     // when the host was about to wait
  double placed_end_s_ = -1e300;  // the latest end of a span of a placed step
  size_t made_ = 0, dropped_ = 0;
};

}  // namespace tnt::timeline
