// CounterRng: a Philox key derived from (seed, key), then pure functions of the counter.
#include "tarantella/random.hpp"

#include "core/philox.hpp"

namespace tnt {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t hash_string(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

CounterRng::CounterRng(uint64_t seed, uint64_t key) : key_(splitmix64(splitmix64(seed) ^ key)) {}
CounterRng::CounterRng(uint64_t seed, const std::string& key) : CounterRng(seed, hash_string(key)) {}

uint32_t CounterRng::bits(uint64_t counter) const { return philox::bits(key_, counter); }
float CounterRng::uniform(uint64_t counter) const { return philox::uniform(key_, counter); }

double CounterRng::normal(uint64_t counter) const {
  uint32_t block[4];
  philox::block(key_, counter, 0, block);
  double z0, z1;
  philox::box_muller(block, z0, z1);
  return z0;
}

}  // namespace tnt
