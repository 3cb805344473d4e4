// Dataset::interleave, and the sources it is usually fed with: file names (from_strings)
// and the records of TFRecord files (from_tfrecord).
//
// The order is tf.data's InterleaveDataset's, kept by one state machine on the caller's
// thread: a cycle of cycle_length slots and a position in it; the slot at the position
// gives block_length elements (or fewer, if its dataset ends) and the position moves on;
// an empty slot at the position is filled with the next input's dataset first. Which input
// goes into which slot, and when, therefore depends only on the datasets' contents.
//
// Read-ahead (num_parallel_calls > 1) never decides anything: worker threads only fill
// per-dataset queues (up to block_length elements each) for the datasets in the cycle and
// for the next cycle_length inputs, which the caller opens early, in input order, and hands
// to slots in that same order. A worker serves the dataset the caller will need soonest
// (the cycle from the current position, then the waiting inputs). An error of a dataset is
// queued like an element and rethrown when its turn comes; the dataset ends there.
#include "data/dataset_node.hpp"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>

namespace tnt {
namespace {

using detail::DatasetNode;
using detail::ElementIterator;
using detail::NodePtr;
using InterleaveFn = std::function<Dataset(const Element&)>;

// One opened dataset of the cycle (or waiting for a slot).
struct Source {
  std::unique_ptr<ElementIterator> it;
  std::deque<std::variant<Element, std::exception_ptr>> ready;  // read ahead, in order
  bool ended = false;  // `it` has returned nullopt or thrown (the error is last in `ready`)
  bool busy = false;   // a worker is inside it->next()
};
using SourcePtr = std::shared_ptr<Source>;

class InterleaveIterator : public ElementIterator {
 public:
  InterleaveIterator(std::unique_ptr<ElementIterator> up, InterleaveFn fn, Dataset::InterleaveOptions options,
                     int64_t epoch)
      : up_(std::move(up)),
        fn_(std::move(fn)),
        options_(options),
        epoch_(epoch),
        cycle_(static_cast<size_t>(options.cycle_length)),
        workers_(options.num_parallel_calls > 1 ? options.num_parallel_calls : 0) {}

  ~InterleaveIterator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::optional<Element> next() override {
    if (workers_ > 0 && threads_.empty()) {
      top_up();
      for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { work(); });
    }
    std::optional<Element> e;
    advance(&e);
    return e;
  }

  int64_t skip(int64_t n) override {
    if (workers_ > 0) return ElementIterator::skip(n);  // the workers read them anyway
    int64_t k = 0;
    while (k < n && advance(nullptr)) ++k;
    return k;
  }

 private:
  // The state machine: moves to the next element and returns it in *out (or, out null,
  // steps over it without building it where the dataset can); false at the end.
  bool advance(std::optional<Element>* out) {
    for (;;) {
      if (cycle_[pos_]) {
        std::variant<Element, std::exception_ptr> item;
        // take() may move the position (deterministic = false): cycle_[pos_] is re-read below.
        bool got = workers_ > 0 ? take(&item) : take_inline(cycle_[pos_], out != nullptr, &item);
        if (got) {
          if (auto* err = std::get_if<std::exception_ptr>(&item)) std::rethrow_exception(*err);
          if (out) *out = std::move(std::get<Element>(item));
          if (++block_ == options_.block_length) move_on();
          return true;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          cycle_[pos_].reset();
        }
        --open_;
        move_on();
      } else if (!input_ended_ || has_waiting()) {
        SourcePtr s = open_next();
        if (s) {
          std::lock_guard<std::mutex> lock(mu_);
          cycle_[pos_] = std::move(s);
          ++open_;
        }
        if (workers_ > 0) top_up();
        work_cv_.notify_all();
      } else if (open_ == 0) {
        return false;
      } else {
        move_on();
      }
    }
  }

  void move_on() {
    block_ = 0;
    std::lock_guard<std::mutex> lock(mu_);  // the workers read pos_ to choose what to read
    pos_ = (pos_ + 1) % cycle_.size();
  }

  bool has_waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return !waiting_.empty();
  }

