// BLEU (tarantella/text/bleu.hpp) against cases computed by hand: the tokenizer's rules, the
// clipped n-gram precisions, orders without matches, orders without n-grams, the brevity
// penalty, a two-sentence corpus, lower-casing, and how files are read.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>

#include "tarantella/text/bleu.hpp"
#include "tarantella/check.hpp"

#include <cmath>
#include <fstream>
#include <random>

using namespace tnt;
namespace fs = std::filesystem;

namespace {

using Tokens = std::vector<std::string>;

std::vector<Tokens> split_each(const std::vector<std::string>& lines) {
  std::vector<Tokens> out;
  for (const auto& l : lines) out.push_back(bleu_tokenize(l));
  return out;
}

// BLEU in [0, 1] of single sentences, tokenized.
double bleu1(const std::string& ref, const std::string& hyp) {
  return compute_bleu({bleu_tokenize(ref)}, {bleu_tokenize(hyp)});
}

// compute_bleu sums logarithms where the hand computation takes a power: the two doubles
// agree to a few ulps, 1e-12 leaves room for that and nothing else.
constexpr double kTol = 1e-12;

}  // namespace

TEST_CASE("bleu: the tokenizer of mteval-v14", "[bleu]") {
  // Punctuation gets spaces unless a digit is on the side the rule looks at; symbols
  // always do. "1,000.5" stays whole, and so does "5." at the end (no character follows
  // the '.', so the second rule cannot match: the mteval quirk the reference keeps).
  CHECK(bleu_tokenize("Hello, world! 1,000.5 costs $5.") ==
        Tokens{"Hello", ",", "world", "!", "1,000.5", "costs", "$", "5."});
  // Matches do not overlap: in "a.," the first rule takes "a." and cannot see ".,"; the
  // second rule then separates ',' from 'b'.
  CHECK(bleu_tokenize("a.,b") == Tokens{"a", ".", ",", "b"});
  CHECK(bleu_tokenize("(x)") == Tokens{"(", "x", ")"});
  CHECK(bleu_tokenize("x+y=z") == Tokens{"x", "+", "y", "=", "z"});
  CHECK(bleu_tokenize("3.5% more") == Tokens{"3.5", "%", "more"});  // '%' is punctuation
  CHECK(bleu_tokenize("\u201EGut\u201C, sagt er.") ==  // German quotes are punctuation
        Tokens{"\u201E", "Gut", "\u201C", ",", "sagt", "er", "."});
  CHECK(bleu_tokenize(" \t\u3000 ") == Tokens{});  // Unicode whitespace separates
}

TEST_CASE("bleu: cases computed by hand", "[bleu]") {
  // Identical sentences of 4 tokens or more: every precision 1, no penalty.
  CHECK(bleu1("the cat sat on the mat", "the cat sat on the mat") == 1.0);

  // A zero-match order: ref "a b c d", hyp "a b d c". Unigrams 4/4; bigrams ab|bd|dc
  // against ab|bc|cd: 1/3; trigrams abd|bdc: none of 2 match, the first such order gets
  // 1/(2*2); the 4-gram abdc: none of 1, the second such order 1/(4*1).
  // BLEU = (1 * 1/3 * 1/4 * 1/4)^(1/4) = 48^(-1/4).
  CHECK(std::abs(bleu1("a b c d", "a b d c") - std::pow(48.0, -0.25)) < kTol);

  // Clipping: "the" three times against once counts 1 of 3; bigrams "the the" (2) 0 ->
  // 1/(2*2); the trigram (1) 0 -> 1/(4*1); no 4-gram: precision 0, left out of the log
  // sum, which is still divided by 4. Again 48^(-1/4); longer than the reference: no penalty.
  CHECK(std::abs(bleu1("the cat", "the the the") - std::pow(48.0, -0.25)) < kTol);

  // Orders without n-grams drop out but the mean stays over 4: "a x" against "a b":
  // unigrams 1/2, the bigram 0 of 1 -> 1/2; (1/2 * 1/2)^(1/4) = 2^(-1/2).
  CHECK(std::abs(bleu1("a b", "a x") - std::sqrt(0.5)) < kTol);
  // ... so two identical tokens score 1.
  CHECK(bleu1("a b", "a b") == 1.0);

  // Brevity penalty: 3 tokens against 6, all precisions 1 (no 4-gram): exp(1 - 6/3).
  CHECK(std::abs(bleu1("a b c d e f", "a b c") - std::exp(-1.0)) < kTol);
  // Nothing in common: every order is a zero-match order, so none is 0 and the score is
  // not: 1/(2*4), 1/(4*3), 1/(8*2), 1/(16*1), BLEU = (8*12*16*16)^(-1/4), about 0.08.
  CHECK(std::abs(bleu1("a b c d", "w x y z") - std::pow(8.0 * 12 * 16 * 16, -0.25)) < kTol);
  // An empty translation: no n-gram at all, so every precision is 0.
  CHECK(bleu1("a b c d", "") == 0.0);

  // A corpus: precisions add up over sentences before dividing.
  //   1: ref "a b c d", hyp "a b c d": 4/4, 3/3, 2/2, 1/1
  //   2: ref "e f g h", hyp "e f x":   2/3, 1/2, 0/1, no 4-gram
  //   total 6/7, 4/5, 2/3, 1/1; lengths 8 and 7: penalty exp(1 - 8/7).
  double expected = std::pow(6.0 / 7 * 4.0 / 5 * 2.0 / 3, 0.25) * std::exp(1.0 - 8.0 / 7);
  double got = compute_bleu(split_each({"a b c d", "e f g h"}), split_each({"a b c d", "e f x"}));
  CHECK(std::abs(got - expected) < kTol);

  // On lines: rounded to float32, then x100 (as the reference returns it).
  double lines = bleu_on_lines({"a b c d", "e f g h"}, {"a b c d", "e f x"}, true);
  CHECK(lines == static_cast<double>(static_cast<float>(expected)) * 100.0);
  CHECK(bleu_on_lines({"a b c d"}, {"a b c d"}, true) == 100.0);
}

