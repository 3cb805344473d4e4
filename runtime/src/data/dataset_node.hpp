// The stages behind tnt::Dataset. A DatasetNode is an immutable description of a stage
// (shared between Dataset copies); iterate(epoch) creates the mutable ElementIterator of
// one pass. Each stage holds its upstream node and builds its upstream iterator inside
// its own. Cardinality keeps "infinite" and "unknown" apart inside (so take(n) of an
// infinite stream has n elements); the public API reports both as -1.
#pragma once

#include "tarantella/dataset.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace tnt::detail {

constexpr int64_t kInfinite = -1;
constexpr int64_t kUnknown = -2;

class ElementIterator {
 public:
  virtual ~ElementIterator() = default;
  virtual std::optional<Element> next() = 0;
  // Steps over up to n elements and returns how many there were. Random-access sources
  // (and stages in front of them that are one-to-one) do this without building elements;
  // the default builds and drops them.
  virtual int64_t skip(int64_t n);
};

class DatasetNode {
 public:
  virtual ~DatasetNode() = default;
  virtual std::unique_ptr<ElementIterator> iterate(int64_t epoch) const = 0;
  virtual int64_t cardinality() const = 0;  // >= 0, kInfinite or kUnknown
  // Whether the order of elements differs between epochs (a shuffle here or upstream).
  virtual bool reshuffles() const { return false; }
  // Whether the order of elements depends on timing (interleave with deterministic=false and
  // read-ahead threads): ranks that each read it would read different orders.
  virtual bool order_depends_on_timing() const { return false; }
};

using NodePtr = std::shared_ptr<const DatasetNode>;

// Stacks column `column` of every element into (b, S...): all must be host tensors of one
// shape S and one dtype. `what` names the stage in error messages.
Tensor stack_column(const std::vector<Element>& elements, size_t column, const char* what);

// Deterministic 64-bit generator (splitmix64): the same numbers on every platform, unlike
// std:: distributions, which is what makes shuffles reproducible across machines.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_++); }  // mix64 of a counter is splitmix64
  // Uniform in [0, n): the high half of a 64x64 product (bias below n / 2^64).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace tnt::detail
