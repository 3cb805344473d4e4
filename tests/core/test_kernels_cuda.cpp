// Generic CUDA kernels against the host: fill and f32 <-> f16/bf16 casts bit for bit
// (both sides round to nearest even), and tarantella/ops.hpp on CUDA against the CPU.
// The vectorised element-wise kernels (backend/cuda/vector_io.cuh) on aligned tensors (the
// 16-byte path) and on views at byte offsets 2, 4 and 8 (the scalar path), for element
// counts around the vector width, bit for bit against host arithmetic, with guard bytes
// around each view that must stay untouched.
#include "gpu_test_util.hpp"

#include "backend/cuda/elementwise_plan.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/ops_cuda.hpp"
#include "core/half.hpp"
#include "tarantella/ops.hpp"

#include <cmath>
#include <cstdint>
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

  SECTION("argmax_rows: NaN as on the CPU (a NaN never wins, but at index 0)") {
    // The CPU keeps j when row[j] > row[best]: a NaN never takes over, a leading NaN is
    // never replaced. On the GPU a lane that met a NaN first used to keep it, beat nothing
    // and was beaten by nothing, so the warp's butterfly lost other lanes' maxima through it.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Tensor t = x.clone();
    float* p = t.data<float>();
    p[2 * 129 + 0] = nan;  // row 2: a leading NaN -> 0
    p[2 * 129 + 50] = 9.0f;
    p[3 * 129 + 8] = nan;  // row 3: lane 8 meets a NaN; lane 24 holds the maximum -> 24
    p[3 * 129 + 24] = 9.0f;
    for (int64_t j = 0; j < 129; ++j) p[4 * 129 + j] = nan;  // row 4: all NaN -> 0
    p[5 * 129 + 1] = nan;  // row 5: lane 1's first element NaN, its third the maximum -> 65
    p[5 * 129 + 65] = 9.0f;
    p[6 * 129 + 128] = nan;  // row 6: a trailing NaN and a tie at 3 and 35 -> 3
    p[6 * 129 + 3] = 9.0f;
    p[6 * 129 + 35] = 9.0f;
    Tensor c = ops::argmax_rows(t);
    const std::vector<double> cpu = c.to_double_vector();
    REQUIRE(cpu[2] == 0);
    REQUIRE(cpu[3] == 24);
    REQUIRE(cpu[4] == 0);
    REQUIRE(cpu[5] == 65);
    REQUIRE(cpu[6] == 3);
    test::require_equal(ops::argmax_rows(t.to(gpu())), c, "argmax_rows with NaN");
  }

  SECTION("copy_cast with equal dtypes copies") {
    Tensor dst = Tensor::empty(shape, DType::f32, gpu());
    ops::copy_cast(x.to(gpu()), dst);
    test::require_equal(dst, x, "copy_cast");
  }
}

// ---- The vectorised element-wise kernels: vector path, scalar path, tails ----

