// Automatic distribution: every rank walks the same stream, cuts it into global batches of
// B and keeps its own contiguous slice (see dataset.hpp for the layout and the padding
// rule). Internally a rank's samples carry two extra columns, a weight f32 () and the
// global batch's real-sample count i64 (); batching stacks them into (b,) columns that
// DistributedDataset::Iterator turns into Batch fields.
#include "data/dataset_node.hpp"

#include "tarantella/runtime.hpp"

#include <cstring>
#include <deque>
#include <utility>

namespace tnt {
namespace {

using detail::DatasetNode;
using detail::ElementIterator;
using detail::kInfinite;
using detail::kUnknown;
using detail::NodePtr;

void check_distribution(int64_t global_batch, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    TNT_INPUT_ERROR("distribute: rank {} is not in [0, {})", rank, size);
  }
  if (global_batch < 1) {
    TNT_INPUT_ERROR("distribute: global batch size {} must be at least 1", global_batch);
  }
  if (global_batch < size) {
    TNT_INPUT_ERROR(
        "distribute: global batch size {} is smaller than the number of ranks {}; every rank needs at "
        "least one sample per step, so use a global batch of at least {}",
        global_batch, size, size);
  }
}

int64_t steps_for(int64_t n, int64_t global_batch, Remainder remainder) {
  if (n < 0) return n;
  return remainder == Remainder::drop ? n / global_batch : (n + global_batch - 1) / global_batch;
}

Tensor scalar_i64(int64_t v) {
  Tensor t = Tensor::empty({}, DType::i64);
  *t.data<int64_t>() = v;
  return t;
}

class RankSliceIterator : public ElementIterator {
 public:
  RankSliceIterator(std::unique_ptr<ElementIterator> up, int64_t global_batch, int64_t offset, int64_t micro,
                    bool pad)
      : up_(std::move(up)), global_batch_(global_batch), offset_(offset), micro_(micro), pad_(pad),
        one_(Tensor::full({}, 1.0, DType::f32)), zero_(Tensor::full({}, 0.0, DType::f32)) {}

  std::optional<Element> next() override {
    if (ready_.empty() && !done_) fill();
    if (ready_.empty()) return std::nullopt;
    Element e = std::move(ready_.front());
    ready_.pop_front();
    return e;
  }

  // Whole global batches (a resumed epoch's first steps, n a multiple of this rank's
  // micro-batch) are skipped upstream without building their samples, except the last two:
  // they are read as usual, so that a padded partial batch (the last skipped one, or the
  // next) finds the same sample to copy as in a pass read from its start. Anything else is
  // read and dropped.
  int64_t skip(int64_t n) override {
    if (n <= 0 || !ready_.empty() || n % micro_ != 0) return ElementIterator::skip(n);
    const int64_t batches = n / micro_;
    int64_t skipped = 0;
    if (batches > 2 && !done_) {
      const int64_t want = (batches - 2) * global_batch_;
      const int64_t got = up_->skip(want);
      first_batch_ = false;
      skipped = got / global_batch_ * micro_;
      if (got < want) {  // the stream ended inside them
        done_ = true;
        if (got % global_batch_ > 0 && pad_) skipped += micro_;
        return skipped;
      }
    }
    return skipped + ElementIterator::skip(std::min<int64_t>(batches, 2) * micro_);
  }

 private:
  // Reads one global batch: steps over the ranks before this one, takes this rank's slice,
  // steps over the rest, and so learns the batch's real size n on every rank alike.
  void fill() {
    int64_t seen = 0;
    std::optional<Element> first_of_batch;
    if (pad_ && first_batch_ && offset_ > 0) {
      // Only needed if this very batch is partial and has nothing for this rank.
      first_of_batch = up_->next();
      if (first_of_batch) seen = 1 + up_->skip(offset_ - 1);
    } else {
      seen = up_->skip(offset_);
    }
    first_batch_ = false;
    std::vector<Element> mine;
    if (seen == offset_) {
      while (static_cast<int64_t>(mine.size()) < micro_) {
        auto e = up_->next();
        if (!e) break;
        mine.push_back(std::move(*e));
      }
      seen += static_cast<int64_t>(mine.size());
      if (static_cast<int64_t>(mine.size()) == micro_) seen += up_->skip(global_batch_ - offset_ - micro_);
    }
    if (seen < global_batch_) done_ = true;  // the stream ended inside this batch
    if (seen == 0 || (seen < global_batch_ && !pad_)) return;

    Tensor count = scalar_i64(seen);
    int64_t real = static_cast<int64_t>(mine.size());
    std::optional<Element> pad_source;
    if (real < micro_) {
      if (real > 0) pad_source = mine.back();
      else if (last_real_) pad_source = *last_real_;
      else pad_source = first_of_batch;
      TNT_CHECK(pad_source.has_value(), "distribute: no sample to pad with");  // seen > 0 rules this out
    }
    if (real > 0) last_real_ = mine.back();
    for (Element& e : mine) {
      e.push_back(one_);
      e.push_back(count);
      ready_.push_back(std::move(e));
    }
    for (int64_t i = real; i < micro_; ++i) {
      Element e = *pad_source;  // shares the sample's tensors; they are never written
      e.push_back(zero_);
      e.push_back(count);
      ready_.push_back(std::move(e));
    }
  }

