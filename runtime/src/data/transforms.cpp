// Sequential dataset stages: shuffle, batch, shard, repeat, take, skip.
#include "data/dataset_node.hpp"

#include <cstdint>
#include <cstring>
#include <utility>

namespace tnt {
namespace detail {

int64_t ElementIterator::skip(int64_t n) {
  int64_t k = 0;
  while (k < n && next()) ++k;
  return k;
}

Tensor stack_column(const std::vector<Element>& elements, size_t column, const char* what) {
  const Tensor& first = elements.at(0).at(column);
  Shape shape = first.shape();
  shape.insert(shape.begin(), static_cast<int64_t>(elements.size()));
  Tensor out = Tensor::empty(shape, first.dtype());  // (b, S...)
  auto* dst = static_cast<char*>(out.raw());
  size_t row_bytes = first.nbytes();
  for (size_t i = 0; i < elements.size(); ++i) {
    TNT_INPUT_CHECK(elements[i].size() == elements[0].size(), "{}: element {} has {} columns, element 0 has {}",
              what, i, elements[i].size(), elements[0].size());
    const Tensor& t = elements[i][column];
    TNT_INPUT_CHECK(t.device().is_cpu(), "{}: column {} of element {} is on {}; datasets hold host tensors", what,
              column, i, t.device().str());
    TNT_INPUT_CHECK(t.dtype() == first.dtype() && t.shape() == first.shape(),
              "{}: column {} is {} in element {} but {} in element 0; stacked elements must match", what,
              column, t.str(), i, first.str());
    std::memcpy(dst + i * row_bytes, t.raw(), row_bytes);
  }
  return out;
}

}  // namespace detail

namespace {

using detail::DatasetNode;
using detail::ElementIterator;
using detail::kInfinite;
using detail::kUnknown;
using detail::NodePtr;

// ---- shuffle: a buffer of k elements; each step emits a random one and refills.
class ShuffleIterator : public ElementIterator {
 public:
  ShuffleIterator(std::unique_ptr<ElementIterator> up, int64_t buffer, uint64_t seed, int64_t epoch)
      : up_(std::move(up)), capacity_(static_cast<size_t>(buffer)),
        rng_(detail::mix64(seed) ^ detail::mix64(static_cast<uint64_t>(epoch) ^ 0x5368756666ull)) {}
  std::optional<Element> next() override {
    while (!exhausted_ && buffer_.size() < capacity_) {
      auto e = up_->next();
      if (!e) {
        exhausted_ = true;
        break;
      }
      buffer_.push_back(std::move(*e));
    }
    if (buffer_.empty()) return std::nullopt;
    size_t i = static_cast<size_t>(rng_.below(buffer_.size()));
    Element out = std::move(buffer_[i]);
    if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
    buffer_.pop_back();
    return out;
  }

 private:
  std::unique_ptr<ElementIterator> up_;
  size_t capacity_;
  detail::SplitMix64 rng_;
  std::vector<Element> buffer_;
  bool exhausted_ = false;
};

class ShuffleNode : public DatasetNode {
 public:
  ShuffleNode(NodePtr up, int64_t buffer, uint64_t seed) : up_(std::move(up)), buffer_(buffer), seed_(seed) {
    if (buffer_ < 1) TNT_INPUT_ERROR("Dataset::shuffle: buffer size {} must be at least 1", buffer_);
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<ShuffleIterator>(up_->iterate(epoch), buffer_, seed_, epoch);
  }
  bool reshuffles() const override { return true; }  // its order depends on the epoch
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override { return up_->cardinality(); }

