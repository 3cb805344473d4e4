// Dataset sources: in-memory columns, synthetic data, generators and random-access
// functions. The random-access ones skip without building elements.
#include "data/dataset_node.hpp"

#include "core/half.hpp"

#include <cmath>
#include <cstring>
#include <utility>

namespace tnt {
namespace {

using detail::ElementIterator;
using detail::DatasetNode;

// Any source whose element i can be built on its own.
class IndexedIterator : public ElementIterator {
 public:
  IndexedIterator(int64_t count, std::function<Element(int64_t)> get) : count_(count), get_(std::move(get)) {}
  std::optional<Element> next() override {
    if (pos_ >= count_) return std::nullopt;
    return get_(pos_++);
  }
  int64_t skip(int64_t n) override {
    int64_t k = std::min(n, count_ - pos_);
    if (k <= 0) return 0;
    pos_ += k;
    return k;
  }

 private:
  int64_t count_;
  int64_t pos_ = 0;
  std::function<Element(int64_t)> get_;
};

class TensorsNode : public DatasetNode {
 public:
  explicit TensorsNode(std::vector<Tensor> columns) : columns_(std::move(columns)) {
    TNT_INPUT_CHECK(!columns_.empty(), "Dataset::from_tensors: no columns");
    for (size_t c = 0; c < columns_.size(); ++c) {
      const Tensor& t = columns_[c];
      TNT_INPUT_CHECK(t.defined() && t.ndim() >= 1, "Dataset::from_tensors: column {} has no leading dimension", c);
      TNT_INPUT_CHECK(t.device().is_cpu(), "Dataset::from_tensors: column {} is on {}; datasets hold host tensors",
                c, t.device().str());
      TNT_INPUT_CHECK(t.dim(0) == columns_[0].dim(0),
                      "Dataset::from_tensors: column {} has {} rows but column 0 has {}", c, t.dim(0),
                      columns_[0].dim(0));
    }
  }
  std::unique_ptr<ElementIterator> iterate(int64_t) const override {
    auto columns = columns_;
    return std::make_unique<IndexedIterator>(cardinality(), [columns](int64_t i) {
      Element e;
      e.reserve(columns.size());
      for (const Tensor& t : columns) {
        Shape row(t.shape().begin() + 1, t.shape().end());  // one sample: drop the N
        e.push_back(t.slice_rows(i, i + 1).reshape(row));
      }
      return e;
    });
  }
  int64_t cardinality() const override { return columns_[0].dim(0); }

 private:
  std::vector<Tensor> columns_;  // each (N, ...)
};

void fill_synthetic(Tensor& t, const SyntheticColumn& spec, uint64_t key) {
  detail::SplitMix64 rng(key);
  int64_t n = t.numel();
  double lo = spec.low, span = spec.high - spec.low;
  auto uniform = [&] { return lo + span * (static_cast<double>(rng.next() >> 11) * 0x1.0p-53); };  // [lo, hi)
  uint64_t range = static_cast<uint64_t>(std::max(1.0, std::floor(span)));
  int64_t base = static_cast<int64_t>(std::floor(lo));
  auto integer = [&] { return base + static_cast<int64_t>(rng.below(range)); };
  // The dtype is resolved once; the loops stay free of checks.
  auto fill = [&](auto* p, auto draw) {
    for (int64_t j = 0; j < n; ++j) p[j] = draw();
  };
  void* raw = t.raw();
  switch (spec.dtype) {
    case DType::f32: fill(static_cast<float*>(raw), [&] { return static_cast<float>(uniform()); }); break;
    case DType::f64: fill(static_cast<double*>(raw), uniform); break;
    case DType::f16: fill(static_cast<uint16_t*>(raw), [&] { return float_to_f16(static_cast<float>(uniform())); }); break;
    case DType::bf16: fill(static_cast<uint16_t*>(raw), [&] { return float_to_bf16(static_cast<float>(uniform())); }); break;
    case DType::i32: fill(static_cast<int32_t*>(raw), [&] { return static_cast<int32_t>(integer()); }); break;
    case DType::i64: fill(static_cast<int64_t*>(raw), integer); break;
    case DType::u8: fill(static_cast<uint8_t*>(raw), [&] { return static_cast<uint8_t>(integer()); }); break;
  }
}

class SyntheticNode : public DatasetNode {
 public:
  SyntheticNode(std::vector<SyntheticColumn> columns, int64_t count, uint64_t seed)
      : columns_(std::move(columns)), count_(count), seed_(seed) {
    if (count_ < 0) TNT_INPUT_ERROR("Dataset::synthetic: count {} is negative", count_);
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (!(columns_[c].high > columns_[c].low)) {
        TNT_INPUT_ERROR("Dataset::synthetic: column {} has low {} >= high {}", c,
                        columns_[c].low, columns_[c].high);
      }
      // An integer column's values must fit its dtype (before: u8 over [0, 1000) wrapped,
      // i64 over +-1e19 gave INT64_MIN).
      const DType dt = columns_[c].dtype;
      const double most = dt == DType::u8 ? 256.0 : dt == DType::i32 ? 2147483648.0 : dt == DType::i64 ? 9.2e18 : 0;
      const double least = dt == DType::u8 ? 0.0 : -most;
      if (most > 0 && (columns_[c].low < least || columns_[c].high > most)) {
        TNT_INPUT_ERROR("Dataset::synthetic: column {} draws from [{}, {}), beyond what {} holds ([{}, {}))", c,
                        columns_[c].low, columns_[c].high, dtype_name(dt), least, most);
      }
    }
  }
  std::unique_ptr<ElementIterator> iterate(int64_t) const override {
    auto columns = columns_;
    uint64_t seed = seed_;
    return std::make_unique<IndexedIterator>(count_, [columns, seed](int64_t i) {
      Element e;
      for (size_t c = 0; c < columns.size(); ++c) {
        Tensor t = Tensor::empty(columns[c].shape, columns[c].dtype);
        // One stream per (seed, column, index): element i is the same whatever is read
        // before it.
        uint64_t key = detail::mix64(seed ^ detail::mix64(c + 1) ^ detail::mix64(~static_cast<uint64_t>(i)));
        fill_synthetic(t, columns[c], key);
        e.push_back(std::move(t));
      }
      return e;
    });
  }
  int64_t cardinality() const override { return count_; }

