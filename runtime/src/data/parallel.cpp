// Stages with threads: map on a pool of workers (output in input order) and prefetch on a
// background thread.
//
// Parallel map: the workers take turns pulling from the upstream iterator (it is not
// thread safe, so pulls are serialised and numbered in pull order), run fn outside any
// lock and file the result under its number; next() hands results out by number. At most
// `window` numbers are in flight beyond the next one to hand out, which bounds memory.
// Errors, from fn or from upstream, are filed like results and rethrown by next() in
// order. Destroying the iterator stops the workers after their current call and joins them.
// skip(n) (distribute() stepping over other ranks' elements) parks the workers, drops what
// they had already read ahead and skips the rest upstream, so as with one worker those
// elements are never mapped (only the read-ahead window may have been); an error of fn on a
// dropped element is dropped with it, an upstream error is rethrown. The workers stay parked
// until the next next(), so that back-to-back skips do not read ahead in between.
#include "data/dataset_node.hpp"

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>

namespace tnt {
namespace {

using detail::DatasetNode;
using detail::ElementIterator;
using detail::NodePtr;

class InlineMapIterator : public ElementIterator {
 public:
  InlineMapIterator(std::unique_ptr<ElementIterator> up, MapFn fn) : up_(std::move(up)), fn_(std::move(fn)) {}
  std::optional<Element> next() override {
    auto e = up_->next();
    if (!e) return std::nullopt;
    return fn_(std::move(*e));
  }
  // One-to-one: skipping here skips upstream, so skipped elements are never mapped.
  int64_t skip(int64_t n) override { return up_->skip(n); }

 private:
  std::unique_ptr<ElementIterator> up_;
  MapFn fn_;
};

class ParallelMapIterator : public ElementIterator {
 public:
  ParallelMapIterator(std::unique_ptr<ElementIterator> up, MapFn fn, int workers)
      : up_(std::move(up)), fn_(std::move(fn)), workers_(workers), window_(2 * static_cast<int64_t>(workers)) {}

  ~ParallelMapIterator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::optional<Element> next() override {
    if (threads_.empty()) {
      for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { work(); });
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (parked_) {
      parked_ = false;
      work_cv_.notify_all();
    }
    done_cv_.wait(lock, [&] { return done_.count(next_out_) || (end_ >= 0 && next_out_ >= end_); });
    auto it = done_.find(next_out_);
    if (it == done_.end()) return std::nullopt;
    Result r = std::move(it->second);
    done_.erase(it);
    ++next_out_;
    lock.unlock();
    work_cv_.notify_all();  // the window moved
    if (auto* err = std::get_if<std::exception_ptr>(&r)) std::rethrow_exception(*err);
    return std::move(std::get<Element>(r));
  }

  int64_t skip(int64_t n) override {
    if (n <= 0) return 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      parked_ = true;  // a worker waiting for the window with the pull lock lets go of it
    }
    work_cv_.notify_all();
    int64_t k = 0;
    std::exception_ptr failure;
    {
      std::unique_lock<std::mutex> pull(pull_mu_);  // no worker numbers a pull from here on
      std::unique_lock<std::mutex> lock(mu_);
      auto limit = [&] { return end_ >= 0 ? end_ : next_in_; };
      // Every numbered pull is either filed or running fn; wait for the running ones.
      done_cv_.wait(lock, [&] { return static_cast<int64_t>(done_.size()) == limit() - next_out_; });
      while (k < n && next_out_ < limit()) {
        auto it = done_.find(next_out_);
        bool upstream_error = next_out_ == upstream_error_seq_;
        Result r = std::move(it->second);
        done_.erase(it);
        ++next_out_;
        if (upstream_error) {
          failure = std::get<std::exception_ptr>(r);
          break;
        }
        ++k;  // an element, or fn's error on an element nobody will see
      }
      if (!failure && k < n && end_ < 0) {
        lock.unlock();
        int64_t got = 0;
        try {
          got = up_->skip(n - k);
        } catch (...) {
          failure = std::current_exception();
        }
        lock.lock();
        k += got;
        // Upstream ended or failed inside the skip: the stream ends here, as it does when a
        // worker meets the end or the error while reading ahead.
        if (failure || k < n) end_ = next_in_;
      }
    }
    done_cv_.notify_all();
    if (failure) std::rethrow_exception(failure);
    return k;
  }

 private:
  using Result = std::variant<Element, std::exception_ptr>;

