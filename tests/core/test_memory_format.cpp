// Memory formats of Tensor (tensor.hpp) and what tnt::ops do with them, on the CPU. Values
// are small integers (exact in every dtype used) and each element's value encodes its
// logical index, so a misplaced element shows up as a wrong number.
#include <catch2/catch.hpp>

#include "tarantella/check.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/tensor.hpp"

#include <cstring>
#include <numeric>
#include <vector>

using namespace tnt;

namespace {

// (N, C, H, W) with element value = its logical row-major index.
Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  Tensor f = Tensor::from_vector(v, shape);
  return dtype == DType::f32 ? f : ops::cast(f, dtype);
}

std::vector<double> iota_values(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  return v;
}

}  // namespace

TEST_CASE("channels_last lays (N, C, H, W) out as (N, H, W, C)", "[memory_format]") {
  const Shape shape{2, 3, 2, 4};  // N, C, H, W
  Tensor x = iota(shape);
  Tensor cl = x.to_memory_format(MemoryFormat::channels_last);
  CHECK(cl.is_channels_last());
  CHECK(cl.shape() == shape);  // shapes stay logical
  CHECK(cl.str() == "f32(2, 3, 2, 4) channels_last on cpu");
  CHECK(x.str() == "f32(2, 3, 2, 4) on cpu");
  // Memory element (n, h, w, c) holds logical index ((n*C + c)*H + h)*W + w.
  const float* p = cl.data<float>();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t w = 0; w < 4; ++w)
        for (int64_t c = 0; c < 3; ++c) {
          const int64_t mem = ((n * 2 + h) * 4 + w) * 3 + c;
          const int64_t logical = ((n * 3 + c) * 2 + h) * 4 + w;
          INFO("n " << n << " c " << c << " h " << h << " w " << w);
          REQUIRE(p[mem] == static_cast<float>(logical));
        }
  // to_vector and to_double_vector give the logical order in either format.
  CHECK(cl.to_double_vector() == iota_values(48));
  CHECK(cl.to_vector() == x.to_vector());
  // Converting to the format a tensor has shares it.
  CHECK(cl.to_memory_format(MemoryFormat::channels_last).raw() == cl.raw());
  CHECK(x.contiguous().raw() == x.raw());
}

TEST_CASE("the round trip through channels_last keeps every dtype's bytes", "[memory_format]") {
  const Shape shape{3, 5, 2, 3};  // odd sizes: a transposition bug cannot hide behind symmetry
  for (DType d : {DType::u8, DType::f16, DType::bf16, DType::i32, DType::f32, DType::f64, DType::i64}) {
    INFO("dtype " << dtype_name(d));
    Tensor x = iota(shape, d);  // 0..89: exact in u8, f16 and bf16 too (bf16: integers to 256)
    Tensor cl = x.to_memory_format(MemoryFormat::channels_last);
    CHECK(cl.dtype() == d);
    CHECK(cl.to_double_vector() == iota_values(90));
    Tensor back = cl.contiguous();
    CHECK_FALSE(back.is_channels_last());
    REQUIRE(back.nbytes() == x.nbytes());
    CHECK(std::memcmp(back.raw(), x.raw(), x.nbytes()) == 0);
    // The memory really moved (not a relabelled copy): element (0, 1, 0, 0) of the
    // channels_last tensor lies at memory position 1.
    CHECK(ops::cast(cl, DType::f64).data<double>()[1] == 6.0);  // logical index of (0, 1, 0, 0) = 1*2*3
  }
}

TEST_CASE("to_memory_format is a no-op for tensors that are not 4-D", "[memory_format]") {
  for (const Shape& shape : {Shape{6}, Shape{2, 3}, Shape{2, 3, 4}, Shape{1, 2, 3, 4, 5}, Shape{}}) {
    Tensor t = Tensor::zeros(shape);
    Tensor u = t.to_memory_format(MemoryFormat::channels_last);
    CHECK_FALSE(u.is_channels_last());
    CHECK(u.raw() == t.raw());
  }
  CHECK_FALSE(Tensor().to_memory_format(MemoryFormat::channels_last).defined());
  CHECK_THROWS_WITH(Tensor::empty({2, 3}, DType::f32, Device::cpu(), MemoryFormat::channels_last),
                    Catch::Contains("channels_last tensor must be 4-D, not (2, 3)"));
}

TEST_CASE("reshape of a channels_last tensor is refused with a message", "[memory_format]") {
  Tensor cl = Tensor::zeros({2, 3, 4, 5}, DType::f32, Device::cpu(), MemoryFormat::channels_last);
  CHECK_THROWS_WITH(cl.reshape({2, 60}),
                    Catch::Contains("reshape (2, 3, 4, 5) -> (2, 60): the tensor is channels_last; "
                                    "call contiguous() first"));
  CHECK_THROWS_WITH(cl.reshape({2, -1}), Catch::Contains("call contiguous() first"));
  // To its own shape it is the tensor itself; after contiguous() any shape goes.
  CHECK(cl.reshape({2, 3, 4, 5}).is_channels_last());
  CHECK(cl.contiguous().reshape({2, 60}).shape() == Shape{2, 60});
}

