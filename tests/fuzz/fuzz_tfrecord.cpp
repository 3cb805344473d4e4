// TFRecord framing (lengths, both CRCs) and the tf.train.Example records inside.
#include "fuzz_input.hpp"
#include "tarantella/check.hpp"
#include "tarantella/imagenet.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tnt::fuzz::ScratchFile file(".tfrecord");
  const std::string& path = file.write(data, size);
  try {
    for (uint64_t offset : tnt::index_tfrecord(path)) {
      std::vector<uint8_t> record = tnt::read_tfrecord(path, offset);
      try {
        (void)tnt::parse_example(record.data(), record.size(), "fuzz");
      } catch (const tnt::InputError&) {
      }
    }
  } catch (const tnt::InputError&) {
  }
  // The record parser alone, on the raw bytes, reaches deeper than through valid framing.
  try {
    (void)tnt::parse_example(data, size, "fuzz");
  } catch (const tnt::InputError&) {
  }
  return 0;
}
