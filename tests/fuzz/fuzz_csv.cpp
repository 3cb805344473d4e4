// CSV files (Dataset::from_csv). The first byte chooses the options, so one target covers
// them all; the rest is the file:
//   bit 0: no header          bit 1: f32 labels        bit 2: no comment character
//   bit 3: label by index 0 (else by name "y" with a header, else none)
//   bit 4: ';' delimiter      bit 5: features chosen (by name "x" with a header, else index 1)
// The dataset is iterated to the end, so the tensors it was built from are read too.
#include "fuzz_input.hpp"
#include "tarantella/check.hpp"
#include "tarantella/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tnt::fuzz::ScratchFile file(".csv");
  if (size == 0) return 0;
  const uint8_t bits = data[0];
  tnt::Dataset::CsvOptions o;
  o.header = !(bits & 1);
  o.label_dtype = bits & 2 ? tnt::DType::f32 : tnt::DType::i32;
  o.comment = bits & 4 ? '\0' : '#';
  if (bits & 8) {
    o.labels = {0};
  } else if (o.header) {
    o.labels = {"y"};
  }
  o.delimiter = bits & 16 ? ';' : ',';
  if (bits & 32) o.features = {o.header ? tnt::Dataset::CsvColumn("x") : tnt::Dataset::CsvColumn(1)};
  try {
    tnt::Dataset d = tnt::Dataset::from_csv(file.write(data + 1, size - 1), o);
    auto it = d.iterate(0);
    while (it.next()) {
    }
  } catch (const tnt::InputError&) {
  }
  return 0;
}
