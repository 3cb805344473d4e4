// CounterRng and the initialisers: known Philox vectors, reproducibility, statistics,
// independence of the construction order.
#include "gradcheck.hpp"

#include "core/philox.hpp"
#include "tarantella/layers.hpp"

#include <cmath>

using namespace tnt;

TEST_CASE("Philox-4x32-10 matches the published known-answer vectors", "[init]") {
  // Random123's kat_vectors for philox4x32_10: (counter, key) -> output.
  uint32_t out[4];
  philox::block(0, 0, 0, out);
  CHECK(out[0] == 0x6627e8d5u);
  CHECK(out[1] == 0xe169c58du);
  CHECK(out[2] == 0xbc57ac4cu);
  CHECK(out[3] == 0x9b00dbd8u);
  const uint32_t ones_ctr[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  const uint32_t ones_key[2] = {0xffffffffu, 0xffffffffu};
  philox::philox4x32_10(ones_ctr, ones_key, out);
  CHECK(out[0] == 0x408f276du);
  CHECK(out[1] == 0x41c83b0eu);
  CHECK(out[2] == 0xa20bc7c6u);
  CHECK(out[3] == 0x6d5451fdu);
  const uint32_t pi_ctr[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  const uint32_t pi_key[2] = {0xa4093822u, 0x299f31d0u};
  philox::philox4x32_10(pi_ctr, pi_key, out);
  CHECK(out[0] == 0xd16cfe09u);
  CHECK(out[1] == 0x94fdccebu);
  CHECK(out[2] == 0x5001e420u);
  CHECK(out[3] == 0x24126ea1u);
}

TEST_CASE("CounterRng: reproducible, keyed, in range", "[init]") {
  CounterRng a(42, "conv1.weight"), b(42, "conv1.weight"), c(43, "conv1.weight"), d(42, "conv2.weight");
  int same_c = 0, same_d = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    CHECK(a.bits(i) == b.bits(i));
    same_c += a.bits(i) == c.bits(i);
    same_d += a.bits(i) == d.bits(i);
    float u = a.uniform(i);
    CHECK(u >= 0.0f);
    CHECK(u < 1.0f);
  }
  CHECK(same_c < 3);  // 32-bit collisions: expected 1000 / 2^32
  CHECK(same_d < 3);
  CHECK(a.key() == b.key());
  CHECK(a.key() != c.key());
  // The first value of a stream never depends on how many values were drawn before.
  CHECK(CounterRng(42, "conv1.weight").normal(500) == a.normal(500));
}

namespace {
struct Stats {
  double mean = 0, stddev = 0, min = 1e300, max = -1e300;
};
Stats stats(const Tensor& t) {
  std::vector<double> v = t.to_double_vector();
  Stats s;
  for (double x : v) {
    s.mean += x;
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
  }
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = std::sqrt(s.stddev / static_cast<double>(v.size()));
  return s;
}
Tensor init(const Shape& shape, Initializer i, const std::string& name = "w") {
  Tensor t = Tensor::empty(shape);
  i.apply(t, 1234, name);
  return t;
}
}  // namespace

TEST_CASE("initialiser statistics", "[init]") {
  // 2^16 values: a sample mean has stddev sigma / 256, a sample stddev a relative stddev of
  // about 1 / sqrt(2 * 2^16) = 0.28%. Tolerances: 5 sigma of the mean (0.02 sigma) and 2%
  // of the stddev (7 of its sigmas; the uniform's stddev estimate is tighter still).
  const Shape shape{256, 64, 2, 2};  // fan_in = 256, fan_out = 1024
  const double fan_in = 256, fan_out = 1024;
  auto check = [&](Initializer i, double mean, double stddev) {
    Stats s = stats(init(shape, i));
    INFO(i.str());
    CHECK(s.mean == Approx(mean).margin(0.02 * stddev));
    CHECK(s.stddev == Approx(stddev).epsilon(0.02));
    return s;
  };
  Stats gu = check(Initializer::glorot_uniform(), 0, std::sqrt(6 / (fan_in + fan_out)) / std::sqrt(3.0));
  CHECK(gu.max < std::sqrt(6 / (fan_in + fan_out)));
  CHECK(gu.min >= -std::sqrt(6 / (fan_in + fan_out)));
  check(Initializer::glorot_normal(), 0, std::sqrt(2 / (fan_in + fan_out)));
  check(Initializer::he_uniform(), 0, std::sqrt(6 / fan_in) / std::sqrt(3.0));
  check(Initializer::he_normal(), 0, std::sqrt(2 / fan_in));
  Stats u = check(Initializer::uniform(2, 4), 3, 2 / std::sqrt(12.0));
  CHECK(u.min >= 2);
  CHECK(u.max < 4);
  check(Initializer::normal(-1, 0.5), -1, 0.5);
  // N(0, s) truncated to +-2s has stddev 0.8796 s.
  Stats t = check(Initializer::truncated_normal(1, 0.1), 1, 0.1 * 0.87962566);
  CHECK(t.min >= 1 - 0.2 - 1e-6);
  CHECK(t.max <= 1 + 0.2 + 1e-6);
  CHECK(init({3}, Initializer::constant(2.5)).to_vector() == std::vector<float>{2.5f, 2.5f, 2.5f});
  CHECK(init({2}, Initializer::ones()).to_vector() == std::vector<float>{1, 1});
  CHECK_THROWS_WITH(init({2}, Initializer::normal(0, -1), "neg"), Catch::Contains("neg"));
}

TEST_CASE("initial weights depend on seed and name, not on construction order", "[init]") {
  auto make = [](bool reversed) {
    std::vector<LayerPtr> layers;
    auto conv = std::make_shared<Conv2D>(4, 3, Conv2DOptions{}, "features.conv");
    auto fc = std::make_shared<Dense>(5, DenseOptions{}, "classifier.fc");
    if (reversed) {
      fc->ensure_built({{1, 7}});
      conv->ensure_built({{1, 2, 5, 5}});
    } else {
      conv->ensure_built({{1, 2, 5, 5}});
      fc->ensure_built({{1, 7}});
    }
    if (reversed) {
      fc->initialize(99);
      conv->initialize(99);
    } else {
      conv->initialize(99);
      fc->initialize(99);
    }
    return std::make_pair(conv, fc);
  };
  auto [c1, f1] = make(false);
  auto [c2, f2] = make(true);
  CHECK(c1->weight().value.to_vector() == c2->weight().value.to_vector());
  CHECK(f1->weight().value.to_vector() == f2->weight().value.to_vector());
  // A different seed gives different weights.
  c2->initialize(100);
  CHECK(c1->weight().value.to_vector() != c2->weight().value.to_vector());
  // Default biases are zero, weights glorot-uniform bounded.
  CHECK(c1->bias()->value.to_vector() == std::vector<float>(4, 0.0f));
  const double limit = std::sqrt(6.0 / (2 * 9 + 4 * 9));
  for (float w : c1->weight().value.to_vector()) CHECK(std::fabs(w) <= limit);
}