 private:
  std::vector<SyntheticColumn> columns_;
  int64_t count_;
  uint64_t seed_;
};

class GeneratorIterator : public ElementIterator {
 public:
  explicit GeneratorIterator(ElementFn fn) : fn_(std::move(fn)) {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    auto e = fn_();
    if (!e) done_ = true;  // a generator is not asked again once it has ended
    return e;
  }

 private:
  ElementFn fn_;
  bool done_ = false;
};

class GeneratorNode : public DatasetNode {
 public:
  GeneratorNode(std::function<ElementFn(int64_t)> make, int64_t cardinality)
      : make_(std::move(make)), cardinality_(cardinality < 0 ? detail::kUnknown : cardinality) {
    TNT_CHECK(static_cast<bool>(make_), "Dataset::generator: empty function");
  }
  std::unique_ptr<ElementIterator> iterate(int64_t epoch) const override {
    ElementFn fn = make_(epoch);
    TNT_CHECK(static_cast<bool>(fn), "Dataset::generator: make({}) returned an empty function", epoch);
    return std::make_unique<GeneratorIterator>(std::move(fn));
  }
  int64_t cardinality() const override { return cardinality_; }

 private:
  std::function<ElementFn(int64_t)> make_;
  int64_t cardinality_;
};

class FunctionNode : public DatasetNode {
 public:
  FunctionNode(int64_t count, std::function<Element(int64_t)> get) : count_(count), get_(std::move(get)) {
    if (count_ < 0) TNT_INPUT_ERROR("Dataset::from_function: count {} is negative", count_);
    TNT_CHECK(static_cast<bool>(get_), "Dataset::from_function: empty function");
  }
  std::unique_ptr<ElementIterator> iterate(int64_t) const override {
    return std::make_unique<IndexedIterator>(count_, get_);
  }
  int64_t cardinality() const override { return count_; }

 private:
  int64_t count_;
  std::function<Element(int64_t)> get_;
};

}  // namespace

Dataset Dataset::from_tensors(std::vector<Tensor> columns) {
  return Dataset(std::make_shared<TensorsNode>(std::move(columns)));
}

Dataset Dataset::synthetic(std::vector<SyntheticColumn> columns, int64_t count, uint64_t seed) {
  return Dataset(std::make_shared<SyntheticNode>(std::move(columns), count, seed));
}

Dataset Dataset::generator(std::function<ElementFn(int64_t)> make, int64_t cardinality) {
  return Dataset(std::make_shared<GeneratorNode>(std::move(make), cardinality));
}

Dataset Dataset::from_function(int64_t count, std::function<Element(int64_t)> get) {
  return Dataset(std::make_shared<FunctionNode>(count, std::move(get)));
}

}  // namespace tnt
