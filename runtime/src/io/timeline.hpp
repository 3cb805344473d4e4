// The timeline recorder behind tarantella/timeline.hpp: the window of steps, this rank's part
// file, the merge into one trace on the master, and the GPU lanes. The hooks that layers, the
// transports and the training step call (spans, lanes) are core/timeline_events.hpp; the
// recorder is what they record into.
#pragma once

#include "core/clock.hpp"
#include "core/timeline_events.hpp"
#include "tarantella/device.hpp"

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

class DeviceEvents;
class GpuLanes;
struct GpuEvent;

// Where a recorder's path and window came from, for its messages; and whether the window
// counts from the first step the recorder sees (TNT_TIMELINE_STEPS unset: a resumed run
// records its own first steps, not steps that an earlier process ran).
struct Origin {
  std::string path_text;                       // e.g. "TNT_TIMELINE='t.json'"; empty: the path quoted
  std::string window_from = "start_timeline";  // "TNT_TIMELINE_STEPS", ...
  bool window_from_first_step = false;
};

class Recorder final : public Events {
 public:
  // Collective over comm: refuses a path that is a directory (every rank alike, nothing
  // written), then aligns the clocks (see the header). window: 1-based, inclusive.
  Recorder(Communicator& comm, std::string path, int64_t first_step, int64_t last_step, Origin origin = {});
  ~Recorder() override;  // removes this rank's part unless it holds events not merged yet
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

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
  void add(Lane lane, std::string name, const char* category, double t0, double t1, std::string args = {}) override;
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
  void* device_mark() override;
  void device_span(Lane lane, std::string name, void* begin, void* end, std::string args) override;
  void device_span_complete(Lane lane, std::string name, void* begin, void* end, std::string args) override;
  void readback_begin() override;
  void readback_wait() override;
  void readback_end() override;
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
  void remove_part();  // this rank's part file, removed and closed (nothing when none is open)
  void gpu_event(GpuEvent e);
  void finish_gpu();  // the window closes: the GPU lanes' last spans placed

  std::string path_, part_path_, host_;
  int rank_ = 0, size_ = 1;
  int64_t first_step_, last_step_;
  double offset_s_ = 0;  // rank 0's clock - this rank's clock
  double origin_s_ = 0;  // rank 0's clock at the start: time 0 of the trace
  std::vector<int64_t> offsets_ns_;  // every rank's offset_s_, in ns, for the trace's otherData
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

}  // namespace tnt::timeline
