// safetensors files: the JSON header (dtypes, shapes, offsets, __metadata__) and the data
// ranges it claims; the checkpoint metadata is a string map inside it.
#include "fuzz_input.hpp"
#include "tarantella/check.hpp"
#include "tarantella/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tnt::fuzz::ScratchFile file(".safetensors");
  try {
    tnt::SafetensorsFile f = tnt::read_safetensors(file.write(data, size));
    (void)f;
  } catch (const tnt::InputError&) {
  }
  return 0;
}
