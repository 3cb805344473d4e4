// The dropout mask on the CPU (the rule: tarantella/layers/dropout.hpp), for Dropout and
// for Dense's dropout: one loop over Philox blocks, OpenMP where the file builds with it.
#pragma once

#include "core/philox.hpp"

#include <cstdint>

namespace tnt::detail {

// f(i, keep) for i in [0, n), keep = uniform4(key, base + i) >= rate, on the CPU: one
// Philox block per four consecutive counters, drawn once (blocks [first, end); none for
// n == 0, where base + n - 1 would wrap). Elements go to OpenMP threads by block.
template <typename F>
void for_each_dropout_keep(uint64_t key, uint64_t base, int64_t n, float rate, F f) {
  const auto first = static_cast<int64_t>(base >> 2);
  const int64_t end = n == 0 ? first : static_cast<int64_t>((base + static_cast<uint64_t>(n) - 1) >> 2) + 1;
#pragma omp parallel for schedule(static) if (n > 8192)
  for (int64_t q = first; q < end; ++q) {
    uint32_t words[4];
    philox::block(key, static_cast<uint64_t>(q), 0, words);
    for (int w = 0; w < 4; ++w) {
      const uint64_t c = (static_cast<uint64_t>(q) << 2) + static_cast<uint64_t>(w);
      if (c < base || c >= base + static_cast<uint64_t>(n)) continue;
      f(static_cast<int64_t>(c - base), philox::word_uniform(words[w]) >= rate);
    }
  }
}

}  // namespace tnt::detail
