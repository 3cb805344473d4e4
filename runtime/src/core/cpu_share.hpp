// The cores a rank can use without taking them from the other ranks on its node
// (tnt::rank_cores, tarantella/runtime.hpp), from every local rank's CPU affinity mask.
// Plain C++ over bit masks, for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tnt::detail {

// masks[r]: local rank r's CPUs, one bit each (word w, bit b: CPU 64 w + b). Each CPU of
// masks[me] counts 1/k where k local ranks' masks hold it; the sum rounded down, at least 1.
inline int cpu_share(const std::vector<std::vector<uint64_t>>& masks, std::size_t me) {
  double share = 0;
  const std::vector<uint64_t>& mine = masks.at(me);
  for (std::size_t w = 0; w < mine.size(); ++w)
    for (int b = 0; b < 64; ++b) {
      const uint64_t bit = uint64_t{1} << b;
      if (!(mine[w] & bit)) continue;
      int k = 0;
      for (const auto& m : masks) k += w < m.size() && (m[w] & bit) ? 1 : 0;
      share += 1.0 / k;
    }
  const int cores = static_cast<int>(share + 1e-9);
  return cores > 0 ? cores : 1;
}

}  // namespace tnt::detail
