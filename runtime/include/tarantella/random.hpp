// The counter-based random generator of the runtime: a value depends only on (seed, key,
// counter), never on a stream position, so it is the same on every device and rank count.
#pragma once

#include <cstdint>
#include <string>

namespace tnt {

// Stateless generator: Philox-4x32-10 with a 64-bit key derived from (seed, key string),
// counter = element index. The exact bit recipe is in runtime/src/core/philox.hpp, which
// CUDA kernels share, so a mask drawn on the GPU equals the one drawn on the CPU.
class CounterRng {
 public:
  CounterRng(uint64_t seed, const std::string& key);
  CounterRng(uint64_t seed, uint64_t key);
  uint32_t bits(uint64_t counter) const;     // 32 random bits for element `counter`
  float uniform(uint64_t counter) const;     // [0, 1), a multiple of 2^-24
  double normal(uint64_t counter) const;     // standard normal (Box-Muller on one block)
  uint64_t key() const { return key_; }      // the Philox key (for device kernels)

 private:
  uint64_t key_;
};

uint64_t hash_string(const std::string& text);  // FNV-1a 64

}  // namespace tnt
