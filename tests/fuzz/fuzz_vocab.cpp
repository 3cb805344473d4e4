// Subtokenizer vocabulary files (the Transformer's vocab.ende.32768 format: one quoted,
// escaped subtoken per line). A file the reader accepts must then give a usable
// tokenizer: encoding text drawn from the same input gives ids inside the vocabulary, and
// decoding them (or any ids) answers with a string or an InputError, nothing else.
#include "fuzz_input.hpp"
#include "tarantella/check.hpp"
#include "tarantella/text/subtokenizer.hpp"

#include <cstdlib>
#include <optional>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tnt::fuzz::ScratchFile file(".vocab");
  std::optional<tnt::Subtokenizer> tok;
  try {
    tok.emplace(tnt::Subtokenizer::from_file(file.write(data, size)));
  } catch (const tnt::InputError&) {
    return 0;
  }
  // The vocabulary's own bytes as text: whatever characters it has, plus newlines and
  // quotes, which exercise the escape path.
  std::vector<int64_t> ids;
  try {
    ids = tok->encode(tnt::fuzz::as_text(data, size), /*add_eos=*/true);
  } catch (const tnt::InputError&) {
    ids.clear();  // invalid UTF-8, or a vocabulary without the escape characters
  }
  for (int64_t id : ids)
    if (id < 0 || id >= tok->vocab_size()) std::abort();  // an id the model cannot embed
  if (!ids.empty() && ids.back() != tnt::kEosId) std::abort();
  (void)tok->decode(ids);
  // Ids a model may produce: every one in range, and some past the end (skipped).
  std::vector<int64_t> all;
  for (int64_t i = 0; i < tok->vocab_size() + 3 && i < 4096; ++i) all.push_back(i);
  (void)tok->decode(all);
  return 0;
}
