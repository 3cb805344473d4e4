// Host buckets. With MPI_THREAD_MULTIPLE (and overlap on) one communication thread takes
// launched buckets from a queue, in bucket order, packs each (times the local factor) and
// allreduces it on our own duplicate communicator, so the training thread may keep using
// the user's communicator meanwhile. Otherwise wait_all() does the same work in order.
// The mutex here guards only the queue, the counters and the times; the Reducer's own lock
// is never taken by the thread.
#include "comm/waiter.hpp"
#include "comm/host_reduce.hpp"
#include "comm/transport.hpp"
#include "core/timeline_events.hpp"
#include "tarantella/check.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace tnt::comm {

namespace {

class HostTransport final : public Transport {
 public:
  explicit HostTransport(const TransportSetup& setup) : buckets_(fuse_buckets(setup)), times_(buckets_.size()) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      TNT_CHECK(host_reducible(buckets_[b].dtype), "Reducer: host gradients must be f32, f64, i32 or i64; '{}' is {}",
                setup.names[setup.plan.buckets[b].gradients[0]], dtype_name(buckets_[b].dtype));
    }
    if (setup.comm.size() == 1) return;  // nothing is ever sent
    comm_ = setup.comm.duplicate();
    detail::impl_of(*comm_).cancel = &cancel_;
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    threaded_ = setup.options.overlap && !buckets_.empty() && level == MPI_THREAD_MULTIPLE;
    if (threaded_) worker_ = std::thread([this] { worker_loop(); });
  }

  ~HostTransport() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  void begin_step(Clock::time_point t0) override {
    std::lock_guard<std::mutex> lk(mu_);
    t0_ = t0;
    launched_ = done_ = 0;
  }

  void launch(size_t b, double factor) override {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back({b, factor});
    ++launched_;
    if (threaded_) work_cv_.notify_one();
  }

  void end_backward() override {}

  void wait_all() override {
    if (!threaded_) {
      // Everything queued is reduced here, in bucket order (the order it was launched in).
      std::deque<Work> work;
      {
        std::lock_guard<std::mutex> lk(mu_);
        work.swap(queue_);
      }
      for (const Work& w : work) {
        times_[w.bucket].first = since_t0();
        reduce(w.bucket, w.factor);
        times_[w.bucket].second = since_t0();
        ++done_;
      }
      return;
    }
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_ == launched_; });
    if (error_) std::rethrow_exception(error_);
  }

  void unpack(size_t b, double scale) override {
    FusedBucket& bk = buckets_[b];
    timeline::Span span(timeline::Lane::compute, "unpack", [&] { return bk.trace_args; });
    if (!bk.fused.defined()) {
      Tensor& g = bk.members[0];
      host_scale(g.raw(), g.numel(), g.dtype(), scale);
      return;
    }
    const char* base = static_cast<const char*>(bk.fused.raw());
    const size_t elem = dtype_size(bk.dtype);
    for (size_t k = 0; k < bk.members.size(); ++k) {
      Tensor& g = bk.members[k];
      host_scale_copy(g.raw(), base + static_cast<size_t>(bk.offsets[k]) * elem, g.numel(), g.dtype(), scale);
    }
  }

  void scale(size_t b, double factor) override {
    for (Tensor& g : buckets_[b].members) host_scale(g.raw(), g.numel(), g.dtype(), factor);
  }

  void read_timing(StepTiming& timing) override {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      timing.buckets[b].start_s = times_[b].first;
      timing.buckets[b].end_s = times_[b].second;
    }
  }

  void cancel() override { cancel_ = true; }

 private:
  struct Work {
    size_t bucket;
    double factor;
  };

  double since_t0() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  // Packs bucket b (times factor) and sums it over the ranks.
  void reduce(size_t b, double factor) {
    FusedBucket& bk = buckets_[b];
    if (!bk.fused.defined()) {
      Tensor& g = bk.members[0];
      host_scale(g.raw(), g.numel(), g.dtype(), factor);
      timeline::Span span(timeline::Lane::communication, "allreduce", [&] { return bk.trace_args; });
      comm_->allreduce(g.raw(), g.numel(), g.dtype(), Device::cpu(), ReduceOp::sum, bk.algo);
      return;
    }
    char* base = static_cast<char*>(bk.fused.raw());
    const size_t elem = dtype_size(bk.dtype);
    {
      timeline::Span span(timeline::Lane::communication, "pack", [&] { return bk.trace_args; });
      for (size_t k = 0; k < bk.members.size(); ++k) {
        const Tensor& g = bk.members[k];
        host_scale_copy(base + static_cast<size_t>(bk.offsets[k]) * elem, g.raw(), g.numel(), g.dtype(), factor);
      }
    }
    timeline::Span span(timeline::Lane::communication, "allreduce", [&] { return bk.trace_args; });
    comm_->allreduce(bk.fused.raw(), bk.fused.numel(), bk.dtype, Device::cpu(), ReduceOp::sum, bk.algo);
  }

  void worker_loop() {
    for (;;) {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Work w = queue_.front();
      queue_.pop_front();
      // After a failure the peers' collectives no longer pair with ours: skip, but count.
      bool skip = error_ != nullptr;
      times_[w.bucket].first = since_t0();
      lk.unlock();
      std::exception_ptr failure;
      if (!skip) {
        try {
          reduce(w.bucket, w.factor);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      lk.lock();
      times_[w.bucket].second = since_t0();
      if (failure && !error_) error_ = failure;
      ++done_;
      done_cv_.notify_all();
    }
  }

  std::vector<FusedBucket> buckets_;
  std::atomic<bool> cancel_{false};     // before comm_, which points to it
  std::unique_ptr<Communicator> comm_;  // our duplicate (more than one rank only)
  bool threaded_ = false;

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Work> queue_;
  size_t launched_ = 0, done_ = 0;
  Clock::time_point t0_;
  std::vector<std::pair<double, double>> times_;  // (buckets,) start_s, end_s of this step
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Transport> make_host_transport(const TransportSetup& setup) {
  return std::make_unique<HostTransport>(setup);
}

}  // namespace tnt::comm
