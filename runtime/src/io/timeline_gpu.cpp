// The timeline's GPU lanes (io/timeline_gpu.hpp): a pool of timed events, each step's
// reference, and the placing of measured spans on the host clock at the step's readback.
#include "io/timeline_gpu.hpp"

#include "core/device_api.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tnt::timeline {

namespace {

class CudaEvents final : public DeviceEvents {
 public:
  explicit CudaEvents(int device) : device_(device) {}
  void* create() override { return backend::cuda_timed_event_create(device_); }
  void destroy(void* event) override { backend::cuda_event_destroy(event, device_); }
  void record(void* event) override { backend::cuda_event_record(event, backend::CudaStream::compute, device_); }
  bool complete(void* event) override { return backend::cuda_event_query(event, device_); }
  void synchronize(void* event) override { backend::cuda_event_synchronize(event, device_); }
  double elapsed_ms(void* from, void* to) override { return backend::cuda_event_elapsed_ms(from, to, device_); }

 private:
  int device_;
};

constexpr double kUnplaced = std::numeric_limits<double>::quiet_NaN();

}  // namespace

std::unique_ptr<DeviceEvents> cuda_events(int device) { return std::make_unique<CudaEvents>(device); }

double reference_host_s(double host_after_s, double anchor_ms, double ref_queued_s) {
  return std::max(host_after_s - anchor_ms * 1e-3, ref_queued_s);
}

GpuLanes::GpuLanes(std::unique_ptr<DeviceEvents> events) : ev_(std::move(events)) {}

GpuLanes::~GpuLanes() {
  // Destroying an event whose work is still queued is allowed: CUDA frees it when it runs.
  for (void* e : all_) ev_->destroy(e);
}

void* GpuLanes::take() {
  if (!free_.empty()) {
    void* e = free_.back();
    free_.pop_back();
    return e;
  }
  void* e = ev_->create();
  all_.push_back(e);
  ++made_;
  return e;
}

void GpuLanes::give(void* event) {
  if (event) free_.push_back(event);
}

GpuLanes::Ref* GpuLanes::ref_of(int64_t step) {
  for (Ref& r : refs_) {
    if (r.step == step) return &r;
  }
  return nullptr;
}

void GpuLanes::step_begin(int64_t step, double now_s) {
  std::lock_guard<std::mutex> lk(mu_);
  void* r = take();
  ev_->record(r);
  refs_.push_back({step, r, now_s, kUnplaced});
}

void* GpuLanes::mark() {
  std::lock_guard<std::mutex> lk(mu_);
  if (refs_.empty()) return nullptr;
  void* e = take();
  ev_->record(e);
  return e;
}

void GpuLanes::add(Lane lane, std::string name, void* begin, void* end, std::string args) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!begin || !end || refs_.empty()) {
    give(begin);
    give(end);
    return;
  }
  Pending p{lane, std::move(name), refs_.back().step, std::move(args)};
  p.begin = begin;
  p.end = end;
  pending_.push_back(std::move(p));
}

void GpuLanes::add_complete(Lane lane, std::string name, void* begin, void* end, std::string args) {
  std::lock_guard<std::mutex> lk(mu_);
  if (refs_.empty()) return;
  const Ref& r = refs_.back();
  // The caller has waited for `end` (and `begin` comes before it on its stream); the
  // reference is before both on the compute stream, which the NCCL stream waited for. A
  // caller that breaks this loses the span rather than making the step wait.
  if (!ev_->complete(end) || !ev_->complete(begin) || !ev_->complete(r.event)) {
    ++dropped_;
    return;
  }
  Pending p{lane, std::move(name), r.step, std::move(args)};
  p.begin_ms = ev_->elapsed_ms(r.event, begin);
  p.end_ms = ev_->elapsed_ms(r.event, end);
  p.measured = true;
  pending_.push_back(std::move(p));
}

void GpuLanes::readback_begin(double now_s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (refs_.empty()) return;
  give(anchor_);
  anchor_ = take();
  ev_->record(anchor_);
  anchor_at_s_ = now_s;
  anchor_early_ = false;
}

void GpuLanes::readback_wait(double now_s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!anchor_) return;
  anchor_early_ = ev_->complete(anchor_);
  waited_s_ = now_s;
}

