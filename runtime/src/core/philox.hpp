// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// written once for host and device so that CPU and CUDA draw identical numbers.
//
// The recipe every engine follows:
//   block(key, counter) = philox4x32_10(ctr = {lo32(counter), hi32(counter), 0, 0},
//                                        key = {lo32(key), hi32(key)})
//   bits(key, i)    = block(key, i)[0]
//   uniform(key, i) = (bits >> 8) * 2^-24                       in [0, 1), exact in float
//   normal(key, i)  = sqrt(-2 ln u1) cos(2 pi u2), u1 = ((block[0] >> 8) + 1) * 2^-24,
//                     u2 = (block[1] >> 8) * 2^-24              (host: computed in double)
// Dropout layers keep element i when uniform4(key, offset + i) >= float(rate), where
//   uniform4(key, c) = (block(key, c / 4)[c % 4] >> 8) * 2^-24
// (all four words of a block, for four consecutive counters: a quarter of the blocks).
// So does the attention core's dropout (layers/attention_cuda.hpp), per probability.
#pragma once

#include "core/host_device.hpp"

#include <cstdint>

#if !defined(__CUDACC__)
#include <cmath>
#include <numbers>
#endif


namespace tnt::philox {

TNT_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// The bare generator: 4 counter words and 2 key words in, 4 words out.
TNT_HD void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// Our use: counter = element index, attempt in ctr[2] (the truncated normal's resampling).
TNT_HD void block(uint64_t key, uint64_t counter, uint32_t attempt, uint32_t out[4]) {
  const uint32_t ctr[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), attempt, 0};
  const uint32_t k[2] = {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  philox4x32_10(ctr, k, out);
}

TNT_HD uint32_t bits(uint64_t key, uint64_t counter) {
  uint32_t out[4];
  block(key, counter, 0, out);
  return out[0];
}

TNT_HD float uniform(uint64_t key, uint64_t counter) {
  return static_cast<float>(bits(key, counter) >> 8) * (1.0f / 16777216.0f);
}
// One word as a uniform in [0, 1): its top 24 bits.
TNT_HD float word_uniform(uint32_t word) { return static_cast<float>(word >> 8) * (1.0f / 16777216.0f); }
TNT_HD float uniform4(uint64_t key, uint64_t counter) {
  uint32_t out[4];
  block(key, counter >> 2, 0, out);
  return word_uniform(out[counter & 3]);
}

#if !defined(__CUDACC__)
// Host only (double precision): the normal of the recipe above.
inline constexpr double kTwoPow24 = 16777216.0;

// Two independent standard normals from one Philox block.
inline void box_muller(const uint32_t block[4], double& z0, double& z1) {
  double u1 = (static_cast<double>(block[0] >> 8) + 1.0) / kTwoPow24;  // (0, 1]: log is finite
  double u2 = static_cast<double>(block[1] >> 8) / kTwoPow24;
  double r = std::sqrt(-2.0 * std::log(u1));
  z0 = r * std::cos(2.0 * std::numbers::pi * u2);
  z1 = r * std::sin(2.0 * std::numbers::pi * u2);
}
#endif

}  // namespace tnt::philox