TEST_CASE("bleu: cased and uncased", "[bleu]") {
  // Uncased lower-cases both sides first: "The Cat sat on the mat." is identical then.
  std::vector<std::string> ref = {"The Cat sat on the mat."};
  std::vector<std::string> hyp = {"the cat sat on the mat."};
  CHECK(bleu_on_lines(ref, hyp, false) == 100.0);
  // Cased: ref The Cat sat on the mat . ; hyp the cat sat on the mat . (7 tokens each).
  //   unigrams: sat, on, the (the hyp's second "the" is clipped), mat, .  -> 5/7
  //   bigrams:  sat on, on the, the mat, mat .                          -> 4/6
  //   trigrams: sat on the, on the mat, the mat .                        -> 3/5
  //   4-grams:  sat on the mat, on the mat .                             -> 2/4
  double expected = std::pow(5.0 / 7 * 4.0 / 6 * 3.0 / 5 * 2.0 / 4, 0.25);
  CHECK(bleu_on_lines(ref, hyp, true) == static_cast<double>(static_cast<float>(expected)) * 100.0);
}

TEST_CASE("bleu: files as the reference reads them", "[bleu]") {
  test::TempDir dir;
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream f(dir.path / name, std::ios::binary);
    f << content;
    return (dir.path / name).string();
  };
  // Blank lines around the text do not count; \r\n ends a line once; the last line needs
  // no newline.
  std::string ref = write("ref", "\n\nThe cat sat on the mat.\r\nA dog.\n\n\n");
  std::string hyp = write("hyp", "the cat sat on the mat.\nA dog.");
  CHECK(read_bleu_lines(ref) == std::vector<std::string>{"The cat sat on the mat.", "A dog."});
  BleuScores s = bleu_on_files(ref, hyp);
  CHECK(s.uncased == 100.0);
  CHECK(s.cased < 100.0);
  CHECK(format_bleu(100.0) == "100.0");
  CHECK(format_bleu(0.0) == "0.0");
  CHECK(format_bleu(static_cast<double>(0.25f) * 100) == "25.0");
  CHECK(format_bleu(12.5) == "12.5");
  // Python's repr: fixed notation from 1e-4 up to 1e16, the shortest digits that read back.
  CHECK(format_bleu(0.0001) == "0.0001");
  CHECK(format_bleu(0.00001234) == "1.234e-05");
  CHECK(format_bleu(1e16) == "1e+16");
  CHECK(format_bleu(0.1 + 0.2) == "0.30000000000000004");
  CHECK(format_bleu(89.67673778533936) == "89.67673778533936");

  // Different line counts: the message names both files and their counts.
  std::string shorter = write("short", "one line\n");
  try {
    bleu_on_files(ref, shorter);
    FAIL("no error for different line counts");
  } catch (const InputError& e) {
    std::string msg = e.what();
    CHECK(msg.find(ref) != std::string::npos);
    CHECK(msg.find("has 2 lines") != std::string::npos);
    CHECK(msg.find(shorter) != std::string::npos);
    CHECK(msg.find("has 1") != std::string::npos);
  }
  std::string bad = write("bad", "fine\nbroken \xFF\n");
  try {
    bleu_on_files(ref, bad);
    FAIL("no error for invalid UTF-8");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == "BLEU file '" + bad + "' line 2: invalid UTF-8 at byte 7");
  }
  CHECK_THROWS_AS(bleu_on_files(ref, (dir.path / "missing").string()), InputError);
}

TEST_CASE("bleu: random bytes are answered with a score or an InputError", "[bleu]") {
  std::mt19937 rng(29);
  // Whole characters (punctuation, digits, symbols, sigma, separators), and now and then
  // (1 in 100) a raw byte that may break the UTF-8.
  const std::vector<std::string> pieces = {" ", ".", ",", "1", "$", "a", "A", "\xC2\xA7", "\xE2\x82\xAC",
                                           "\xCE\xA3", "\xC4\xB0", "\n", "\r", "\xE3\x80\x80"};
  auto bytes = [&](size_t max_len) {
    std::string s;
    size_t n = rng() % (max_len + 1);
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 100 == 0) s.push_back(static_cast<char>(rng() % 256));
      else s += pieces[rng() % pieces.size()];
    }
    return s;
  };
  int scored = 0;
  for (int i = 0; i < 1000; ++i) {
    try {
      double b = bleu_on_lines({bytes(30), bytes(30)}, {bytes(30), bytes(30)}, i % 2 == 0);
      REQUIRE((b >= 0.0 && b <= 100.0));
      ++scored;
    } catch (const InputError&) {
    }
  }
  CHECK(scored > 10);
}
