// tarantella::text from the installed package: a subtokenizer round trip and BLEU of a
// sentence against itself (100), without MPI.
#include "tarantella/text/bleu.hpp"
#include "tarantella/text/subtokenizer.hpp"

#include <cstdio>

int main() {
  const tnt::Subtokenizer sub({"<pad>", "<EOS>", "hello_", "world_", "h", "e", "l", "o", "w", "r", "d", "_"});
  const std::string text = "hello world";
  const std::string back = sub.decode(sub.encode(text));
  const double bleu = tnt::bleu_on_lines({text}, {text}, true);
  std::printf("text: '%s' -> '%s', bleu %.1f\n", text.c_str(), back.c_str(), bleu);
  return back == text && bleu > 99.9 ? 0 : 1;
}