  // The next input's dataset, opened (waiting ones first: they are the next inputs); null
  // at the end of the input.
  SourcePtr open_next() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!waiting_.empty()) {
        SourcePtr s = std::move(waiting_.front());
        waiting_.pop_front();
        return s;
      }
    }
    return open_input();
  }

  SourcePtr open_input() {
    if (input_ended_) return nullptr;
    std::optional<Element> e = up_->next();
    if (!e) {
      input_ended_ = true;
      return nullptr;
    }
    Dataset d = fn_(*e);
    auto s = std::make_shared<Source>();
    s->it = d.node()->iterate(epoch_);
    return s;
  }

  // Keeps cycle_length inputs opened ahead for the workers.
  void top_up() {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (static_cast<int64_t>(waiting_.size()) >= options_.cycle_length) return;
      }
      SourcePtr s = open_input();
      if (!s) return;
      std::lock_guard<std::mutex> lock(mu_);
      waiting_.push_back(std::move(s));
    }
  }

  bool take_inline(const SourcePtr& s, bool build, std::variant<Element, std::exception_ptr>* item) {
    if (s->ended) return false;
    if (!build) {
      if (s->it->skip(1) == 1) return true;
      s->ended = true;
      return false;
    }
    std::optional<Element> e = s->it->next();
    if (!e) {
      s->ended = true;
      return false;
    }
    *item = std::move(*e);
    return true;
  }

  // With workers: waits for the current slot's next element (deterministic), or for any
  // slot with one ready (not), moving the position there.
  bool take(std::variant<Element, std::exception_ptr>* item) {
    std::unique_lock<std::mutex> lock(mu_);
    auto usable = [](const SourcePtr& s) { return s && (!s->ready.empty() || s->ended); };
    for (;;) {
      if (usable(cycle_[pos_])) break;
      if (!options_.deterministic) {
        bool moved = false;
        for (size_t k = 1; k < cycle_.size() && !moved; ++k) {
          size_t at = (pos_ + k) % cycle_.size();
          if (cycle_[at] && !cycle_[at]->ready.empty()) {
            pos_ = at;
            block_ = 0;
            moved = true;
          }
        }
        if (moved) break;
      }
      done_cv_.wait(lock);
    }
    Source& s = *cycle_[pos_];
    if (s.ready.empty()) return false;  // ended
    *item = std::move(s.ready.front());
    s.ready.pop_front();
    lock.unlock();
    work_cv_.notify_all();
    return true;
  }

  // The source a worker should read next: the cycle from the current position, then the
  // waiting inputs. Called with mu_ held.
  SourcePtr pick() {
    auto wants = [&](const SourcePtr& s) {
      return s && !s->busy && !s->ended && static_cast<int64_t>(s->ready.size()) < options_.block_length;
    };
    for (size_t k = 0; k < cycle_.size(); ++k)
      if (wants(cycle_[(pos_ + k) % cycle_.size()])) return cycle_[(pos_ + k) % cycle_.size()];
    for (const SourcePtr& s : waiting_)
      if (wants(s)) return s;
    return nullptr;
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      SourcePtr s;
      work_cv_.wait(lock, [&] { return stop_ || (s = pick()) != nullptr; });
      if (stop_) return;
      s->busy = true;
      lock.unlock();
      std::variant<Element, std::exception_ptr> item;
      bool end = false;
      try {
        std::optional<Element> e = s->it->next();
        if (e) item = std::move(*e); else end = true;
      } catch (...) {
        item = std::current_exception();
      }
      lock.lock();
      s->busy = false;
      if (!end) s->ready.push_back(std::move(item));
      if (end || std::holds_alternative<std::exception_ptr>(s->ready.back())) s->ended = true;
      done_cv_.notify_all();
    }
  }

  std::unique_ptr<ElementIterator> up_;
  InterleaveFn fn_;
  Dataset::InterleaveOptions options_;
  int64_t epoch_;
  // The state machine (caller's thread; cycle_ and waiting_ change under mu_, since the
  // workers look at them).
  std::vector<SourcePtr> cycle_;
  size_t pos_ = 0;
  int64_t block_ = 0;
  int64_t open_ = 0;
  bool input_ended_ = false;
  std::deque<SourcePtr> waiting_;
  // Read-ahead.
  int workers_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  bool stop_ = false;
};