  std::unique_ptr<ElementIterator> up_;
  int64_t global_batch_;
  int64_t offset_;
  int64_t micro_;
  bool pad_;
  Tensor one_;   // f32 (): weight of a real sample
  Tensor zero_;  // f32 (): weight of padding
  bool first_batch_ = true;
  bool done_ = false;
  std::optional<Element> last_real_;
  std::deque<Element> ready_;
};

class RankSliceNode : public DatasetNode {
 public:
  RankSliceNode(NodePtr up, int64_t global_batch, int64_t offset, int64_t micro, Remainder remainder)
      : up_(std::move(up)), global_batch_(global_batch), offset_(offset), micro_(micro), remainder_(remainder) {}
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<RankSliceIterator>(up_->iterate(epoch), global_batch_, offset_, micro_,
                                               remainder_ == Remainder::pad);
  }
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override {
    int64_t s = steps_for(up_->cardinality(), global_batch_, remainder_);
    return s < 0 ? s : s * micro_;
  }

 private:
  NodePtr up_;
  int64_t global_batch_;
  int64_t offset_;
  int64_t micro_;
  Remainder remainder_;
};

// Rows [begin, begin + real) of col, then copies of row pad_row up to b rows: (b, S...).
Tensor padded_rows(const Tensor& col, int64_t begin, int64_t real, int64_t b, int64_t pad_row) {
  if (real == b) return col.slice_rows(begin, begin + b);
  Shape shape = col.shape();
  shape[0] = b;
  Tensor out = Tensor::empty(shape, col.dtype());
  size_t row_bytes = col.dim(0) == 0 ? 0 : col.nbytes() / static_cast<size_t>(col.dim(0));
  const char* src = static_cast<const char*>(col.raw());
  char* dst = static_cast<char*>(out.raw());
  if (real > 0) std::memcpy(dst, src + begin * row_bytes, real * row_bytes);
  for (int64_t i = real; i < b; ++i) std::memcpy(dst + i * row_bytes, src + pad_row * row_bytes, row_bytes);
  return out;
}

class BatchedSliceIterator : public ElementIterator {
 public:
  BatchedSliceIterator(std::unique_ptr<ElementIterator> up, int64_t global_batch, int64_t offset, int64_t micro,
                       bool pad)
      : up_(std::move(up)), global_batch_(global_batch), offset_(offset), micro_(micro), pad_(pad) {}

  std::optional<Element> next() override {
    for (;;) {
      auto e = up_->next();
      if (!e) return std::nullopt;
      TNT_CHECK(!e->empty(), "distribute: a batch with no columns");
      int64_t m = (*e)[0].ndim() >= 1 ? (*e)[0].dim(0) : -1;
      for (size_t c = 0; c < e->size(); ++c) {
        const Tensor& t = (*e)[c];
        TNT_CHECK(t.device().is_cpu(), "distribute: column {} is on {}; datasets hold host tensors", c,
                  t.device().str());
        if (t.ndim() < 1 || t.dim(0) != m || m > global_batch_) {
          TNT_INPUT_ERROR(
              "distribute: a batched dataset must yield columns of at most {} rows (the global batch) with a "
              "common first dimension; column {} is {}",
              global_batch_, c, t.str());
        }
      }
      // Only the last batch may be partial: a short one before it means batches of another
      // size than the global batch declared (each would pass for a padded last batch).
      TNT_INPUT_CHECK(partial_rows_ == 0,
                      "distribute: a batched dataset gave a batch of {} rows before its last one; only the last may "
                      "hold fewer than the global batch of {} (batch the samples by the global batch)",
                      partial_rows_, global_batch_);
      if (m < global_batch_) partial_rows_ = m;
      if (m == 0 || (m < global_batch_ && !pad_)) continue;  // a partial batch is dropped
      int64_t real = std::clamp<int64_t>(m - offset_, 0, micro_);
      int64_t pad_row = real > 0 ? offset_ + real - 1 : 0;
      Element out;
      for (const Tensor& t : *e) out.push_back(padded_rows(t, offset_, real, micro_, pad_row));
      Tensor weights = Tensor::zeros({micro_}, DType::f32);  // (b,)
      std::fill_n(weights.data<float>(), real, 1.0f);
      out.push_back(weights);
      out.push_back(Tensor::full({micro_}, static_cast<double>(m), DType::i64));  // (b,)
      return out;
    }
  }

