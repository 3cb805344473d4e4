// Decoding part of a JPEG: what ImageNet preprocessing needs of an image is the box it crops,
// and libjpeg-turbo can reconstruct only that (runtime/src/data/jpeg.cpp).
#pragma once

#include "tarantella/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace tnt::detail {

// The size decode_jpeg(..., scale_denom) gives for an image of height x width: libjpeg's
// ceil(side / scale_denom).
inline int64_t jpeg_scaled_side(int64_t side, int scale_denom) { return (side + scale_denom - 1) / scale_denom; }

// Rows [top, top + rows) and at least columns [left, left + cols) of the image decoded at
// 1/scale_denom size (coordinates in that size), pixel for pixel what decode_jpeg gives
// there. The columns decoded start at or left of `left`, where libjpeg's blocks start
// (col0), and may reach further right: rgb is u8 (rows, decoded columns, 3).
// Rows and columns outside are entropy decoded (a sequential JPEG's codes come one after
// another) but not reconstructed, and the file is read to its end, so a damaged file is
// refused exactly as decode_jpeg refuses it. With to_end false the decode stops after the
// rows: faster (the codes below are not read), and damage below goes unnoticed, so only for
// a file once read to its end. Throws InputError naming `name`.
struct JpegRegion {
  Tensor rgb;
  int64_t col0 = 0;
};
JpegRegion decode_jpeg_region(const uint8_t* data, size_t size, const std::string& name, int scale_denom,
                              int64_t top, int64_t rows, int64_t left, int64_t cols, bool to_end = true);

}  // namespace tnt::detail
