// Exactly checkable data for the collective tests: small integers (as floats too), so
// every sum over up to 8 ranks is exact in every dtype and can be compared bit for bit.
#pragma once

#include "tarantella/dtype.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tnt::test {

// Rank r's value at element i.
template <typename T>
T value(int64_t i, int r) {
  int64_t base = (i * 7 + static_cast<int64_t>(r) * 13) % 31 - 15;  // [-15, 15]
  if constexpr (std::is_same_v<T, int64_t>) {
    // Above 2^32, so a reduction done in 32 bits would show.
    return base * (int64_t{1} << 33) + r;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return static_cast<int32_t>(base * 100000 + r);
  } else {
    return static_cast<T>(base);
  }
}

template <typename T>
T sum_over_ranks(int64_t i, int p) {
  T s = 0;
  for (int r = 0; r < p; ++r) s = static_cast<T>(s + value<T>(i, r));
  return s;
}

// A value no test data takes: written around and into buffers before each run.
template <typename T>
T poison() {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(-12345.5);
  } else {
    return static_cast<T>(-987654321);
  }
}

// Bitwise equality (so -0.0 vs 0.0 or a NaN would count as wrong).
template <typename T>
bool same(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace tnt::test
