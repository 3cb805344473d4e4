// The rules of TNT_GEMM_PAD (layers/projection_pad.hpp), testable without a GPU: which
// products pad, to what width, in which chunks of rows, and when a trial takes the padded
// path. The trial itself runs on a GPU (layers_projection_pad_cuda).
#include <catch2/catch.hpp>

#include "layers/projection_pad.hpp"

#include <cmath>
#include <limits>

namespace rules = tnt::projection_pad;
using tnt::DType;

TEST_CASE("projection padding: 16-bit products over a vocabulary off 8 columns", "[projection_pad]") {
  CHECK(rules::applies(DType::bf16, 33708));  // WMT's vocabulary: 8-byte aligned rows only
  CHECK(rules::applies(DType::f16, 1001));
  CHECK(rules::applies(DType::bf16, 7));
  CHECK_FALSE(rules::applies(DType::bf16, 33712));
  CHECK_FALSE(rules::applies(DType::bf16, 8));
  CHECK_FALSE(rules::applies(DType::f32, 33708));  // f32 rows of a multiple of 4 are aligned already
  CHECK_FALSE(rules::applies(DType::f32, 1001));   // and f32 products here take no tensor cores
  CHECK_FALSE(rules::applies(DType::bf16, 0));
  CHECK(rules::padded_width(33708) == 33712);
  CHECK(rules::padded_width(1001) == 1008);
  CHECK(rules::padded_width(7) == 8);
  CHECK(rules::padded_width(8) == 8);
  CHECK(rules::padded_width(9) == 16);
}

TEST_CASE("projection padding: chunks of rows within the scratch bound, as even as tiles allow", "[projection_pad]") {
  // The Transformer-big batch: 32768 rows of 33712 bf16 columns (67,424 bytes) in 512 MiB.
  const int64_t fit = static_cast<int64_t>(rules::kChunkBytes) / (33712 * 2);
  CHECK(fit == 7962);
  const int64_t c = rules::chunk_rows(32768, 33712, 2);
  CHECK(c <= fit);
  CHECK(c % rules::kChunkRowMultiple == 0);
  CHECK((32768 + c - 1) / c == 5);  // as many chunks as needed, no more
  CHECK(c == 6592);                 // 32768 / 5 rounded up to 64 rows
  // Everything at once where it fits.
  CHECK(rules::chunk_rows(4096, 33712, 2) == 4096);
  CHECK(rules::chunk_rows(1, 33712, 2) == 1);
  CHECK(rules::chunk_rows(0, 33712, 2) == 1);
  // Every split stays within the bound, covers the rows and takes no more chunks than needed.
  for (int64_t rows : {7963, 8000, 15924, 15925, 20000, 65536, 100003}) {
    const int64_t k = rules::chunk_rows(rows, 33712, 2);
    INFO("rows " << rows << " chunk " << k);
    CHECK(k >= 1);
    CHECK(k <= fit);
    CHECK(static_cast<int64_t>(k * 33712 * 2) <= static_cast<int64_t>(rules::kChunkBytes));
    CHECK((rows + k - 1) / k == (rows + fit - 1) / fit);
  }
  // Where rounding to 64 rows would overflow the bound, the even split: 15924 = 2 x 7962.
  CHECK(rules::chunk_rows(15924, 33712, 2) == 7962);
  // Rows wider than the bound still move, one at a time.
  CHECK(rules::chunk_rows(10, 1000, 2, 100) == 1);
  // A bound below 64 rows: whole rows, not a multiple of 64.
  CHECK(rules::chunk_rows(1000, 8, 2, 16 * 50) == 50);
}

TEST_CASE("projection padding: the trial pads where it is 2% faster and agrees", "[projection_pad]") {
  CHECK(rules::prefer_padded(9.7, 10.0));
  CHECK_FALSE(rules::prefer_padded(9.85, 10.0));
  CHECK_FALSE(rules::prefer_padded(10.5, 10.0));
  CHECK_FALSE(rules::prefer_padded(-1.0, 10.0));  // not timed
  CHECK_FALSE(rules::prefer_padded(5.0, -1.0));
  // Agreement: within 2^-6 of the largest direct value; an all-zero result exactly.
  CHECK(rules::agrees(0.0, 0.0));
  CHECK(rules::agrees(1.0 / 64, 1.0));
  CHECK_FALSE(rules::agrees(1.0 / 64 + 1e-9, 1.0));
  CHECK_FALSE(rules::agrees(1e-9, 0.0));
  CHECK_FALSE(rules::agrees(std::numeric_limits<double>::infinity(), 1.0));  // NaN counts as infinite
  CHECK_FALSE(rules::agrees(std::nan(""), 1.0));
  CHECK_FALSE(rules::agrees(0.0, std::numeric_limits<double>::infinity()));
  // One bf16 step of the largest value (0.0625 at 12) passes; a value of its own size does not.
  CHECK(rules::agrees(0.0625, 12.0));
  CHECK_FALSE(rules::agrees(3.0, 12.0));
}

TEST_CASE("projection padding: one trial per power of two of rows", "[projection_pad]") {
  CHECK(rules::rows_class(1) == 0);
  CHECK(rules::rows_class(2) == 1);
  CHECK(rules::rows_class(3) == 2);
  CHECK(rules::rows_class(4) == 2);
  CHECK(rules::rows_class(32768) == 15);
  CHECK(rules::rows_class(32769) == 16);
  CHECK(rules::rows_class(20000) == rules::rows_class(30000));
  CHECK(rules::rows_class(4096) != rules::rows_class(32768));
}