namespace {

const std::vector<int64_t> kCounts = {0, 1, 7, 8, 9, 1023, 4096 + 3};
constexpr uint8_t kGuard = 0xa5;
constexpr size_t kGuardBytes = 32;  // a multiple of 16: offset 0 stays 16-byte aligned

// A tensor's values placed in a GPU byte buffer at `offset` bytes past a 16-byte aligned
// address, with guard bytes on both sides. Offset 0: every kernel takes the vector path;
// 2, 4, 8: the scalar path (one misaligned pointer is enough).
struct Placed {
  Tensor buffer;  // u8 on the GPU
  size_t start = 0;
  Tensor view;
};

Placed place(const Tensor& host, size_t offset) {
  Placed p;
  p.buffer = Tensor::empty({static_cast<int64_t>(host.nbytes() + 2 * kGuardBytes + 16)}, DType::u8, gpu());
  const auto base = reinterpret_cast<std::uintptr_t>(p.buffer.raw());
  p.start = (16 - base % 16) % 16 + kGuardBytes + offset;
  p.buffer.copy_from(Tensor::full({p.buffer.numel()}, kGuard, DType::u8));
  p.view = p.buffer.view(host.shape(), host.dtype(), p.start);
  if (host.numel() > 0) p.view.copy_from(host);
  REQUIRE(cuda::aligned_for_vectors(p.view.raw()) == (offset % 16 == 0));
  return p;
}

// The view's bytes; fails if a kernel wrote outside the view.
std::vector<uint8_t> bytes_of(const Placed& p) {
  Tensor h = p.buffer.to(Device::cpu());
  const auto* b = static_cast<const uint8_t*>(h.raw());
  const size_t end = p.start + p.view.nbytes();
  size_t touched = 0;
  for (size_t i = 0; i < static_cast<size_t>(h.numel()); ++i) {
    if ((i < p.start || i >= end) && b[i] != kGuard) ++touched;
  }
  CHECK(touched == 0);
  return std::vector<uint8_t>(b + p.start, b + end);
}

std::vector<uint8_t> bytes_of(const Tensor& host) {
  const auto* b = static_cast<const uint8_t*>(host.raw());
  return std::vector<uint8_t>(b, b + host.nbytes());
}

// Offsets at which every operand's elements stay naturally aligned (a view of f32 at byte
// offset 2 could not be read at all): the element size must divide the offset.
std::vector<size_t> offsets_for(size_t widest_element) {
  std::vector<size_t> out;
  for (size_t o : {size_t{0}, size_t{2}, size_t{4}, size_t{8}}) {
    if (o % widest_element == 0) out.push_back(o);
  }
  return out;
}

// Host element access in float for f32, f16, bf16 (the rounding of from_float on the device:
// to nearest even, as float_to_f16/float_to_bf16).
float get(const Tensor& h, int64_t i) {
  switch (h.dtype()) {
    case DType::f32: return static_cast<const float*>(h.raw())[i];
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(h.raw())[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(h.raw())[i]);
    default: FAIL("unexpected dtype " << dtype_name(h.dtype())); return 0.0f;
  }
}

void put(const Tensor& h, int64_t i, float v) {
  switch (h.dtype()) {
    case DType::f32: static_cast<float*>(h.raw())[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(h.raw())[i] = float_to_f16(v); break;
    case DType::bf16: static_cast<uint16_t*>(h.raw())[i] = float_to_bf16(v); break;
    default: FAIL("unexpected dtype " << dtype_name(h.dtype()));
  }
}

// Random values of dtype dt on the host, exactly representable in dt.
Tensor random_of(DType dt, int64_t n, const std::string& key) {
  Tensor f = test::random_tensor({n}, key, -3.0f, 3.0f);
  return dt == DType::f32 ? f : ops::cast(f, dt);
}

const std::vector<DType> kFloats = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("fill: vector and scalar paths write the host's bytes, nothing around them", "[gpu][kernels][vector]") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::u8}) {
    for (int64_t n : kCounts) {
      for (size_t offset : offsets_for(dtype_size(dt))) {
        INFO(dtype_name(dt) << " n " << n << " offset " << offset);
        Tensor expected = Tensor::full({n}, 3.0, dt);
        Placed p = place(Tensor::zeros({n}, dt), offset);
        cuda::fill(p.view, 3.0);
        CHECK(bytes_of(p) == bytes_of(expected));
      }
    }
  }
}