 private:
  std::unique_ptr<ElementIterator> up_;
  int64_t global_batch_;
  int64_t offset_;
  int64_t micro_;
  bool pad_;
  int64_t partial_rows_ = 0;  // a batch short of the global batch was seen: the last, or an error
};

class BatchedSliceNode : public DatasetNode {
 public:
  BatchedSliceNode(NodePtr up, int64_t global_batch, int64_t offset, int64_t micro, Remainder remainder)
      : up_(std::move(up)), global_batch_(global_batch), offset_(offset), micro_(micro), remainder_(remainder) {}
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    return std::make_unique<BatchedSliceIterator>(up_->iterate(epoch), global_batch_, offset_, micro_,
                                                  remainder_ == Remainder::pad);
  }
  // Without looking at the batches it is not known how many are partial.
  bool reshuffles() const override { return up_->reshuffles(); }
  bool order_depends_on_timing() const override { return up_->order_depends_on_timing(); }
  int64_t cardinality() const override {
    int64_t n = up_->cardinality();
    return n == kInfinite ? kInfinite : (remainder_ == Remainder::pad ? n : kUnknown);
  }

 private:
  NodePtr up_;
  int64_t global_batch_;
  int64_t offset_;
  int64_t micro_;
  Remainder remainder_;
};

}  // namespace

int64_t micro_batch_size(int64_t global_batch, int rank, int size) {
  check_distribution(global_batch, rank, size);
  return global_batch / size + (rank < global_batch % size ? 1 : 0);
}

int64_t micro_batch_offset(int64_t global_batch, int rank, int size) {
  check_distribution(global_batch, rank, size);
  return rank * (global_batch / size) + std::min<int64_t>(rank, global_batch % size);
}

DistributedDataset Dataset::distribute(int64_t global_batch, Remainder remainder) const {
  return DistributedDataset(*this, global_batch, tnt::rank(), tnt::size(), remainder);
}

DistributedDataset Dataset::distribute(int64_t global_batch, int rank, int size, Remainder remainder) const {
  return DistributedDataset(*this, global_batch, rank, size, remainder);
}

DistributedDataset::DistributedDataset(const Dataset& unbatched, int64_t global_batch, int rank, int size,
                                       Remainder remainder)
    : global_batch_(global_batch),
      micro_batch_(tnt::micro_batch_size(global_batch, rank, size)),
      offset_(tnt::micro_batch_offset(global_batch, rank, size)) {
  // Every rank walks the same stream and takes its slice of each global batch: a stream
  // whose order depends on timing gives each rank another order, so the slices overlap
  // (some samples trained twice an epoch, others never) without any error.
  TNT_INPUT_CHECK(size == 1 || !unbatched.node()->order_depends_on_timing(),
                  "distribute: the dataset's order depends on timing (interleave with deterministic=false and "
                  "num_parallel_calls > 1), so the {} ranks would each read another order and their slices would "
                  "overlap: some samples twice an epoch, others never; give deterministic=true (the read-ahead stays "
                  "parallel, in a fixed order), or shard() the files by rank before interleave",
                  size);
  samples_ = Dataset(std::make_shared<RankSliceNode>(unbatched.node(), global_batch_, offset_, micro_batch_, remainder));
  steps_ = steps_for(unbatched.node()->cardinality(), global_batch_, remainder);
}

