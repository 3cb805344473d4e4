// BLEU's input: the reference and translation files `tnt_bleu` (and the Transformer's
// evaluation) read. The lines of the input are scored against themselves and against
// themselves shifted by one line. Scores must be finite and in [0, 100], and a text scored
// against itself whose every line has at least 4 tokens (so every n-gram order up to 4 has
// matches and the brevity penalty is 1) must score exactly 100.
#include "fuzz_input.hpp"
#include "tarantella/text/bleu.hpp"
#include "tarantella/check.hpp"

#include <cmath>
#include <cstdlib>
#include <vector>

namespace {
void check_range(double s) {
  if (!std::isfinite(s) || s < 0.0 || s > 100.0) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tnt::fuzz::ScratchFile file(".txt");
  std::vector<std::string> lines;
  try {
    lines = tnt::read_bleu_lines(file.write(data, size));
  } catch (const tnt::InputError&) {
    return 0;
  }
  if (lines.empty()) return 0;
  try {
    double self = tnt::bleu_on_lines(lines, lines, /*case_sensitive=*/true);
    check_range(self);
    bool long_lines = true;
    for (const std::string& l : lines) long_lines = long_lines && tnt::bleu_tokenize(l).size() >= 4;
    if (long_lines && self != 100.0) std::abort();
    std::vector<std::string> shifted(lines.begin() + 1, lines.end());
    shifted.push_back(lines.front());
    check_range(tnt::bleu_on_lines(lines, shifted, /*case_sensitive=*/false));
  } catch (const tnt::InputError&) {
  }
  return 0;
}
