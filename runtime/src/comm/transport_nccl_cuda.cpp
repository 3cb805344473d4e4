// Device buckets (CUDA builds only: the _cuda.cpp rule in runtime/CMakeLists.txt). Nothing
// here blocks the training thread until wait_all(): launch() enqueues the pack kernel on
// the compute stream of the gradients' device (the stream their layers produced them on),
// records an event after it, makes the NCCL stream wait for that event and enqueues the
// allreduce there. wait_all() polls each bucket's last event against the collective
// timeout; unpack() enqueues the unpack kernel on the compute stream, after which every
// later kernel of the step sees the sums. Times come from events, on the GPU's clock.
#include "backend/cuda/nccl_comm.hpp"
#include "core/device_api.hpp"
#include "comm/waiter.hpp"
#include "comm/device_collectives.hpp"
#include "comm/pack_cuda.hpp"
#include "comm/transport.hpp"
#include "core/timeline_events.hpp"
#include "tarantella/check.hpp"

#include <algorithm>
#include <atomic>

namespace tnt::comm {

namespace {

// A cudaEvent_t with timing, destroyed with its owner.
class Event {
 public:
  Event() : event_(cuda::event_create()) {}
  ~Event() { cuda::event_destroy(event_); }
  Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event& operator=(Event&&) = delete;
  void* get() const { return event_; }

 private:
  void* event_ = nullptr;
};

struct BucketEvents {
  Event ready;   // compute stream: the bucket was complete
  Event packed;  // compute stream, after the pack: the NCCL stream waits for it
  Event start;   // NCCL stream: it reached the bucket
  Event done;    // NCCL stream, after the allreduce
  detail::OpDesc op;  // the bucket's collective, numbered seq on the Reducer's communicator
  int64_t seq = 0;
};

class NcclTransport final : public Transport {
 public:
  explicit NcclTransport(const TransportSetup& setup)
      : device_(made_current(setup.plan.buckets.at(0).device)), buckets_(fuse_buckets(setup)) {
    // One device per Reducer: every bucket is packed on that device's compute stream. (A
    // rank's gradients live where its model does, so this holds on every rank or on none.)
    for (const PlannedBucket& pb : setup.plan.buckets) {
      TNT_CHECK(pb.device == device_, "Reducer: gradients on {} and on {}; one Reducer reduces the gradients of one device",
                device_.str(), pb.device.str());
    }
    stream_ = setup.options.cuda_stream ? setup.options.cuda_stream : backend::cuda_compute_stream(device_.index);
    events_.resize(buckets_.size());
    if (setup.comm.size() == 1) return;  // nothing is ever sent
    comm_ = setup.comm.duplicate();
    detail::CommImpl& c = detail::impl_of(*comm_);
    c.cancel = &cancel_;
    const detail::OpDesc desc{.name = "Reducer setup (NCCL communicator)"};
    c.enter(desc);
    detail::Waiter w(c, desc);
    nccl_ = &detail::ensure_nccl(w);
  }

  void begin_step(Clock::time_point) override {
    cuda::event_record(step_start_.get(), stream_);
  }

  void launch(size_t b, double factor) override {
    FusedBucket& bk = buckets_[b];
    backend::cuda_set_device(device_.index);
    cuda::event_record(events_[b].ready.get(), stream_);
    Tensor& data = bk.fused.defined() ? bk.fused : bk.members[0];
    if (bk.fused.defined()) {
      cuda::pack(items(bk), bk.fused.raw(), bk.dtype, factor, stream_);
    } else {
      cuda::scale(data.raw(), data.numel(), data.dtype(), factor, stream_);
    }
    detail::CommImpl& c = detail::impl_of(*comm_);
    events_[b].op = detail::OpDesc{.name = "Reducer bucket allreduce(nccl)", .count = data.numel(), .dtype = bk.dtype};
    events_[b].seq = c.enter(events_[b].op);
    cuda::event_record(events_[b].packed.get(), stream_);
    nccl_->wait_event(events_[b].packed.get());
    cuda::event_record(events_[b].start.get(), nccl_->stream());
    // Setting the call up (NCCL may connect to its peers here on first use) keeps the plain
    // deadline; wait_all watches where the ranks are.
    nccl_->allreduce(data.raw(), static_cast<size_t>(data.numel()), bk.dtype, false, bk.what, c.deadline());
    nccl_->record(events_[b].done.get());
  }