 private:
  NodePtr up_;
  int64_t buffer_;
  uint64_t seed_;
};

// ---- batch
class BatchIterator : public ElementIterator {
 public:
  BatchIterator(std::unique_ptr<ElementIterator> up, int64_t size, bool drop)
      : up_(std::move(up)), size_(size), drop_(drop) {}
  std::optional<Element> next() override {
    std::vector<Element> rows;
    // A batch size far beyond the data (batch(INT64_MAX) for "all of it", as tf.data takes
    // it) reserves what a batch of real data could fill, not size_ slots.
    rows.reserve(static_cast<size_t>(std::min<int64_t>(size_, 1024)));
    while (static_cast<int64_t>(rows.size()) < size_) {
      auto e = up_->next();
      if (!e) break;
      rows.push_back(std::move(*e));
    }
    if (rows.empty() || (drop_ && static_cast<int64_t>(rows.size()) < size_)) return std::nullopt;
    Element out;
    for (size_t c = 0; c < rows[0].size(); ++c) out.push_back(detail::stack_column(rows, c, "Dataset::batch"));
    return out;
  }
  // n batches are n x size elements upstream: skipped there, so never built where upstream
  // can skip (a resumed epoch's first steps).
  int64_t skip(int64_t n) override {
    if (n <= 0) return 0;
    const int64_t k = up_->skip(n > INT64_MAX / size_ ? INT64_MAX : n * size_);
    const int64_t partial = k % size_;
    return k / size_ + (partial > 0 && !drop_ ? 1 : 0);
  }

 private:
  std::unique_ptr<ElementIterator> up_;
  int64_t size_;
  bool drop_;
};

class BatchNode : public DatasetNode {
 public:
  BatchNode(NodePtr up, int64_t size, bool drop) : up_(std::move(up)), size_(size), drop_(drop) {
    if (size_ < 1) TNT_INPUT_ERROR("Dataset::batch: batch size {} must be at least 1", size_);
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<BatchIterator>(up_->iterate(epoch), size_, drop_);
  }
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override {
    int64_t n = up_->cardinality();
    if (n < 0) return n;
    return drop_ ? n / size_ : n / size_ + (n % size_ != 0 ? 1 : 0);  // n + size_ - 1 could overflow
  }

 private:
  NodePtr up_;
  int64_t size_;
  bool drop_;
};

// ---- shard: element index, then every num_shards-th
class ShardIterator : public ElementIterator {
 public:
  ShardIterator(std::unique_ptr<ElementIterator> up, int64_t shards, int64_t index)
      : up_(std::move(up)), shards_(shards), pending_(index) {}
  std::optional<Element> next() override {
    // The gap is skipped lazily, before the next element, so the stream is never read
    // beyond the last element this shard returns.
    if (up_->skip(pending_) < pending_) return std::nullopt;
    pending_ = shards_ - 1;
    return up_->next();
  }

 private:
  std::unique_ptr<ElementIterator> up_;
  int64_t shards_;
  int64_t pending_;
};

class ShardNode : public DatasetNode {
 public:
  ShardNode(NodePtr up, int64_t shards, int64_t index) : up_(std::move(up)), shards_(shards), index_(index) {
    if (shards_ < 1 || index_ < 0 || index_ >= shards_) {
      TNT_INPUT_ERROR("Dataset::shard: index {} is not in [0, num_shards={})", index_, shards_);
    }
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<ShardIterator>(up_->iterate(epoch), shards_, index_);
  }
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override {
    int64_t n = up_->cardinality();
    if (n < 0) return n;
    return n <= index_ ? 0 : (n - index_ + shards_ - 1) / shards_;
  }

 private:
  NodePtr up_;
  int64_t shards_;
  int64_t index_;
};

// ---- repeat
class RepeatIterator : public ElementIterator {
 public:
  RepeatIterator(NodePtr up, int64_t count, int64_t epoch) : up_(std::move(up)), count_(count), epoch_(epoch) {}
  std::optional<Element> next() override {
    for (;;) {
      if (!current_) {
        if (count_ >= 0 && pass_ >= count_) return std::nullopt;
        int64_t sub = count_ >= 0 ? epoch_ * count_ + pass_ : (epoch_ << 32) + pass_;
        current_ = up_->iterate(sub);
        yielded_ = false;
      }
      if (auto e = current_->next()) {
        yielded_ = true;
        return e;
      }
      current_.reset();
      ++pass_;
      // An empty pass ends a forever-repeat instead of spinning on it.
      if (!yielded_) return std::nullopt;
    }
  }