  void work() {
    for (;;) {
      std::unique_lock<std::mutex> pull(pull_mu_);
      int64_t seq = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || end_ >= 0 || parked_ || next_in_ < next_out_ + window_; });
        if (stop_ || end_ >= 0) return;
        if (parked_) {  // skip() needs the pull lock: give it up and wait for the next next()
          pull.unlock();
          work_cv_.wait(lock, [&] { return stop_ || !parked_; });
          continue;
        }
        seq = next_in_++;
      }
      std::optional<Element> in;
      std::exception_ptr err;
      try {
        in = up_->next();
      } catch (...) {
        err = std::current_exception();
      }
      if (!in) {
        // The end is recorded before the pull lock is released: otherwise another worker
        // could pull past the end, get a second end (or a stray element) and move end_
        // beyond a number no worker will ever file, leaving next() waiting forever.
        std::lock_guard<std::mutex> lock(mu_);
        if (err) {
          done_.emplace(seq, err);
          upstream_error_seq_ = seq;
        }
        end_ = err ? seq + 1 : seq;
        done_cv_.notify_all();
        work_cv_.notify_all();
        return;
      }
      pull.unlock();
      Result r;
      try {
        r = fn_(std::move(*in));
      } catch (...) {
        r = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      done_.emplace(seq, std::move(r));
      done_cv_.notify_all();
    }
  }

  std::unique_ptr<ElementIterator> up_;
  MapFn fn_;
  int workers_;
  int64_t window_;
  std::vector<std::thread> threads_;

  std::mutex pull_mu_;  // held while pulling from up_ (and numbering the pull)
  std::mutex mu_;       // everything below
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  int64_t next_in_ = 0;   // number of the next pull
  int64_t next_out_ = 0;  // number next() hands out next
  int64_t end_ = -1;      // number at which the stream ends (known once upstream ended or failed)
  int64_t upstream_error_seq_ = -1;  // number filed with upstream's error (not fn's)
  bool parked_ = false;              // set by skip(), cleared by next(): workers stay off the pull lock
  std::map<int64_t, Result> done_;
};

class MapNode : public DatasetNode {
 public:
  MapNode(NodePtr up, MapFn fn, int workers) : up_(std::move(up)), fn_(std::move(fn)), workers_(workers) {
    TNT_CHECK(static_cast<bool>(fn_), "Dataset::map: empty function");
    if (workers_ < 1) TNT_INPUT_ERROR("Dataset::map: {} workers; at least 1 is needed", workers_);
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    if (workers_ == 1) return std::make_unique<InlineMapIterator>(up_->iterate(epoch), fn_);
    return std::make_unique<ParallelMapIterator>(up_->iterate(epoch), fn_, workers_);
  }
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override { return up_->cardinality(); }

 private:
  NodePtr up_;
  MapFn fn_;
  int workers_;
};

// Prefetch: one producer thread fills a bounded queue. The producer's exception is kept and
// rethrown by next() after the elements produced before it.
class PrefetchIterator : public ElementIterator {
 public:
  PrefetchIterator(std::unique_ptr<ElementIterator> up, int64_t capacity)
      : up_(std::move(up)), capacity_(static_cast<size_t>(capacity)) {}

  ~PrefetchIterator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::optional<Element> next() override {
    if (!started_) {  // started on first use, so building an iterator costs nothing
      thread_ = std::thread([this] { produce(); });  // may throw (no threads left): try again next time
      started_ = true;
    }
    std::unique_lock<std::mutex> lock(mu_);
    data_cv_.wait(lock, [&] { return !queue_.empty() || finished_; });
    if (!queue_.empty()) {
      Element e = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      space_cv_.notify_one();
      return e;
    }
    if (error_) {
      auto err = std::exchange(error_, nullptr);
      std::rethrow_exception(err);
    }
    return std::nullopt;
  }

 private:
  void produce() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_cv_.wait(lock, [&] { return stop_ || queue_.size() < capacity_; });
        if (stop_) return;
      }
      std::optional<Element> e;
      std::exception_ptr err;
      try {
        e = up_->next();
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (!e) {
        // Moved, not copied: this thread keeps no reference, so the exception is destroyed
        // by the consumer that rethrows it, never here after the hand-over.
        error_ = std::move(err);
        finished_ = true;
        data_cv_.notify_all();
        return;
      }
      queue_.push_back(std::move(*e));
      data_cv_.notify_all();
    }
  }

  std::unique_ptr<ElementIterator> up_;
  size_t capacity_;
  bool started_ = false;  // consumer side only
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable data_cv_;
  std::condition_variable space_cv_;
  std::deque<Element> queue_;
  bool finished_ = false;  // the producer has ended (end of stream or error)
  bool stop_ = false;
  std::exception_ptr error_;
};

class PrefetchNode : public DatasetNode {
 public:
  PrefetchNode(NodePtr up, int64_t capacity) : up_(std::move(up)), capacity_(capacity) {
    if (capacity_ < 1) TNT_INPUT_ERROR("Dataset::prefetch: buffer size {} must be at least 1", capacity_);
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<PrefetchIterator>(up_->iterate(epoch), capacity_);
  }
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override { return up_->cardinality(); }

 private:
  NodePtr up_;
  int64_t capacity_;
};

}  // namespace

Dataset Dataset::map(MapFn fn, int workers) const {
  return Dataset(std::make_shared<MapNode>(node_, std::move(fn), workers));
}

Dataset Dataset::prefetch(int64_t buffer_size) const {
  return Dataset(std::make_shared<PrefetchNode>(node_, buffer_size));
}

}  // namespace tnt