  void end_backward() override { cuda::event_record(backward_end_.get(), stream_); }

  void wait_all() override {
    detail::CommImpl& c = detail::impl_of(*comm_);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      // A Waiter for the bucket's collective number: at the deadline it names the ranks that
      // never launched this bucket, after the grace it finds ranks that called another
      // collective, and when the bucket completes it publishes it as finished.
      detail::Waiter w(c, events_[b].op, events_[b].seq);
      nccl_->synchronize(events_[b].done.get(), buckets_[b].what, comm::nccl_watch(w));
    }
  }

  void unpack(size_t b, double scale) override {
    FusedBucket& bk = buckets_[b];
    if (bk.fused.defined()) {
      cuda::unpack(items(bk), bk.fused.raw(), bk.dtype, scale, stream_);
    } else {
      Tensor& g = bk.members[0];
      cuda::scale(g.raw(), g.numel(), g.dtype(), scale, stream_);
    }
  }

  void scale(size_t b, double factor) override {
    for (Tensor& g : buckets_[b].members) cuda::scale(g.raw(), g.numel(), g.dtype(), factor, stream_);
  }

  void read_timing(StepTiming& timing) override {
    auto s = [&](const Event& e) { return cuda::event_elapsed_ms(step_start_.get(), e.get()) / 1000.0; };
    for (size_t b = 0; b < buckets_.size(); ++b) {
      timing.buckets[b] = {s(events_[b].ready), s(events_[b].start), s(events_[b].done)};
      // The GPU comm lane: from the NCCL stream reaching the bucket to its sum (wait_all
      // waited for both events).
      if (auto* r = timeline::active()) {
        r->device_span_complete(timeline::Lane::gpu_comm, "allreduce", events_[b].start.get(), events_[b].done.get(),
                                buckets_[b].trace_args);
      }
    }
    timing.backward_end_s = s(backward_end_);
    // On the same clock: the later of backward's end and the last sum's (the unpacking
    // queued after it is not timed: that would wait for it).
    timing.finalize_end_s = timing.backward_end_s;
    for (const BucketTiming& t : timing.buckets) timing.finalize_end_s = std::max(timing.finalize_end_s, t.end_s);
  }

  void cancel() override {
    cancel_ = true;
    if (nccl_) nccl_->abort_on_close();
  }

 private:
  // Events and buffers belong to the device that is current when they are made.
  static Device made_current(Device device) {
    backend::cuda_set_device(device.index);
    return device;
  }

  static std::vector<cuda::PackItem> items(const FusedBucket& bk) {
    std::vector<cuda::PackItem> out;
    for (size_t k = 0; k < bk.members.size(); ++k) {
      out.push_back({bk.members[k].raw(), bk.offsets[k], bk.members[k].numel()});
    }
    return out;
  }

  // Declared in the order that makes destruction safe: the NCCL communicator goes first
  // (aborted if work is unfinished), then the events its stream records, then the buffers.
  Device device_;
  void* stream_ = nullptr;  // cudaStream_t: the compute stream of device_ (or the options' override)
  std::vector<FusedBucket> buckets_;
  std::vector<BucketEvents> events_;  // (buckets,)
  Event step_start_, backward_end_;   // compute stream
  std::atomic<bool> cancel_{false};
  std::unique_ptr<Communicator> comm_;  // our duplicate (more than one rank only)
  backend::NcclComm* nccl_ = nullptr;   // comm_'s
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(const TransportSetup& setup) {
  return std::make_unique<NcclTransport>(setup);
}

}  // namespace tnt::comm
