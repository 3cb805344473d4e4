#include "train/staging.hpp"

#include "core/device_api.hpp"
#include "tarantella/check.hpp"
#include "tarantella/config.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

namespace tnt::detail {

StagingRing::StagingRing(size_t slots, StagingDevice& device) : device_(device), slots_(slots) {
  TNT_CHECK(slots >= 2, "input staging needs at least 2 slots (one read, one filled), got {}", slots);
  for (Slot& s : slots_) {
    s.copied = device_.create_event();
    s.read = device_.create_event();
  }
}

StagingRing::~StagingRing() {
  // Must not throw: a failed wait leaves the events to the runtime's shutdown.
  try {
    drain();
  } catch (...) {
    return;
  }
  for (Slot& s : slots_) {
    device_.destroy_event(s.copied);
    device_.destroy_event(s.read);
  }
}

size_t StagingRing::begin_fill() {
  const size_t i = next_;
  Slot& s = slots_[i];
  TNT_CHECK(s.state == State::free || s.state == State::released,
            "input staging: slot {} of {} is still {} when the next batch needs it (the ring is too small for "
            "the batches staged ahead)",
            i, slots_.size(), s.state == State::in_use ? "read by a step" : "waiting for its step");
  // The host rewrites the page-locked buffer: the copy that read it must be over.
  if (s.copy_recorded) device_.host_wait(s.copied);
  // The copy stream rewrites the device buffer: after the step that read it.
  if (s.read_recorded) device_.copy_waits(s.read);
  s.copy_recorded = s.read_recorded = false;
  s.state = State::filling;
  next_ = (next_ + 1) % slots_.size();
  return i;
}

void StagingRing::end_fill(size_t slot) {
  Slot& s = slots_.at(slot);
  TNT_CHECK(s.state == State::filling, "input staging: end_fill of slot {}, which is not being filled", slot);
  device_.record_on_copy(s.copied);
  s.copy_recorded = true;
  s.state = State::filled;
  filled_.push_back(slot);
}

size_t StagingRing::hand_over() {
  TNT_CHECK(!filled_.empty(), "input staging: a step asked for a batch, but none is staged");
  const size_t slot = filled_.front();
  filled_.pop_front();
  Slot& s = slots_[slot];
  device_.compute_waits(s.copied);
  s.state = State::in_use;
  return slot;
}

void StagingRing::release(size_t slot) {
  Slot& s = slots_.at(slot);
  TNT_CHECK(s.state == State::in_use, "input staging: release of slot {}, which no step was reading", slot);
  device_.record_on_compute(s.read);
  s.read_recorded = true;
  s.state = State::released;
}

void StagingRing::discard_filled() {
  for (size_t slot : filled_) slots_[slot].state = State::released;
  filled_.clear();
}

void StagingRing::drain() {
  for (Slot& s : slots_) {
    if (s.copy_recorded) device_.host_wait(s.copied);
    if (s.read_recorded) device_.host_wait(s.read);
  }
}

bool pinned_staging_enabled() { return Config::from_env().pinned_staging; }

namespace {

// StagingDevice on a CUDA device, through the device API.
class CudaStagingDevice final : public StagingDevice {
 public:
  explicit CudaStagingDevice(int device) : device_(device) {}
  void* create_event() override { return backend::cuda_event_create(device_); }
  void destroy_event(void* event) override { backend::cuda_event_destroy(event, device_); }
  void record_on_copy(void* event) override { backend::cuda_event_record(event, backend::CudaStream::copy, device_); }
  void record_on_compute(void* event) override {
    backend::cuda_event_record(event, backend::CudaStream::compute, device_);
  }
  void host_wait(void* event) override { backend::cuda_event_synchronize(event, device_); }
  void copy_waits(void* event) override { backend::cuda_stream_wait(backend::CudaStream::copy, event, device_); }
  void compute_waits(void* event) override {
    backend::cuda_stream_wait(backend::CudaStream::compute, event, device_);
  }

 private:
  int device_;
};

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || (a.raw() == b.raw() && a.shape() == b.shape() &&
                                                         a.dtype() == b.dtype() && a.device() == b.device()));
}

}  // namespace

InputStager::InputStager(Device device, size_t slots)
    : device_(device), columns_(slots), has_weights_(slots, false) {
  TNT_CHECK(device.is_cuda(), "input staging is for CUDA devices, not {}", device.str());
  events_ = std::make_unique<CudaStagingDevice>(device.index);
  fence_ = events_->create_event();
  ring_ = std::make_unique<StagingRing>(slots, *events_);
}

