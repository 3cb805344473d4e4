// Dropout's keep decisions of 8 consecutive elements on CUDA (the rule:
// tarantella/layers/dropout.hpp), for the kernels that take 8 elements a thread
// (dropout_cuda.cu's contiguous forward, dense_cuda.cu's epilogue).
#pragma once

#include "core/philox.hpp"

#include <cstdint>

namespace tnt::cuda {

// keep[e] = uniform4(key, c0 + e) >= rate for e < count (<= 8), false beyond: the 2 or 3
// Philox blocks that counters c0 .. c0 + count - 1 lie in, each drawn once.
__device__ __forceinline__ void dropout_keep8(uint64_t key, uint64_t c0, int count, float rate, bool (&keep)[8]) {
  const uint64_t b0 = c0 >> 2, b_last = (c0 + static_cast<uint64_t>(count) - 1) >> 2;
  uint32_t words[12];
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    if (b0 + static_cast<uint64_t>(k) <= b_last) philox::block(key, b0 + static_cast<uint64_t>(k), 0, words + 4 * k);
  }
  const int off = static_cast<int>(c0 & 3);
#pragma unroll
  for (int e = 0; e < 8; ++e) keep[e] = e < count && philox::word_uniform(words[off + e]) >= rate;
}

}  // namespace tnt::cuda