class InterleaveNode : public DatasetNode {
 public:
  InterleaveNode(NodePtr up, InterleaveFn fn, Dataset::InterleaveOptions options)
      : up_(std::move(up)), fn_(std::move(fn)), options_(options) {
    TNT_CHECK(static_cast<bool>(fn_), "Dataset::interleave: empty function");
    if (options_.cycle_length < 1)
      TNT_INPUT_ERROR("Dataset::interleave: cycle_length {} must be at least 1", options_.cycle_length);
    if (options_.block_length < 1)
      TNT_INPUT_ERROR("Dataset::interleave: block_length {} must be at least 1", options_.block_length);
    if (options_.num_parallel_calls < 1)
      TNT_INPUT_ERROR("Dataset::interleave: num_parallel_calls {} must be at least 1", options_.num_parallel_calls);
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<InterleaveIterator>(up_->iterate(epoch), fn_, options_, epoch);
  }
  int64_t cardinality() const override { return up_->cardinality() == 0 ? 0 : detail::kUnknown; }
  bool reshuffles() const override { return up_->reshuffles(); }
  // Without a deterministic order its read-ahead threads decide the order.
  bool order_depends_on_timing() const override {
    return (!options_.deterministic && options_.num_parallel_calls > 1) || up_->order_depends_on_timing();
  }

 private:
  NodePtr up_;
  InterleaveFn fn_;
  Dataset::InterleaveOptions options_;
};

// ---- sources

Tensor bytes_tensor(const void* data, size_t n) {
  return Tensor::from_data(static_cast<const uint8_t*>(data), {static_cast<int64_t>(n)});  // (n,)
}

class TFRecordIterator : public ElementIterator {
 public:
  TFRecordIterator(std::shared_ptr<const std::vector<std::string>> files, TFRecordCompression compression)
      : files_(std::move(files)), compression_(compression) {}
  std::optional<Element> next() override {
    while (open()) {
      if (reader_->next(record_)) return Element{bytes_tensor(record_.data(), record_.size())};
      reader_.reset();
    }
    return std::nullopt;
  }
  int64_t skip(int64_t n) override {
    int64_t k = 0;
    while (k < n && open()) {
      if (reader_->skip()) ++k; else reader_.reset();
    }
    return k;
  }

 private:
  bool open() {
    if (reader_) return true;
    if (next_file_ >= files_->size()) return false;
    reader_ = std::make_unique<TFRecordReader>((*files_)[next_file_++], compression_);
    return true;
  }
  std::shared_ptr<const std::vector<std::string>> files_;
  TFRecordCompression compression_;
  size_t next_file_ = 0;
  std::unique_ptr<TFRecordReader> reader_;
  std::string record_;
};

class TFRecordNode : public DatasetNode {
 public:
  TFRecordNode(std::vector<std::string> files, TFRecordCompression compression)
      : files_(std::make_shared<const std::vector<std::string>>(std::move(files))), compression_(compression) {}
  std::unique_ptr<ElementIterator> iterate(int64_t) const override {
    return std::make_unique<TFRecordIterator>(files_, compression_);
  }
  int64_t cardinality() const override { return files_->empty() ? 0 : detail::kUnknown; }

 private:
  std::shared_ptr<const std::vector<std::string>> files_;
  TFRecordCompression compression_;
};

}  // namespace

Dataset Dataset::interleave(std::function<Dataset(const Element&)> fn, InterleaveOptions options) const {
  return Dataset(std::make_shared<InterleaveNode>(node_, std::move(fn), options));
}

Dataset Dataset::from_tfrecord(std::vector<std::string> files, TFRecordCompression compression) {
  return Dataset(std::make_shared<TFRecordNode>(std::move(files), compression));
}

Dataset Dataset::from_strings(std::vector<std::string> strings) {
  auto list = std::make_shared<const std::vector<std::string>>(std::move(strings));
  return from_function(static_cast<int64_t>(list->size()), [list](int64_t i) {
    const std::string& s = (*list)[static_cast<size_t>(i)];
    return Element{bytes_tensor(s.data(), s.size())};
  });
}

std::string element_string(const Tensor& bytes) {
  TNT_CHECK(bytes.defined() && bytes.dtype() == DType::u8 && bytes.ndim() == 1,
            "element_string: expected a u8 (n,) tensor, got {}", bytes.defined() ? bytes.str() : "undefined");
  return std::string(reinterpret_cast<const char*>(bytes.data<uint8_t>()), static_cast<size_t>(bytes.numel()));
}

}  // namespace tnt