void GpuLanes::readback_end(double now_s, const Sink& sink) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!anchor_) return;
  // A readback that did not wait (nothing to read) leaves the anchor running: no bound
  // from it, and the spans wait for a later one. An anchor that had run before the host
  // was about to wait (the host queued a backward after it, slower than the GPU ran it)
  // is bounded by that moment, if it was soon enough after the record to be exact.
  if (ev_->complete(anchor_)) {
    if (!anchor_early_) {
      anchor_locked(anchor_, now_s);
    } else if (!std::isnan(anchor_at_s_) && waited_s_ - anchor_at_s_ <= kTightS) {
      anchor_locked(anchor_, waited_s_);
    }
  }
  anchor_early_ = false;
  give(anchor_);
  anchor_ = nullptr;
  place_locked(sink);
}

void GpuLanes::finish(const std::function<double()>& now_s, const Sink& sink) {
  std::lock_guard<std::mutex> lk(mu_);
  if (refs_.empty() && pending_.empty()) return;
  give(anchor_);
  anchor_ = nullptr;
  void* a = take();
  ev_->record(a);
  ev_->synchronize(a);
  anchor_locked(a, now_s());
  give(a);
  place_locked(sink);
  // What is still here could not be measured (a reference that never ran: not expected).
  dropped_ += pending_.size();
  for (Pending& p : pending_) {
    give(p.begin);
    give(p.end);
  }
  pending_.clear();
  for (Ref& r : refs_) give(r.event);
  refs_.clear();
}

bool GpuLanes::idle() const {
  std::lock_guard<std::mutex> lk(mu_);
  return refs_.empty() && pending_.empty();
}

void GpuLanes::anchor_locked(void* anchor, double host_after_s) {
  for (Ref& r : refs_) {
    if (!std::isnan(r.host_s) || !ev_->complete(r.event)) continue;
    // Every span of an earlier step ended before R ran (one stream, or waited for by it);
    // each anchor's slack differs, so R is placed no earlier than the latest of their ends
    // as placed (a GPU idle between steps lets that push fade out).
    double floor_s = placed_end_s_;
    for (const Pending& p : pending_) {
      const Ref* pr = ref_of(p.step);
      if (p.step >= r.step || !pr || std::isnan(pr->host_s)) continue;
      if (p.measured) {
        floor_s = std::max(floor_s, pr->host_s + std::max(p.begin_ms, p.end_ms) * 1e-3);
      } else if (ev_->complete(p.end) && ev_->complete(p.begin)) {
        const double b = ev_->elapsed_ms(pr->event, p.begin), e = ev_->elapsed_ms(pr->event, p.end);
        floor_s = std::max(floor_s, pr->host_s + std::max(b, e) * 1e-3);
      }
    }
    r.host_s = std::max(reference_host_s(host_after_s, ev_->elapsed_ms(r.event, anchor), r.queued_s), floor_s);
  }
}

void GpuLanes::place_locked(const Sink& sink) {
  std::vector<Pending> left;
  for (Pending& p : pending_) {
    const Ref* r = ref_of(p.step);
    if (!r || std::isnan(r->host_s)) {
      left.push_back(std::move(p));
      continue;
    }
    if (!p.measured) {
      if (!ev_->complete(p.end) || !ev_->complete(p.begin)) {
        left.push_back(std::move(p));
        continue;
      }
      p.begin_ms = ev_->elapsed_ms(r->event, p.begin);
      p.end_ms = ev_->elapsed_ms(r->event, p.end);
      give(p.begin);
      give(p.end);
      p.begin = p.end = nullptr;
    }
    const double end_s = r->host_s + std::max(p.begin_ms, p.end_ms) * 1e-3;
    placed_end_s_ = std::max(placed_end_s_, end_s);
    sink(GpuEvent{p.lane, std::move(p.name), p.step, r->host_s + p.begin_ms * 1e-3, end_s, std::move(p.args)});
  }
  pending_ = std::move(left);
  // A reference that no span needs any more goes back, except the current step's.
  while (refs_.size() > 1) {
    const int64_t step = refs_.front().step;
    const bool needed =
        std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.step == step; });
    if (needed) break;
    give(refs_.front().event);
    refs_.pop_front();
  }
}

}  // namespace tnt::timeline