TEST_CASE("slice_rows, clone and to keep the format", "[memory_format]") {
  Tensor x = iota({4, 3, 2, 2});
  Tensor cl = x.to_memory_format(MemoryFormat::channels_last);
  Tensor rows = cl.slice_rows(1, 3);  // N is outermost in both formats
  CHECK(rows.is_channels_last());
  CHECK(rows.shape() == Shape{2, 3, 2, 2});
  const std::vector<double> all = iota_values(48);
  std::vector<double> want(all.begin() + 12, all.begin() + 36);
  CHECK(rows.to_double_vector() == want);
  CHECK(rows.raw() == static_cast<char*>(cl.raw()) + 12 * sizeof(float));  // shares storage
  Tensor c = cl.clone();
  CHECK(c.is_channels_last());
  CHECK(c.raw() != cl.raw());
  CHECK(c.to_double_vector() == iota_values(48));
  Tensor t = cl.to(Device::cpu());
  CHECK(t.is_channels_last());
  CHECK(t.to_double_vector() == iota_values(48));
  // fill_ and zero_ fill all elements, whatever the order.
  c.fill_(2.0);
  CHECK(c.to_double_vector() == std::vector<double>(48, 2.0));
}

TEST_CASE("copy_from copies logical contents across formats", "[memory_format]") {
  Tensor x = iota({2, 3, 4, 5});
  Tensor cl = Tensor::zeros({2, 3, 4, 5}, DType::f32, Device::cpu(), MemoryFormat::channels_last);
  cl.copy_from(x);
  CHECK(cl.is_channels_last());
  CHECK(cl.to_double_vector() == iota_values(120));
  Tensor back = Tensor::zeros({2, 3, 4, 5});
  back.copy_from(cl);
  CHECK(back.to_double_vector() == iota_values(120));
  CHECK(std::memcmp(back.raw(), x.raw(), x.nbytes()) == 0);
  // Another shape with the same count cannot be matched element by element: refused.
  Tensor flat = Tensor::zeros({120});
  CHECK_THROWS_WITH(flat.copy_from(cl), Catch::Contains("other memory format and shape"));
}

TEST_CASE("element-wise ops keep the first operand's format; casts keep it", "[memory_format][ops]") {
  Tensor a = iota({2, 3, 2, 3});
  Tensor b = ops::cast(iota({2, 3, 2, 3}), DType::f32);
  ops::scale(b, 10.0);
  Tensor acl = a.to_memory_format(MemoryFormat::channels_last);
  Tensor bcl = b.to_memory_format(MemoryFormat::channels_last);
  std::vector<double> want(36);
  for (size_t i = 0; i < want.size(); ++i) want[i] = 11.0 * static_cast<double>(i);

  // add(a, b): a's format, the other converted.
  for (const auto& [x, y] : {std::pair{acl, bcl}, std::pair{acl, b}, std::pair{a, bcl}, std::pair{a, b}}) {
    Tensor s = ops::add(x, y);
    CHECK(s.memory_format() == x.memory_format());
    CHECK(s.to_double_vector() == want);
  }
  // add in the emulated compute dtypes (bf16 on the CPU) too.
  Tensor h = ops::add(ops::cast(acl, DType::bf16), ops::cast(b, DType::bf16));
  CHECK(h.is_channels_last());
  CHECK(h.dtype() == DType::bf16);
  // bf16 rounds integers above 256: compare with the same sum of contiguous operands.
  CHECK(h.to_double_vector() == ops::add(ops::cast(a, DType::bf16), ops::cast(b, DType::bf16)).to_double_vector());
  // axpy(x, y): y's format.
  Tensor y = acl.clone();
  ops::axpy(10.0, a, y);  // a contiguous, y channels_last
  CHECK(y.is_channels_last());
  CHECK(y.to_double_vector() == want);
  Tensor y2 = a.clone();
  ops::axpy(10.0, acl, y2);
  CHECK_FALSE(y2.is_channels_last());
  CHECK(y2.to_double_vector() == want);
  // cast and copy_cast.
  Tensor c16 = ops::cast(acl, DType::f16);
  CHECK(c16.is_channels_last());
  CHECK(c16.to_double_vector() == iota_values(36));
  Tensor dst = Tensor::zeros({2, 3, 2, 3}, DType::f64);
  ops::copy_cast(acl, dst);
  CHECK(dst.to_double_vector() == iota_values(36));
  // Reductions do not depend on the format.
  CHECK(ops::sum(acl) == ops::sum(a));
  CHECK(ops::sum_squares(acl) == ops::sum_squares(a));
  // argmax along the logical last dimension (W): the last element of every row.
  Tensor am = ops::argmax_rows(acl);
  CHECK(am.shape() == Shape{2, 3, 2});
  CHECK(am.to_double_vector() == std::vector<double>(12, 2.0));
  // Different formats and shapes: refused, naming both.
  CHECK_THROWS_WITH(ops::add(acl, Tensor::zeros({36})), Catch::Contains("differ in memory format and shape"));
}
