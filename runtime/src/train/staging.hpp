// Input staging on CUDA: batches reach the device while the step before them computes.
//
// A batch is built on the host. Tensor::to(device) would copy it from ordinary (pageable)
// memory and wait for the copy, with the compute stream idle. Instead Model's batch source
// stages the NEXT batch before it hands out the current one: its columns are copied into
// page-locked host buffers and queued to the device on the copy stream, so the copy runs
// while the current step computes; the step then makes the compute stream wait for that
// copy's event (no host wait) before anything reads the inputs.
//
// The buffers form a ring of slots (3: one read by the step being queued, one being filled,
// one whose step may still run on the device). A slot is refilled only when it is safe:
//   - its page-locked host buffer is rewritten by the host, so the host waits for the slot's
//     last copy (long done in practice: it was two batches ago);
//   - its device buffer is rewritten by the copy stream, so the copy stream waits (an event,
//     no host wait) for the compute that read it, recorded once that step was queued.
// The slots' order and these rules are StagingRing, plain host logic over StagingDevice,
// which tests drive with fake events; InputStager adds the buffers and the copies.
//
// TNT_PINNED_STAGING=0 turns staging off (inputs then go by Tensor::to, as before), so that
// the two can be compared; results are bitwise the same either way (the same bytes arrive).
#pragma once

#include "tarantella/dataset.hpp"
#include "tarantella/device.hpp"
#include "tarantella/tensor.hpp"

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

namespace tnt::detail {

// What the ring asks of the device. Events are opaque handles.
class StagingDevice {
 public:
  virtual ~StagingDevice() = default;
  virtual void* create_event() = 0;
  virtual void destroy_event(void* event) = 0;
  virtual void record_on_copy(void* event) = 0;     // after the work queued on the copy stream
  virtual void record_on_compute(void* event) = 0;  // after the work queued on the compute stream
  virtual void host_wait(void* event) = 0;          // the host waits for the event's work
  virtual void copy_waits(void* event) = 0;         // later copy-stream work waits for it
  virtual void compute_waits(void* event) = 0;      // later compute-stream work waits for it
};

class StagingRing {
 public:
  // free: never used; filling: begin_fill gave it out; filled: its copies are queued;
  // in_use: handed to a step; released: that step is queued (its compute event recorded).
  enum class State { free, filling, filled, in_use, released };

  StagingRing(size_t slots, StagingDevice& device);
  ~StagingRing();  // waits for every recorded event (the buffers may be freed after)
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  size_t slots() const { return slots_.size(); }
  State state(size_t slot) const { return slots_.at(slot).state; }

  // The next slot in round-robin order, made safe to rewrite (see the top of the file). A
  // slot still handed to a step, or filled and not yet handed, cannot be refilled: that is
  // a ring too small for the lookahead, a TNT_CHECK naming the slot.
  size_t begin_fill();
  void end_fill(size_t slot);  // its copies are queued: records the copy event
  // The oldest filled slot (batches are read in the order they were staged): the compute
  // stream waits for its copy; the step may then read it.
  size_t hand_over();
  void release(size_t slot);  // the step that read it is queued: records the compute event
  // The filled slots no step will read (a pass ended with batches staged ahead): free to
  // refill once their copies are over.
  void discard_filled();
  void drain();  // the host waits for every recorded event

 private:
  struct Slot {
    State state = State::free;
    void* copied = nullptr;  // recorded on the copy stream after the slot's copies
    void* read = nullptr;    // recorded on the compute stream after the step that read it
    bool copy_recorded = false;
    bool read_recorded = false;
  };
  StagingDevice& device_;
  std::vector<Slot> slots_;
  std::deque<size_t> filled_;  // filled slots, oldest first
  size_t next_ = 0;
};

// Whether Model stages inputs on CUDA: TNT_PINNED_STAGING (a Config knob, default on), read
// through the configuration table again at each fit and evaluate so that one process can
// compare both ways; a bad value is an InputError naming the variable and the value.
bool pinned_staging_enabled();

// The ring with its buffers on one CUDA device: for each slot and column a page-locked host
// buffer and a device tensor (kept across batches of the same shape and dtype).
class InputStager {
 public:
  explicit InputStager(Device device, size_t slots = 3);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;

  // Queues the batch's host columns (and Batch::sample_weights) to the device on the copy
  // stream. Columns already on the device are left as they are.
  void stage(const Batch& batch);
  // The device copies of the oldest staged batch, which must be `batch` (checked by its host
  // columns): columns in order, then the sample weights (undefined when none). The compute
  // stream waits for their copy.
  std::vector<Tensor> take(const Batch& batch);
  // The step that read the last taken batch is queued (its slot may be refilled once it ran).
  void step_queued();
  // The pass is over: the last step is queued, and batches staged ahead will not be read.
  void end_pass();

 private:
  struct Column {
    Tensor host;           // the batch's own column (identifies the batch in take)
    Tensor device;         // undefined: the column was on the device already
    void* pinned = nullptr;
    size_t pinned_bytes = 0;
  };
  Device device_;
  std::unique_ptr<StagingDevice> events_;
  std::vector<std::vector<Column>> columns_;  // per slot
  std::vector<bool> has_weights_;             // per slot: the last column is the sample weights
  void* fence_ = nullptr;  // orders the copy stream after the compute stream (new device buffers)
  std::unique_ptr<StagingRing> ring_;  // declared last: destroyed (drained) before the buffers
  std::optional<size_t> taken_;
};

}  // namespace tnt::detail
