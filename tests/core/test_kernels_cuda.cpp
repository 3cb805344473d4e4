// Generic CUDA kernels against the host: fill and f32 <-> f16/bf16 casts bit for bit
// (both sides round to nearest even), and tarantella/ops.hpp on CUDA against the CPU.
#include "gpu_test_util.hpp"

#include "backend/cuda/kernels.hpp"
#include "core/half.hpp"
#include "tarantella/ops.hpp"

#include <cstring>
#include <limits>

using namespace tnt;
using tnt::test::gpu;

namespace {

std::vector<uint16_t> bits16(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  std::vector<uint16_t> out(static_cast<size_t>(h.numel()));
  std::memcpy(out.data(), h.raw(), h.nbytes());
  return out;
}

// Values around every edge of the 16-bit formats: zeros, subnormals of f16 and bf16,
// exact ties (round to even), the largest finite values and overflow, infinities, NaN.
std::vector<float> edge_values() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 1.0f / 3.0f, 65504.0f, 65519.0f, 65520.0f, 1e5f,
                          -1e5f, 6.1035156e-05f /* f16 min normal */, 5.9604645e-08f /* f16 min subnormal */,
                          2.9802322e-08f /* half of it: a tie to 0 */, 8.9406967e-08f /* 1.5 units: tie to 2 */,
                          1e-40f /* f32 subnormal */, 3.3895314e38f /* near bf16 max */, 3.4028235e38f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  // Ties in the bf16 and f16 mantissas: 1 + k/2^8 + 2^-8 (bf16) and 1 + 2^-11 (f16).
  for (int k = 0; k < 8; ++k) {
    v.push_back(1.0f + static_cast<float>(k) / 128.0f + 1.0f / 256.0f);
    v.push_back(1.0f + static_cast<float>(k) / 1024.0f + 1.0f / 2048.0f);
  }
  Tensor r = test::random_tensor({1000}, "cast_random", -70000.0f, 70000.0f);
  for (float x : r.to_vector()) v.push_back(x);
  Tensor s = test::random_tensor({1000}, "cast_small", -1e-4f, 1e-4f);
  for (float x : s.to_vector()) v.push_back(x);
  return v;
}

}  // namespace

TEST_CASE("fill on the GPU writes the host's bytes for every dtype", "[gpu][kernels]") {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    for (double value : {0.0, 1.0, -2.5, 0.1, 100.0}) {
      if ((dt == DType::u8) && value < 0) continue;
      INFO(dtype_name(dt) << " " << value);
      Tensor d = Tensor::empty({1001}, dt, gpu());
      cuda::fill(d, value);
      Tensor h = Tensor::full({1001}, value, dt);
      Tensor back = d.to(Device::cpu());
      CHECK(std::memcmp(back.raw(), h.raw(), h.nbytes()) == 0);
    }
  }
}

TEST_CASE("f32 -> f16 and bf16 on the GPU round like the host conversions", "[gpu][kernels]") {
  std::vector<float> v = edge_values();
  Tensor host = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  Tensor dev = host.to(gpu());
  std::vector<uint16_t> f16 = bits16(cuda::cast(dev, DType::f16));
  std::vector<uint16_t> bf16 = bits16(cuda::cast(dev, DType::bf16));
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("value " << v[i] << " (index " << i << ")");
    if (std::isnan(v[i])) {
      CHECK(std::isnan(f16_to_float(f16[i])));  // NaN payloads may differ
      CHECK(std::isnan(bf16_to_float(bf16[i])));
    } else {
      CHECK(f16[i] == float_to_f16(v[i]));
      CHECK(bf16[i] == float_to_bf16(v[i]));
    }
  }
}

TEST_CASE("f16 and bf16 -> f32 on the GPU are exact; round trips are stable", "[gpu][kernels]") {
  // Every 16-bit pattern.
  Tensor pat = Tensor::empty({65536}, DType::f16);
  for (int i = 0; i < 65536; ++i) static_cast<uint16_t*>(pat.raw())[i] = static_cast<uint16_t>(i);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor p = pat.view({65536}, dt, 0);
    std::vector<float> gpu_f32 = cuda::cast(p.to(gpu()), DType::f32).to_vector();
    for (int i = 0; i < 65536; ++i) {
      const uint16_t b = static_cast<uint16_t>(i);
      const float expected = dt == DType::f16 ? f16_to_float(b) : bf16_to_float(b);
      if (std::isnan(expected)) {
        CHECK(std::isnan(gpu_f32[i]));
      } else if (gpu_f32[i] != expected) {
        FAIL_CHECK(dtype_name(dt) << " pattern " << i << ": gpu " << gpu_f32[i] << ", host " << expected);
      }
    }
  }
  // ops::cast (the public entry) goes through the same kernels.
  Tensor x = test::random_tensor({4, 33}, "roundtrip").to(gpu());
  Tensor twice = ops::cast(ops::cast(ops::cast(x, DType::bf16), DType::f32), DType::bf16);
  CHECK(bits16(twice) == bits16(ops::cast(x, DType::bf16)));
}