TEST_CASE("casts: vector and scalar paths equal the host conversions bit for bit", "[gpu][kernels][vector]") {
  const std::vector<std::pair<DType, DType>> pairs = {
      {DType::f32, DType::f16}, {DType::f32, DType::bf16}, {DType::f16, DType::f32}, {DType::bf16, DType::f32},
      {DType::f16, DType::bf16}, {DType::f32, DType::f64}, {DType::f32, DType::i32}, {DType::f32, DType::u8}};
  for (auto [from, to] : pairs) {
    for (int64_t n : kCounts) {
      // u8: values in [0, 200) (a negative float to u8 is undefined behaviour in C++).
      Tensor src = to == DType::u8 ? test::random_tensor({n}, "cast_u8", 0.0f, 200.0f)
                                   : ops::cast(test::random_tensor({n}, "cast_vec", -1000.0f, 1000.0f), from);
      const Tensor expected = ops::cast(src, to);  // the CPU engine: the host conversions
      const size_t widest = std::max(dtype_size(from), dtype_size(to));
      for (size_t offset : offsets_for(widest)) {
        // Both operands at the offset, and the output alone moved (the input aligned).
        for (bool only_out : {false, true}) {
          if (only_out && offset == 0) continue;
          INFO(dtype_name(from) << " -> " << dtype_name(to) << " n " << n << " offset " << offset
                                << (only_out ? " (output only)" : ""));
          Placed in = place(src, only_out ? 0 : offset);
          Placed out = place(Tensor::zeros({n}, to), offset);
          cuda::cast(in.view, out.view);
          CHECK(bytes_of(out) == bytes_of(expected));
        }
      }
    }
  }
}

TEST_CASE("accumulate_as_float: dst + float(src), bit for bit on both paths", "[gpu][kernels][vector]") {
  for (DType dt : kFloats) {
    for (int64_t n : kCounts) {
      const Tensor src = random_of(dt, n, "acc_src");
      const Tensor dst = test::random_tensor({n}, "acc_dst");
      Tensor expected = dst.clone();
      for (int64_t i = 0; i < n; ++i) put(expected, i, get(dst, i) + get(src, i));  // one float addition
      for (size_t offset : offsets_for(4)) {
        INFO(dtype_name(dt) << " n " << n << " offset " << offset);
        Placed s = place(src, offset);
        Placed d = place(dst, offset);
        cuda::accumulate_as_float(s.view, d.view);
        CHECK(bytes_of(d) == bytes_of(expected));
      }
    }
  }
}

TEST_CASE("axpy, scale, add: vector and scalar paths equal host arithmetic bit for bit", "[gpu][kernels][vector]") {
  // The device rounds once per op as the host lines below do: axpy is one fused multiply-add
  // (written as such in ops_cuda.cu), scale one product, add one sum, then the rounding to
  // the storage type.
  const float alpha = 0.75f, factor = -1.25f;
  for (DType dt : kFloats) {
    for (int64_t n : kCounts) {
      const Tensor x = random_of(dt, n, "vec_x"), y = random_of(dt, n, "vec_y");
      Tensor axpy_ref = y.clone(), scale_ref = x.clone(), add_ref = x.clone();
      for (int64_t i = 0; i < n; ++i) {
        put(axpy_ref, i, std::fma(alpha, get(x, i), get(y, i)));
        put(scale_ref, i, get(x, i) * factor);
        put(add_ref, i, get(x, i) + get(y, i));
      }
      for (size_t offset : offsets_for(dtype_size(dt))) {
        INFO(dtype_name(dt) << " n " << n << " offset " << offset);
        {
          Placed px = place(x, offset), py = place(y, offset);
          cuda::axpy(alpha, px.view, py.view);
          CHECK(bytes_of(py) == bytes_of(axpy_ref));
        }
        {
          Placed px = place(x, offset);
          cuda::scale(px.view, factor);
          CHECK(bytes_of(px) == bytes_of(scale_ref));
        }
        {
          // a misaligned, b aligned: one operand is enough to take the scalar path.
          Placed pa = place(x, offset), pb = place(y, 0), out = place(Tensor::zeros({n}, dt), offset);
          cuda::add(pa.view, pb.view, out.view);
          CHECK(bytes_of(out) == bytes_of(add_ref));
        }
        {
          // In place: out is a.
          Placed pa = place(x, offset), pb = place(y, offset);
          cuda::add(pa.view, pb.view, pa.view);
          CHECK(bytes_of(pa) == bytes_of(add_ref));
        }
      }
    }
  }
}

