// The JPEG decode path of the image pipeline: the header probe, then a decode at full and
// at 1/8 scale.
#include "fuzz_input.hpp"
#include "tarantella/check.hpp"
#include "tarantella/imagenet.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tnt::JpegSize s = tnt::jpeg_size(data, size, "fuzz.jpg");
    if (s.height <= 0 || s.width <= 0) __builtin_trap();
    (void)tnt::decode_jpeg(data, size, "fuzz.jpg", 8);
    (void)tnt::decode_jpeg(data, size, "fuzz.jpg", 1);
  } catch (const tnt::InputError&) {
  }
  return 0;
}