TEST_CASE("integer and f64 casts on the GPU match static_cast", "[gpu][kernels]") {
  Tensor x = Tensor::from_vector({-3.7f, -0.5f, 0.0f, 0.5f, 2.9f, 1e6f}, {6});
  CHECK(cuda::cast(x.to(gpu()), DType::i32).to_double_vector() == std::vector<double>{-3, 0, 0, 0, 2, 1e6});
  CHECK(cuda::cast(x.to(gpu()), DType::i64).to_double_vector() == std::vector<double>{-3, 0, 0, 0, 2, 1e6});
  std::vector<double> as_f64 = cuda::cast(x.to(gpu()), DType::f64).to_double_vector();
  for (size_t i = 0; i < 6; ++i) CHECK(as_f64[i] == static_cast<double>(x.to_vector()[i]));
}

TEST_CASE("ops on CUDA match the CPU engine", "[gpu][kernels][ops]") {
  const Shape shape{37, 129};
  Tensor x = test::random_tensor(shape, "ops_x");
  Tensor y = test::random_tensor(shape, "ops_y");

  SECTION("axpy, scale, add") {
    // |a x + y| <= 2: the GPU fuses the multiply-add (one rounding), the CPU may round
    // twice, so results differ by at most one float ulp of 2 (2^-22).
    const double atol = std::ldexp(1.0, -22);
    Tensor yc = y.clone(), yg = y.to(gpu());
    ops::axpy(0.75, x, yc);
    ops::axpy(0.75, x.to(gpu()), yg);
    test::require_close(yg, yc, atol, 0.0, "axpy");

    Tensor sc = x.clone(), sg = x.to(gpu());
    ops::scale(sc, -1.25);
    ops::scale(sg, -1.25);
    test::require_equal(sg, sc, "scale");  // one rounding on both sides

    test::require_equal(ops::add(x.to(gpu()), y.to(gpu())), ops::add(x, y), "add");
  }

  SECTION("reductions in double") {
    // Both accumulate float values in double, in different orders: relative 1e-12 covers
    // 4773 additions of 2^-53 rounding each with a wide margin.
    const double cs = ops::sum(x), gs = ops::sum(x.to(gpu()));
    CHECK(gs == Approx(cs).epsilon(1e-12).margin(1e-12));
    const double cq = ops::sum_squares(x), gq = ops::sum_squares(x.to(gpu()));
    CHECK(gq == Approx(cq).epsilon(1e-12));
    CHECK(ops::sum(Tensor::zeros({0}, DType::f32, gpu())) == 0.0);
    // A large tensor: many blocks, the second pass.
    Tensor big = Tensor::full({3000000}, 0.5, DType::f32, gpu());
    CHECK(ops::sum(big) == 1500000.0);
  }

  SECTION("has_non_finite") {
    CHECK_FALSE(ops::has_non_finite(x.to(gpu())));
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      Tensor t = x.clone();
      t.data<float>()[1234] = bad;
      CHECK(ops::has_non_finite(t.to(gpu())));
    }
    CHECK_FALSE(ops::has_non_finite(Tensor::full({10}, 1.0, DType::bf16, gpu())));
  }

  SECTION("argmax_rows: first maximum") {
    Tensor t = x.clone();
    // Ties: row 0 has its maximum at 5 and 100, row 1 everywhere.
    t.data<float>()[5] = 7.0f;
    t.data<float>()[100] = 7.0f;
    for (int64_t j = 0; j < 129; ++j) t.data<float>()[129 + j] = 2.0f;
    Tensor g = ops::argmax_rows(t.to(gpu()));
    Tensor c = ops::argmax_rows(t);
    CHECK(g.dtype() == DType::i64);
    test::require_equal(g, c, "argmax_rows");
    CHECK(g.to_double_vector()[0] == 5);
    CHECK(g.to_double_vector()[1] == 0);
  }

  SECTION("copy_cast with equal dtypes copies") {
    Tensor dst = Tensor::empty(shape, DType::f32, gpu());
    ops::copy_cast(x.to(gpu()), dst);
    test::require_equal(dst, x, "copy_cast");
  }
}
