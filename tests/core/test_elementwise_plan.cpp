// The host decisions behind the vectorised CUDA kernels (backend/cuda/elementwise_plan.hpp,
// backend/cuda/sort_bits.hpp): which calls may use 16-byte accesses, how n splits into
// vectors and a tail, when 32-bit indices are safe, and the radix sort's key bits. Plain
// C++: runs without a GPU.
#include <catch2/catch.hpp>

#include "backend/cuda/elementwise_plan.hpp"
#include "backend/cuda/sort_bits.hpp"

#include <cstdint>

using namespace tnt::cuda;

namespace {

// A pointer at a chosen address, never dereferenced: the plan looks at addresses only.
const void* at(std::uintptr_t address) { return reinterpret_cast<const void*>(address); }

}  // namespace

TEST_CASE("vector width: 16 bytes of the widest operand", "[elementwise]") {
  CHECK(vector_width(1) == 16);  // u8
  CHECK(vector_width(2) == 8);   // f16, bf16
  CHECK(vector_width(4) == 4);   // f32, i32
  CHECK(vector_width(8) == 2);   // f64, i64
  CHECK(vector_width(16) == 1);
}

TEST_CASE("16-byte alignment of every operand decides the path", "[elementwise]") {
  CHECK(aligned_for_vectors(at(0x1000)));
  CHECK(aligned_for_vectors(at(0x1010)));
  for (std::uintptr_t offset : {1u, 2u, 4u, 8u, 12u, 14u}) {
    INFO("offset " << offset);
    CHECK_FALSE(aligned_for_vectors(at(0x1000 + offset)));
  }

  SECTION("all aligned: vectors of `width` and a tail") {
    const ElementwisePlan p = plan_elementwise(1027, 4, {at(0x1000), at(0x2000), at(0x30f0)});
    CHECK(p.width == 4);
    CHECK(p.vectors == 256);
    CHECK(p.tail == 3);
    CHECK(p.work_items() == 256);
  }
  SECTION("one misaligned operand (a view at byte offset 2, 4 or 8): the scalar path for all") {
    for (std::uintptr_t offset : {2u, 4u, 8u}) {
      INFO("offset " << offset);
      const ElementwisePlan p = plan_elementwise(1027, 8, {at(0x1000), at(0x2000 + offset)});
      CHECK(p.width == 1);
      CHECK(p.vectors == 1027);
      CHECK(p.tail == 0);
      // The output alone misaligned falls back too.
      CHECK(plan_elementwise(1027, 8, {at(0x1000 + offset), at(0x2000)}).width == 1);
    }
  }
  SECTION("element counts around the width") {
    struct Case {
      int64_t n, vectors, tail;
    };
    for (const Case& c : {Case{0, 0, 0}, Case{1, 0, 1}, Case{7, 0, 7}, Case{8, 1, 0}, Case{9, 1, 1},
                          Case{1023, 127, 7}, Case{4099, 512, 3}}) {
      INFO("n " << c.n);
      const ElementwisePlan p = plan_elementwise(c.n, 8, {at(0x1000)});
      CHECK(p.width == 8);
      CHECK(p.vectors == c.vectors);
      CHECK(p.tail == c.tail);
      CHECK(p.vectors * p.width + p.tail == c.n);
      // The grid covers the steps, or the tail alone when there is no full step.
      CHECK(p.work_items() == (c.vectors > 0 ? c.vectors : c.tail));
    }
  }
  SECTION("width 1 (an operand as wide as a vector) is the scalar loop") {
    const ElementwisePlan p = plan_elementwise(5, 1, {at(0x1000)});
    CHECK(p.width == 1);
    CHECK(p.vectors == 5);
    CHECK(p.tail == 0);
  }
}

TEST_CASE("32-bit indices only where no index formed can wrap", "[elementwise]") {
  const int64_t two32 = int64_t{1} << 32;
  const int64_t threads = 132 * 32 * 256;  // an H100/H200 grid: 132 SMs x 32 blocks x 256
  CHECK(fits_index32(0, threads));
  CHECK(fits_index32(4099, threads));
  CHECK(fits_index32(two32 - threads - 1, threads));
  // The step past the last element would reach 2^32: 64 bits.
  CHECK_FALSE(fits_index32(two32 - threads, threads));
  CHECK_FALSE(fits_index32(two32, 1));
  CHECK_FALSE(fits_index32(two32 + 5, threads));
  CHECK_FALSE(fits_index32(-1, threads));
}

TEST_CASE("radix sort key bits: enough to order 0 .. max_key, no more", "[elementwise]") {
  CHECK(radix_key_bits(0) == 1);
  CHECK(radix_key_bits(1) == 1);
  CHECK(radix_key_bits(2) == 2);
  CHECK(radix_key_bits(3) == 2);
  CHECK(radix_key_bits(4) == 3);
  CHECK(radix_key_bits(31999) == 15);  // a 32000-token vocabulary
  CHECK(radix_key_bits(32767) == 15);
  CHECK(radix_key_bits(32768) == 16);
  CHECK(radix_key_bits(0xffffffffull) == 32);
  CHECK(radix_key_bits(~0ull) == 64);
  for (int b = 1; b < 64; ++b) {
    INFO("bit " << b);
    const uint64_t top = uint64_t{1} << b;
    CHECK(radix_key_bits(top - 1) == b);  // every key below 2^b fits in b bits
    CHECK(radix_key_bits(top) == b + 1);
  }
}
