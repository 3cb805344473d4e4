// The 2x2 stride-2 max pooling rows of the CPU (layers/max_pool_2x2_cpu.hpp): the AVX2
// runs of 8 windows (masked at a row's end) against the one-window-at-a-time loop that
// builds without AVX2 use, bit for bit: values, argmax, gradients, with and without ReLU.
// The layers' tests compare the pooling with the NHWC engine and the fused chain with the
// two layers; this one reaches the scalar loop, which those builds never run.
#include <catch2/catch.hpp>

#include "layers/max_pool_2x2_cpu.hpp"
#include "tarantella/random.hpp"

#include <cstring>
#include <limits>
#include <vector>

using namespace tnt;

namespace {

// Values from {-1, -0, 0, NaN, 1, 2} and (-1, 1): every kind of window comes up.
std::vector<float> awkward(size_t n, uint64_t seed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float pick[] = {-1.0f, -0.0f, 0.0f, nan, 1.0f, 2.0f};
  CounterRng rng(seed, "max_pool_2x2");
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const double u = rng.uniform(2 * i);
    v[i] = u < 0.6 ? pick[rng.bits(2 * i + 1) % 6] : static_cast<float>(2 * u - 1);
  }
  return v;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <bool kReLU>
void check_rows(int32_t w) {
  const int64_t wo = w / 2;
  const int32_t base = 6 * w;  // the row pair's place in its plane (output row 3)
  const std::vector<float> x = awkward(static_cast<size_t>(2 * w), static_cast<uint64_t>(w));
  std::vector<float> y1(static_cast<size_t>(wo)), y2(y1);
  std::vector<int32_t> a1(static_cast<size_t>(wo)), a2(a1);
  detail::max_pool_2x2_row<kReLU>(x.data(), x.data() + w, y1.data(), a1.data(), wo, base, w);
  detail::max_pool_2x2_row_scalar<kReLU>(x.data(), x.data() + w, y2.data(), a2.data(), 0, wo, base, w);
  CHECK(same_bits(y1, y2));
  CHECK(same_bits(a1, a2));
  for (int64_t i = 0; i < wo; ++i) {  // each argmax lies in its window
    const int32_t rel = a1[static_cast<size_t>(i)] - base - static_cast<int32_t>(2 * i);
    CHECK((rel == 0 || rel == 1 || rel == w || rel == w + 1));
  }
  const std::vector<float> dy = awkward(static_cast<size_t>(wo), static_cast<uint64_t>(w) + 100);
  for (const float* relu_y : {static_cast<const float*>(nullptr), static_cast<const float*>(y1.data())}) {
    INFO("ReLU's backward too: " << (relu_y != nullptr));
    std::vector<float> d1(static_cast<size_t>(2 * w), 7.0f), d2(d1);
    detail::max_pool_2x2_row_backward(dy.data(), a1.data(), d1.data(), d1.data() + w, wo, base, w, relu_y);
    detail::max_pool_2x2_row_backward_scalar(dy.data(), a1.data(), d2.data(), d2.data() + w, 0, wo, base, w, relu_y);
    CHECK(same_bits(d1, d2));
    // An odd width's last column is left alone (the plane loop zeroes it).
    if (w % 2 == 1) CHECK((d1[static_cast<size_t>(w - 1)] == 7.0f && d1[static_cast<size_t>(2 * w - 1)] == 7.0f));
  }
}

}  // namespace

TEST_CASE("max pooling 2x2: AVX2 runs and the scalar loop give the same bits", "[pooling]") {
#if !defined(__AVX2__)
  FAIL("built without AVX2: the library's runs of 8 windows are not compared (tests/layers/CMakeLists.txt)");
#endif
  for (int32_t w = 2; w <= 41; ++w) {  // 1 to 20 windows: every mask width, one and two runs
    INFO("width " << w);
    check_rows<false>(w);
    check_rows<true>(w);
  }
}
