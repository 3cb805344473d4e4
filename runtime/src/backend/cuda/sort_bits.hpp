// How many low bits a radix sort must look at to order keys 0 .. max_key: the sort of
// Embedding's ids by id (layers/embedding_cuda.cu) passes this as end_bit, so a vocabulary
// of 32000 ids costs 15 bits of passes rather than 32. Plain C++, unit-tested on the host
// (tests/core/test_elementwise_plan.cpp).
#pragma once

#include <cstdint>

namespace tnt::cuda {

// At least 1 (a sort over zero bits is not a sort), at most 64.
constexpr int radix_key_bits(uint64_t max_key) {
  int bits = 1;
  while (bits < 64 && (max_key >> bits) != 0) ++bits;
  return bits;
}

}  // namespace tnt::cuda