 private:
  NodePtr up_;
  int64_t count_;
  int64_t epoch_;
  int64_t pass_ = 0;
  bool yielded_ = false;
  std::unique_ptr<ElementIterator> current_;
};

class RepeatNode : public DatasetNode {
 public:
  RepeatNode(NodePtr up, int64_t count) : up_(std::move(up)), count_(count < 0 ? -1 : count) {}
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<RepeatIterator>(up_, count_, epoch);
  }
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override {
    int64_t n = up_->cardinality();
    if (n == 0 || count_ == 0) return 0;
    if (count_ < 0) return n == kUnknown ? kUnknown : kInfinite;
    if (n < 0) return n;
    return n > INT64_MAX / count_ ? kUnknown : n * count_;  // beyond 2^63 elements: not a count
  }

 private:
  NodePtr up_;
  int64_t count_;
};

// ---- take / skip
class TakeIterator : public ElementIterator {
 public:
  TakeIterator(std::unique_ptr<ElementIterator> up, int64_t count) : up_(std::move(up)), left_(count) {}
  std::optional<Element> next() override {
    if (left_ <= 0) return std::nullopt;
    auto e = up_->next();
    if (e) --left_; else left_ = 0;
    return e;
  }
  int64_t skip(int64_t n) override {
    int64_t k = up_->skip(std::min(n, left_));
    left_ = k < std::min(n, left_) ? 0 : left_ - k;
    return k;
  }

 private:
  std::unique_ptr<ElementIterator> up_;
  int64_t left_;
};

class TakeNode : public DatasetNode {
 public:
  TakeNode(NodePtr up, int64_t count) : up_(std::move(up)), count_(count) {
    if (count_ < 0) TNT_INPUT_ERROR("Dataset::take: count {} is negative (-1 takes all, as in tf.data)", count_);
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<TakeIterator>(up_->iterate(epoch), count_);
  }
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override {
    int64_t n = up_->cardinality();
    if (n == kInfinite) return count_;
    if (n == kUnknown) return kUnknown;
    return std::min(n, count_);
  }

 private:
  NodePtr up_;
  int64_t count_;
};

class SkipIterator : public ElementIterator {
 public:
  SkipIterator(std::unique_ptr<ElementIterator> up, int64_t count) : up_(std::move(up)), pending_(count) {}
  std::optional<Element> next() override {
    start();
    return up_->next();
  }
  int64_t skip(int64_t n) override {
    start();
    return up_->skip(n);
  }

 private:
  void start() {
    if (pending_ > 0) up_->skip(pending_);
    pending_ = 0;
  }
  std::unique_ptr<ElementIterator> up_;
  int64_t pending_;
};

class SkipNode : public DatasetNode {
 public:
  SkipNode(NodePtr up, int64_t count) : up_(std::move(up)), count_(count) {
    if (count_ < 0) TNT_INPUT_ERROR("Dataset::skip: count {} is negative (-1 skips all, as in tf.data)", count_);
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<SkipIterator>(up_->iterate(epoch), count_);
  }
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override {
    int64_t n = up_->cardinality();
    return n < 0 ? n : std::max<int64_t>(0, n - count_);
  }

 private:
  NodePtr up_;
  int64_t count_;
};

}  // namespace

Dataset Dataset::shuffle(int64_t buffer_size, uint64_t seed) const {
  return Dataset(std::make_shared<ShuffleNode>(node_, buffer_size, seed));
}
Dataset Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  return Dataset(std::make_shared<BatchNode>(node_, batch_size, drop_remainder));
}
Dataset Dataset::shard(int64_t num_shards, int64_t index) const {
  return Dataset(std::make_shared<ShardNode>(node_, num_shards, index));
}
Dataset Dataset::repeat(int64_t count) const { return Dataset(std::make_shared<RepeatNode>(node_, count)); }
// tf.data's -1: take all, skip all.
Dataset Dataset::take(int64_t count) const {
  return count == -1 ? *this : Dataset(std::make_shared<TakeNode>(node_, count));
}
Dataset Dataset::skip(int64_t count) const {
  if (count == -1) return Dataset(std::make_shared<TakeNode>(node_, 0));
  return Dataset(std::make_shared<SkipNode>(node_, count));
}

}  // namespace tnt