TEST_CASE("element-wise kernels over more elements than one grid covers", "[gpu][kernels][vector]") {
  // 5,000,003 f32: more 4-element steps than any device's grid_for cap (32 blocks of 256
  // threads per SM), so every thread loops, plus a tail of 3.
  const int64_t n = 5000003;
  const Tensor x = test::random_tensor({n}, "big_x");
  Tensor expected = x.clone();
  for (int64_t i = 0; i < n; ++i) static_cast<float*>(expected.raw())[i] = static_cast<const float*>(x.raw())[i] * 0.5f;
  Tensor d = x.to(gpu());
  REQUIRE(cuda::aligned_for_vectors(d.raw()));
  cuda::scale(d, 0.5);
  CHECK(bytes_of(d.to(Device::cpu())) == bytes_of(expected));
}

TEST_CASE("element-wise kernels with 64-bit indices (2^32 + 5 elements)", "[gpu][kernels][vector]") {
  // n + threads >= 2^32: the plan picks 64-bit indices. 4 GiB of u8, filled with 16-byte
  // stores; windows at the start, across 2^32 and at the end (the tail of 5) are read back.
  const int64_t n = (int64_t{1} << 32) + 5;
  Tensor big = Tensor::empty({n}, DType::u8, gpu());
  cuda::fill(big, 7.0);
  for (int64_t start : {int64_t{0}, (int64_t{1} << 32) - 64, n - 64}) {
    INFO("window at " << start);
    const std::vector<double> window = big.view({64}, DType::u8, static_cast<size_t>(start)).to_double_vector();
    CHECK(window == std::vector<double>(64, 7.0));
  }
}

TEST_CASE("casts and add keep the memory format; mixed formats are converted or refused", "[gpu][kernels][format]") {
  const Tensor x = test::random_tensor({2, 3, 4, 5}, "format_x");
  const Tensor y = test::random_tensor({2, 3, 4, 5}, "format_y");
  const Tensor xc = x.to(gpu()).to_memory_format(MemoryFormat::channels_last);
  const Tensor yc = y.to(gpu()).to_memory_format(MemoryFormat::channels_last);
  REQUIRE(xc.is_channels_last());

  const Tensor h = cuda::cast(xc, DType::bf16);
  CHECK(h.is_channels_last());
  CHECK(bytes_of(h.contiguous().to(Device::cpu())) == bytes_of(ops::cast(x, DType::bf16)));

  // A contiguous destination gets the logical order.
  Tensor dst = Tensor::empty(x.shape(), DType::f16, gpu());
  cuda::cast(xc, dst);
  CHECK(bytes_of(dst.to(Device::cpu())) == bytes_of(ops::cast(x, DType::f16)));
  // copy_cast with equal dtypes and different formats converts rather than copying bytes.
  Tensor same = Tensor::empty(x.shape(), DType::f32, gpu());
  cuda::copy_cast(xc, same);
  CHECK(bytes_of(same.to(Device::cpu())) == bytes_of(x));

  Tensor sum = Tensor::empty(x.shape(), DType::f32, gpu(), MemoryFormat::channels_last);
  cuda::add(xc, yc, sum);
  CHECK(bytes_of(sum.contiguous().to(Device::cpu())) == bytes_of(ops::add(x, y)));
  // Element i of a channels_last tensor is not element i of a contiguous one.
  Tensor plain = Tensor::empty(x.shape(), DType::f32, gpu());
  CHECK_THROWS_WITH(cuda::add(xc, y.to(gpu()), plain), Catch::Contains("different memory formats"));
  CHECK_THROWS_WITH(cuda::axpy(1.0, xc, y.to(gpu())), Catch::Contains("different memory formats"));
  CHECK_THROWS_WITH(cuda::accumulate_as_float(xc, Tensor::zeros(x.shape(), DType::f32, gpu())),
                    Catch::Contains("memory formats differ"));
}