InputStager::~InputStager() {
  ring_.reset();  // waits for every copy and every step that read a slot
  for (auto& slot : columns_) {
    for (Column& c : slot) backend::cuda_host_free(c.pinned);
  }
  if (events_) events_->destroy_event(fence_);
}

void InputStager::stage(const Batch& batch) {
  std::vector<Tensor> host = batch.columns;
  const bool weights = batch.sample_weights.defined();
  if (weights) host.push_back(batch.sample_weights);
  const size_t slot = ring_->begin_fill();
  std::vector<Column>& cols = columns_[slot];
  // Columns dropped (a batch with fewer columns than this slot's last, e.g. no sample
  // weights now): their page-locked buffers are freed here, Column does not own them. Their
  // last copy is over (begin_fill waited for it).
  for (size_t i = host.size(); i < cols.size(); ++i) backend::cuda_host_free(cols[i].pinned);
  cols.resize(host.size());
  has_weights_[slot] = weights;
  std::vector<Tensor> sources(host.size());
  bool new_buffers = false;
  for (size_t i = 0; i < host.size(); ++i) {
    Column& c = cols[i];
    c.host = host[i];
    if (!host[i].device().is_cpu()) {
      c.device = Tensor();  // already on a device: used as it is (checked by step_inputs)
      continue;
    }
    // Inputs are contiguous; one that is not is made so (the device copy is contiguous too).
    sources[i] = host[i].memory_format() == MemoryFormat::contiguous ? host[i] : host[i].contiguous();
    if (!c.device.defined() || c.device.shape() != host[i].shape() || c.device.dtype() != host[i].dtype()) {
      c.device = Tensor::empty(host[i].shape(), host[i].dtype(), device_);
      new_buffers = true;
    }
    const size_t bytes = host[i].nbytes();
    if (c.pinned_bytes < bytes) {
      // The slot's last copy is over (begin_fill waited for it): the old buffer can go.
      backend::cuda_host_free(c.pinned);
      c.pinned = nullptr;
      c.pinned_bytes = 0;
      c.pinned = backend::cuda_host_alloc(bytes);
      c.pinned_bytes = bytes;
    }
    if (bytes > 0) std::memcpy(c.pinned, sources[i].raw(), bytes);
  }
  // A device buffer just taken from the caching allocator may have been freed by compute
  // work still queued (the allocator orders reuse by the compute stream alone): the copy
  // stream writes it only after that work.
  if (new_buffers) {
    events_->record_on_compute(fence_);
    events_->copy_waits(fence_);
  }
  for (size_t i = 0; i < host.size(); ++i) {
    Column& c = cols[i];
    if (c.device.defined()) {
      backend::cuda_copy_async(c.device.raw(), c.pinned, c.device.nbytes(), backend::CudaStream::copy, device_.index);
    }
  }
  ring_->end_fill(slot);
}

std::vector<Tensor> InputStager::take(const Batch& batch) {
  TNT_CHECK(!taken_, "input staging: a batch is taken before the step of the last one was queued");
  const size_t slot = ring_->hand_over();
  const std::vector<Column>& cols = columns_[slot];
  const size_t n = batch.columns.size();
  const bool weights = batch.sample_weights.defined();
  bool same = cols.size() == n + (weights ? 1 : 0) && has_weights_[slot] == weights;
  for (size_t i = 0; same && i < n; ++i) same = same_tensor(cols[i].host, batch.columns[i]);
  if (same && weights) same = same_tensor(cols[n].host, batch.sample_weights);
  TNT_CHECK(same, "input staging: the step's batch (global batch {}) is not the one staged first", batch.step);
  taken_ = slot;
  std::vector<Tensor> out;
  for (size_t i = 0; i < cols.size(); ++i) out.push_back(cols[i].device.defined() ? cols[i].device : cols[i].host);
  if (!weights) out.push_back(Tensor());
  return out;
}

void InputStager::step_queued() {
  if (!taken_) return;
  ring_->release(*taken_);
  taken_.reset();
}

}  // namespace tnt::detail

namespace tnt::detail {

void InputStager::end_pass() {
  step_queued();
  ring_->discard_filled();
}

}  // namespace tnt::detail