DistributedDataset DistributedDataset::from_batched(const Dataset& batched, int64_t global_batch, int rank, int size,
                                                    Remainder remainder) {
  TNT_INPUT_CHECK(size == 1 || !batched.node()->order_depends_on_timing(),
                  "distribute: the batches' order depends on timing (interleave with deterministic=false and "
                  "num_parallel_calls > 1), so the {} ranks would each read another order and their slices would "
                  "overlap; give deterministic=true",
                  size);
  DistributedDataset d;
  d.global_batch_ = global_batch;
  d.micro_batch_ = tnt::micro_batch_size(global_batch, rank, size);
  d.offset_ = tnt::micro_batch_offset(global_batch, rank, size);
  d.from_batched_ = true;
  d.batched_ = Dataset(std::make_shared<BatchedSliceNode>(batched.node(), global_batch, d.offset_, d.micro_batch_, remainder));
  d.steps_ = d.batched_.node()->cardinality();
  return d;
}

DistributedDataset DistributedDataset::map(MapFn fn, int workers) const {
  TNT_CHECK(!from_batched_,
            "DistributedDataset::map: the dataset was distributed from batches; map the samples before batching");
  TNT_CHECK(static_cast<bool>(fn), "DistributedDataset::map: empty function");
  DistributedDataset d = *this;
  // The user's function sees the sample's own columns; the weight and count ride along.
  d.samples_ = samples_.map(
      [fn = std::move(fn)](Element e) {
        Tensor count = std::move(e.back());
        e.pop_back();
        Tensor weight = std::move(e.back());
        e.pop_back();
        Element out = fn(std::move(e));
        out.push_back(std::move(weight));
        out.push_back(std::move(count));
        return out;
      },
      workers);
  return d;
}

DistributedDataset DistributedDataset::prefetch(int64_t buffer_size) const {
  if (buffer_size < 1) {
    TNT_INPUT_ERROR("DistributedDataset::prefetch: buffer size {} must be at least 1", buffer_size);
  }
  DistributedDataset d = *this;
  d.prefetch_ = buffer_size;
  return d;
}

int64_t DistributedDataset::steps() const { return steps_ < 0 ? -1 : steps_; }

DistributedDataset::Iterator DistributedDataset::iterate(int64_t epoch, int64_t first_step) const {
  TNT_INPUT_CHECK(first_step >= 0, "DistributedDataset::iterate: first step {} is negative", first_step);
  Dataset batches = from_batched_ ? batched_ : samples_.batch(micro_batch_);
  if (first_step > 0) batches = batches.skip(first_step);  // before the prefetch: it never reads them
  if (prefetch_ > 0) batches = batches.prefetch(prefetch_);
  return Iterator(batches.iterate(epoch), global_batch_, micro_batch_, offset_, first_step);
}

DistributedDataset::Iterator::Iterator(Dataset::Iterator inner, int64_t global_batch, int64_t micro_batch,
                                       int64_t sample_offset, int64_t first_step)
    : inner_(std::move(inner)), global_batch_(global_batch), micro_batch_(micro_batch), sample_offset_(sample_offset),
      step_(first_step) {}

std::optional<Batch> DistributedDataset::Iterator::next() {
  auto e = inner_.next();
  if (!e) return std::nullopt;
  TNT_CHECK(e->size() >= 2, "DistributedDataset: a batch without its weight columns");
  Batch b;
  Tensor count = std::move(e->back());  // i64 (b,)
  e->pop_back();
  Tensor weights = std::move(e->back());  // f32 (b,): 1 real, 0 padding
  e->pop_back();
  b.columns = std::move(*e);
  b.micro_batch_size = weights.dim(0);
  TNT_CHECK(b.micro_batch_size == micro_batch_, "DistributedDataset: micro-batch of {} rows, expected {}",
            b.micro_batch_size, micro_batch_);
  // The per-sample weights only carry "real or padding" through per-sample maps; padding
  // is last (see the layout above), so from here on a count says it all.
  const float* w = weights.data<float>();
  while (b.real_samples < b.micro_batch_size && w[b.real_samples] != 0.0f) ++b.real_samples;
  for (int64_t i = b.real_samples; i < b.micro_batch_size; ++i) {
    TNT_CHECK(w[i] == 0.0f, "DistributedDataset: a real sample at row {} after padding at row {}", i, b.real_samples);
  }
  b.global_real_samples = count.data<int64_t>()[0];
  b.global_batch_size = global_batch_;
  b.sample_offset = sample_offset_;
  b.step = step_++;
  return b;
}

}  // namespace tnt
