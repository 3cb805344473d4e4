// TFRecord framing (lengths, both CRCs) through the indexed reader of the image pipeline and
// the sequential reader, and the tf.train.Example records inside, parsed by protobuf into
// the general Example and into the ImageNet example.
#include "fuzz_input.hpp"
#include "tarantella/check.hpp"
#include "tarantella/imagenet.hpp"
#include "tarantella/tfrecord.hpp"

namespace {
void parse_both(std::string_view record) {
  try {
    (void)tnt::parse_example(record, "fuzz");
  } catch (const tnt::InputError&) {
  }
  try {
    (void)tnt::parse_example(reinterpret_cast<const uint8_t*>(record.data()), record.size(), "fuzz");
  } catch (const tnt::InputError&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tnt::fuzz::ScratchFile file(".tfrecord");
  const std::string& path = file.write(data, size);
  try {
    for (uint64_t offset : tnt::index_tfrecord(path)) {
      std::vector<uint8_t> record = tnt::read_tfrecord(path, offset);
      parse_both({reinterpret_cast<const char*>(record.data()), record.size()});
    }
  } catch (const tnt::InputError&) {
  }
  try {
    tnt::TFRecordReader reader(path);
    std::string record;
    uint64_t last = 0;
    while (reader.next(record)) {
      if (reader.offset() <= last) __builtin_trap();  // a reader that does not advance hangs
      last = reader.offset();
      parse_both(record);
    }
  } catch (const tnt::InputError&) {
  }
  // The record parsers alone, on the raw bytes, reach deeper than through valid framing.
  parse_both(tnt::fuzz::as_text(data, size));
  return 0;
}
