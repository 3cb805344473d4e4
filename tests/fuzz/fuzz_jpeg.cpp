// The JPEG decode path of the image pipeline: the header probe, a decode at full and at 1/8
// scale, and a part at 1/2 (what ImageNet preprocessing decodes), which must refuse what
// the whole decode refuses and otherwise give its pixels.
#include "data/jpeg_region.hpp"
#include "fuzz_input.hpp"
#include "tarantella/check.hpp"
#include "tarantella/imagenet.hpp"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tnt::JpegSize s = tnt::jpeg_size(data, size, "fuzz.jpg");
    if (s.height <= 0 || s.width <= 0) __builtin_trap();
    (void)tnt::decode_jpeg(data, size, "fuzz.jpg", 8);
    (void)tnt::decode_jpeg(data, size, "fuzz.jpg", 1);
  } catch (const tnt::InputError&) {
  }
  // The middle third of the image at 1/2, against the whole decode at 1/2.
  tnt::Tensor whole;
  try {
    whole = tnt::decode_jpeg(data, size, "fuzz.jpg", 2);  // (H, W, 3)
  } catch (const tnt::InputError&) {
  }
  const int64_t H = whole.defined() ? whole.dim(0) : 0, W = whole.defined() ? whole.dim(1) : 0;
  const int64_t top = H / 3, rows = H - 2 * (H / 3), left = W / 3, cols = W - 2 * (W / 3);
  tnt::detail::JpegRegion part;
  bool refused = false;
  try {
    part = tnt::detail::decode_jpeg_region(data, size, "fuzz.jpg", 2, top, rows > 0 ? rows : 1, left,
                                           cols > 0 ? cols : 1);
  } catch (const tnt::InputError&) {
    refused = true;
  }
  if (!whole.defined()) {
    if (!refused) __builtin_trap();  // the part decoded where the whole was refused
    return 0;
  }
  if (refused || part.col0 > left || part.col0 + part.rgb.dim(1) < left + cols) __builtin_trap();
  const int64_t RW = part.rgb.dim(1);
  for (int64_t y = 0; y < rows; ++y)
    if (std::memcmp(whole.data<uint8_t>() + ((top + y) * W + left) * 3,
                    part.rgb.data<uint8_t>() + (y * RW + left - part.col0) * 3, static_cast<size_t>(cols) * 3) != 0)
      __builtin_trap();
  return 0;
}
