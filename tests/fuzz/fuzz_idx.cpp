// IDX files (MNIST's format), plain and gzip: a file starting with the gzip magic is read
// through zlib, so one target covers both.
#include "fuzz_input.hpp"
#include "tarantella/check.hpp"
#include "tarantella/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tnt::fuzz::ScratchFile plain(".idx");
  static tnt::fuzz::ScratchFile gz(".idx.gz");
  bool is_gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  try {
    (void)tnt::read_idx((is_gzip ? gz : plain).write(data, size));
  } catch (const tnt::InputError&) {
  }
  return 0;
}
