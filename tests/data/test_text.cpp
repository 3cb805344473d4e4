// The subtokenizer (tarantella/text/subtokenizer.hpp): Unicode classes, escapes, encodings worked out by
// hand, vocabulary files and their errors, vocabulary building (a case by hand, and
// properties on a generated corpus), and decode(encode(s)) == s on random Unicode text.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>

#include "unicode.hpp"  // runtime/text/src
#include "tarantella/check.hpp"
#include "tarantella/text/subtokenizer.hpp"

#include <algorithm>
#include <fstream>
#include <optional>
#include <random>
#include <set>

using namespace tnt;
namespace fs = std::filesystem;

namespace {

std::string u8(std::u32string_view s) { return text::utf8_encode(s); }

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  REQUIRE(f.good());
}

// The message of the InputError that fn throws ("" when it throws none).
template <class Fn>
std::string input_error(Fn fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// A hand-made vocabulary: ids are the positions below.
const std::vector<std::string> kSmallVocab = {
    "<pad>", "<EOS>",  // 0, 1
    "the_",            // 2
    "cat_",            // 3
    "c", "a", "t", "h", "e",  // 4..8
    "_",               // 9
    " ",               // 10
    "!_",              // 11
    "\\", "u", ";",    // 12, 13, 14
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",  // 15..24
    "ca",              // 25
};

// Random text from several scripts and the characters the escapes care about.
std::string random_text(std::mt19937& rng, size_t max_len) {
  static const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},      // ASCII printable, '_' and '\' among them
      {0xA0, 0x24F},     // Latin-1 and Latin Extended (letters, signs, no-break space)
      {0x370, 0x3FF},    // Greek
      {0x400, 0x4FF},    // Cyrillic
      {0x660, 0x669},    // Arabic-Indic digits (Nd)
      {0x2000, 0x206F},  // general punctuation, spaces, line and paragraph separators
      {0x4E00, 0x4E3F},  // CJK ideographs
      {0x1F600, 0x1F64F},  // emoji (symbols outside the BMP)
  };
  std::uniform_int_distribution<size_t> len_dist(0, max_len), range_dist(0, ranges.size() - 1);
  std::u32string s;
  size_t len = len_dist(rng);
  for (size_t i = 0; i < len; ++i) {
    auto [lo, hi] = ranges[range_dist(rng)];
    s.push_back(std::uniform_int_distribution<uint32_t>(lo, hi)(rng));
  }
  if (!s.empty() && std::uniform_int_distribution<int>(0, 3)(rng) == 0) s[0] = U'\n';
  return u8(s);
}

}  // namespace

TEST_CASE("unicode: classes of characters whose category the standard fixes", "[text]") {
  // Letters (L*) and numbers (N*) are alphanumeric, whatever the script.
  for (char32_t c : {U'a', U'Z', U'0', U'9', U'\u00DF' /*ß*/, U'\u4E2D' /*中*/, U'\u0663' /*Arabic 3*/,
                     U'\u00B2' /*superscript 2, No*/, U'\u2167' /*Roman numeral 8, Nl*/})
    CHECK(text::is_alnum(c));
  for (char32_t c : {U' ', U'_', U'-', U'.', U'$', U'\u00A0', U'\u20AC' /*€*/, U'\U0001F600'})
    CHECK_FALSE(text::is_alnum(c));
  // Punctuation (P*): connector '_', dash '-', open/close, quotes, '¿'.
  for (char32_t c : {U'_', U'-', U'(', U')', U',', U'.', U'!', U'"', U'\'', U'\u00BF', U'\u2019'})
    CHECK(text::is_punct(c));
  // Symbols (S*): currency, math, modifier, other.
  for (char32_t c : {U'$', U'+', U'<', U'^', U'`', U'|', U'~', U'\u20AC', U'\u00A9', U'\U0001F600'})
    CHECK(text::is_symbol(c));
  CHECK_FALSE(text::is_punct(U'$'));
  CHECK_FALSE(text::is_symbol(U','));
  // Decimal digits (Nd) only, not other numbers.
  CHECK(text::is_decimal(U'7'));
  CHECK(text::is_decimal(U'\u0663'));
  CHECK_FALSE(text::is_decimal(U'\u00B2'));
  CHECK_FALSE(text::is_decimal(U'a'));
  for (char32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\x1C', U'\u0085', U'\u00A0', U'\u2028', U'\u3000'})
    CHECK(text::is_space(c));
  CHECK_FALSE(text::is_space(U'\u200B'));  // zero width space is Cf, not whitespace
}

TEST_CASE("unicode: every ASCII character's classes, as Python gives them", "[text]") {
  // The classes of code points below 128 come from a compile-time bit table rather than the
  // range search; each set below is what scripts/gen_unicode_table.py's definitions give for
  // ASCII (unicodedata categories, str.isdecimal/isspace, the final-sigma probes).
  const std::string alnum = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  const std::string punct = "!\"#%&'()*,-./:;?@[\\]_{}";
  const std::string symbol = "$+<=>^`|~";
  const std::string decimal = "0123456789";
  const std::string space = "\t\n\v\f\r\x1c\x1d\x1e\x1f ";
  const std::string cased = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  const std::string case_ignorable = "'.:^`";
  auto in = [](const std::string& set, char32_t c) { return set.find(static_cast<char>(c)) != std::string::npos; };
  for (char32_t c = 0; c < 128; ++c) {
    INFO("code point " << static_cast<uint32_t>(c));
    CHECK(text::is_alnum(c) == in(alnum, c));
    CHECK(text::is_punct(c) == in(punct, c));
    CHECK(text::is_symbol(c) == in(symbol, c));
    CHECK(text::is_decimal(c) == in(decimal, c));
    CHECK(text::is_space(c) == in(space, c));
    CHECK(text::is_cased(c) == in(cased, c));
    CHECK(text::is_case_ignorable(c) == in(case_ignorable, c));
  }
  // Just past the fast path, the search answers: U+0080 is a control, U+00A0 a space, U+00AA a
  // letter, U+00AD (soft hyphen, Cf) case-ignorable, U+00B5 (micro sign) cased.
  CHECK_FALSE(text::is_space(U'\u0080'));
  CHECK(text::is_space(U'\u00A0'));
  CHECK(text::is_alnum(U'\u00AA'));
  CHECK(text::is_case_ignorable(U'\u00AD'));
  CHECK(text::is_cased(U'\u00B5'));
}

TEST_CASE("unicode: UTF-8 as Python's strict codec reads it", "[text]") {
  std::u32string all = U"a\u00E9\u4E2D\U0001F600";
  CHECK(text::utf8_decode(u8(all), "x") == all);
  CHECK(u8(all) == "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
  // Broken: a lone continuation byte, a truncated sequence, an overlong '/', a surrogate,
  // a value past U+10FFFF. The message names the input and the byte.
  for (std::string bad : {std::string("ab\x80"), std::string("ab\xE4\xB8"), std::string("ab\xC0\xAF"),
                          std::string("ab\xED\xA0\x80"), std::string("ab\xF4\x90\x80\x80")}) {
    std::string msg = input_error([&] { text::utf8_decode(bad, "line 7 of f.txt"); });
    CHECK(msg == "line 7 of f.txt: invalid UTF-8 at byte 2");
  }
}

TEST_CASE("unicode: str.lower(), with the final sigma", "[text]") {
  CHECK(u8(text::python_lower(U"HELLO World")) == "hello world");
  CHECK(u8(text::python_lower(U"\u00C9COLE")) == u8(U"\u00E9cole"));
  // U+0130 (I with dot) lower-cases to two code points: i + combining dot above.
  CHECK(text::python_lower(U"\u0130") == U"i\u0307");
  // Sigma: final (ς) after a cased letter when no cased letter follows; σ otherwise.
  CHECK(text::python_lower(U"\u039F\u0394\u039F\u03A3") == U"\u03BF\u03B4\u03BF\u03C2");    // ΟΔΟΣ -> οδος
  CHECK(text::python_lower(U"\u03A3\u0391\u03A3 x") == U"\u03C3\u03B1\u03C2 x");            // ΣΑΣ x -> σας x
  CHECK(text::python_lower(U"\u03A3") == U"\u03C3");                                          // alone
  CHECK(text::python_lower(U"A\u03A3'") == U"a\u03C2'");     // ' is case-ignorable, then the end
  CHECK(text::python_lower(U"A\u03A3'b") == U"a\u03C3'b");   // ... but a cased letter follows
}

TEST_CASE("subtokenizer: tokens, escapes and joins", "[text]") {
  // A single space between two tokens is dropped; other runs of non-alphanumerics stay.
  CHECK(split_to_tokens("the cat!") == std::vector<std::string>{"the", "cat", "!"});
  CHECK(split_to_tokens(" a  b") == std::vector<std::string>{" ", "a", "  ", "b"});
  CHECK(split_to_tokens("x, y") == std::vector<std::string>{"x", ", ", "y"});
  CHECK(split_to_tokens("") == std::vector<std::string>{});
  CHECK(join_tokens({"the", "cat", "!"}) == "the cat!");
  CHECK(join_tokens({" ", "a", "  ", "b"}) == " a  b");
  // Lines are stripped as Python strips them: Unicode whitespace, not only ASCII.
  CHECK(strip_whitespace(" \t" + u8(U"\u3000x y\u00A0\u2028") + "\r\n") == "x y");

  // '_' -> \u, '\' -> \\, a character outside the alphabet -> \<decimal>;, then '_'.
  std::string alphabet = "abc\\u;0123456789_";
  CHECK(escape_token("a_b", alphabet) == "a\\ub_");
  CHECK(escape_token("a\\b", alphabet) == "a\\\\b_");
  CHECK(escape_token("az", alphabet) == "a\\122;_");            // 'z' is 122
  CHECK(escape_token(u8(U"\u00E9"), alphabet) == "\\233;_");     // é is 233
  CHECK(escape_token("a\nb", alphabet + "\n") == "a\\10;b_");   // '\n' is always escaped
  CHECK(unescape_token("a\\ub") == "a_b");
  CHECK(unescape_token("a\\\\b") == "a\\b");
  CHECK(unescape_token("\\233;") == u8(U"\u00E9"));
  CHECK(unescape_token("\\1114112;") == u8(U"\u3013"));  // past U+10FFFF: the reference's stand-in
  CHECK(unescape_token("\\12x") == "\\12x");              // not an escape: kept
  CHECK(unescape_token("\\") == "\\");

  // Escape round trip on random tokens with random alphabets.
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string token = random_text(rng, 12);
    std::string alpha = random_text(rng, 30) + "\\u;0123456789";
    std::string escaped = escape_token(token, alpha);
    REQUIRE(escaped.back() == '_');
    CHECK(escaped.substr(0, escaped.size() - 1).find('_') == std::string::npos);
    CHECK(unescape_token(escaped.substr(0, escaped.size() - 1)) == token);
  }
}

TEST_CASE("subtokenizer: known encodings of a small vocabulary", "[text]") {
  Subtokenizer sub(kSmallVocab);
  REQUIRE(sub.vocab_size() == 26);
  // "the cat!": tokens "the", "cat", "!" (the single space goes); escaped "the_", "cat_",
  // "!_", each a subtoken of its own: 2, 3, 11.
  CHECK(sub.encode("the cat!") == std::vector<int64_t>{2, 3, 11});
  CHECK(sub.encode("the cat!", true) == std::vector<int64_t>{2, 3, 11, kEosId});
  // "cat hat": "cat_" is whole (3). "hat_": no "hat_", "hat", "ha" in the list, so
  // h (7); then "at_", "at" missing: a (5); "t_" missing: t (6); then _ (9).
  CHECK(sub.encode("cat hat") == std::vector<int64_t>{3, 7, 5, 6, 9});
  // "cab": escaped "cab_"; longest first: "cab_", "cab" missing, "ca" (25); then b is not
  // in the alphabet: escaped to "\98;" before splitting, so \ (12), 9 (24), 8 (23), ; (14),
  // then _ (9).
  CHECK(sub.encode("cab") == std::vector<int64_t>{25, 12, 24, 23, 14, 9});
  // "a_" is two tokens ('_' is punctuation): "a_" -> a (5), _ (9); then "_" is escaped to
  // "\u_" -> \ (12), u (13), _ (9).
  CHECK(sub.encode("a_") == std::vector<int64_t>{5, 9, 12, 13, 9});
  CHECK(sub.decode({5, 9, 12, 13, 9}) == "a_");
  // Two spaces are a token of their own: "  _" -> ' ' (10), ' ' (10), '_' (9).
  CHECK(sub.encode("the  cat") == std::vector<int64_t>{2, 10, 10, 9, 3});

  CHECK(sub.decode({2, 3, 11}) == "the cat!");
  CHECK(sub.decode({25, 12, 24, 23, 14, 9}) == "cab");
  CHECK(sub.decode({2, 10, 10, 9, 3}) == "the  cat");
  CHECK(sub.decode({}) == "");
  CHECK(sub.decode({2, 999, 3}) == "the cat");  // an id past the end is skipped
  CHECK(sub.decode(trim_at_eos({2, 3, kEosId, 2})) == "the cat");
  CHECK(input_error([&] { sub.decode({2, -1}); }).find("-1") != std::string::npos);

  // Without the escape characters, a character outside the alphabet cannot be written.
  Subtokenizer bare({"a", "b", "_"});
  CHECK(bare.encode("ab") == std::vector<int64_t>{2, 3, 4});
  CHECK(input_error([&] { bare.encode("ax"); }).find("cannot encode the token \"ax\"") != std::string::npos);
}

TEST_CASE("subtokenizer: vocabulary files", "[text]") {
  test::TempDir dir;
  fs::path path = dir.path / "vocab";
  // The reserved tokens move to 0 and 1 wherever they are; whitespace around a line goes.
  write_text(path, "'x_'\n'<EOS>'\n  'y_'  \r\n'<pad>'\n'\\u'\n");
  Subtokenizer sub = Subtokenizer::from_file(path.string());
  CHECK(sub.subtokens() == std::vector<std::string>{"<pad>", "<EOS>", "x_", "y_", "\\u"});
  // save writes the same format, and reading it back gives the same list.
  fs::path saved = dir.path / "saved";
  sub.save(saved.string());
  CHECK(Subtokenizer::from_file(saved.string()).subtokens() == sub.subtokens());
  CHECK_FALSE(fs::exists(saved.string() + ".tmp"));

  auto error_of = [&](const std::string& content) {
    write_text(path, content);
    return input_error([&] { Subtokenizer::from_file(path.string()); });
  };
  std::string p = path.string();
  // A UTF-8 byte-order mark before the first subtoken is no part of it.
  write_text(path, "\xEF\xBB\xBF'<pad>'\n'<EOS>'\n'x_'\n");
  CHECK(Subtokenizer::from_file(path.string()).subtokens() == std::vector<std::string>{"<pad>", "<EOS>", "x_"});
  CHECK(error_of("'a'\nb\n") ==
        "vocabulary file '" + p + "' line 2: expected a subtoken in single quotes, e.g. 'the_', found \"b\"");
  CHECK(error_of("'a'\n\n'b'\n").find("' line 2: expected a subtoken") != std::string::npos);
  CHECK(error_of("'a'\n'\xFF'\n") == "vocabulary file '" + p + "' line 2: invalid UTF-8 at byte 1");
  CHECK(error_of("'a'\n'b'\n'a'\n") == "vocabulary file '" + p + "' line 3: subtoken 'a' is already on line 1");
  CHECK(error_of("") == "vocabulary file '" + p + "': no subtokens in it");
  CHECK(input_error([&] { Subtokenizer::from_file((dir.path / "missing").string()); })
            .find("missing': no such file") != std::string::npos);
}

TEST_CASE("vocabulary: a build worked out by hand", "[text]") {
  // Text "ab ab ab": the token "ab" three times (the spaces between go). Alphabet: a b, the
  // characters of <pad> and <EOS> (< p a d > E O S) and the escape characters (\ _ u ; 0-9):
  // 23 characters. min_count 2.
  // Round 1 (subtokens: single characters) splits "ab_" into a|b|_ and counts every
  // substring from each boundary, 3 each: a ab ab_ b b_ _. Longest first: ab_ (3) is kept
  // and takes 3 from a and ab; b_ (3) is kept and takes 3 from b; ab, a, b are left at 0.
  // Round 2 splits "ab_" whole, so only a, ab, ab_ are counted; ab_ is kept, a and ab fall
  // to 0; rounds 3 and 4 repeat it. The list: ab_ (3), then the alphabet, all at count 0,
  // in descending code point order (the reference sorts (count, subtoken) descending).
  std::unordered_map<std::string, int64_t> counts = {{"ab", 3}};
  VocabularyOptions o;
  o.min_count = 2;
  std::vector<std::string> expected = {"<pad>", "<EOS>", "ab_", "u", "p", "d", "b", "a", "_", "\\", "S", "O", "E",
                                       ">", "<", ";", "9", "8", "7", "6", "5", "4", "3", "2", "1", "0"};
  CHECK(build_vocabulary(counts, o) == expected);
  // The counts come from text: "ab ab ab" on one line.
  test::TempDir dir;
  write_text(dir.path / "t.txt", "ab ab ab\n");
  CHECK(count_tokens({(dir.path / "t.txt").string()}) == counts);
}

TEST_CASE("vocabulary: sampling of large files", "[text]") {
  // 100 lines "w00".."w99" (400 bytes) with a limit of 20 characters: the reference skips
  // int(400 / (2*20)) = 10 lines before each line it reads and stops once the read lines
  // (3 characters each) pass 20: it reads w10, w21, w32, w43, w54, w65, w76 (20 - 7*3 < 0).
  test::TempDir dir;
  std::string content;
  for (int i = 0; i < 100; ++i) content += fmt::format("w{:02d}\n", i);
  write_text(dir.path / "t.txt", content);
  auto counts = count_tokens({(dir.path / "t.txt").string()}, 20);
  std::unordered_map<std::string, int64_t> expected;
  for (int i : {10, 21, 32, 43, 54, 65, 76}) expected[fmt::format("w{:02d}", i)] = 1;
  CHECK(counts == expected);
  // Errors name the file and line.
  write_text(dir.path / "bad.txt", "fine\n\xC3(\n");
  std::string msg = input_error([&] { count_tokens({(dir.path / "bad.txt").string()}); });
  CHECK(msg == fmt::format("text file '{}' line 2: invalid UTF-8 at byte 0", (dir.path / "bad.txt").string()));
  CHECK(input_error([&] { count_tokens({(dir.path / "none.txt").string()}); }).find("none.txt") != std::string::npos);
}

TEST_CASE("vocabulary: properties on a generated corpus, and round trips", "[text]") {
  // Words from a Zipf-like draw over made-up syllables, with punctuation, digits, '_' and
  // '\' mixed in: a few thousand lines, enough for subtokens longer than one character.
  std::mt19937 rng(11);
  const std::vector<std::string> syllables = {"ka", "ro", "mi", "te", "sch", "ü", "ß", "an", "el", "or", "ind", "é"};
  std::vector<std::string> words;
  for (int i = 0; i < 300; ++i) {
    std::string w;
    int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) w += syllables[rng() % syllables.size()];
    words.push_back(w);
  }
  std::string corpus;
  std::vector<std::string> lines;
  for (int l = 0; l < 2000; ++l) {
    std::string line;
    int n = 3 + static_cast<int>(rng() % 8);
    for (int k = 0; k < n; ++k) {
      // Zipf-like: the index is the square of a uniform draw, so low indices dominate.
      double u = std::uniform_real_distribution<double>(0, 1)(rng);
      line += (k ? " " : "") + words[static_cast<size_t>(u * u * static_cast<double>(words.size()))];
    }
    const char* ends[] = {".", "!", " 42.", ", a_b", " \\o/"};
    line += ends[rng() % 5];
    lines.push_back(line);
    corpus += line + "\n";
  }
  test::TempDir dir;
  write_text(dir.path / "c.txt", corpus);
  auto counts = count_tokens({(dir.path / "c.txt").string()});

  // Fixed min_count: a higher one keeps fewer subtokens.
  auto size_at = [&](int64_t min_count) {
    VocabularyOptions o;
    o.min_count = min_count;
    return build_vocabulary(counts, o).size();
  };
  size_t s2 = size_at(2), s50 = size_at(50), s500 = size_at(500);
  CHECK(s2 > s50);
  CHECK(s50 > s500);

  // Search: a target between those sizes is met within the threshold, and the result is
  // the list closest to the target among those the search tried.
  VocabularyOptions o;
  o.target_size = static_cast<int64_t>((s2 + s50) / 2);
  o.threshold = std::max<int64_t>(2, o.target_size / 20);  // 5%
  std::vector<std::string> log;
  std::vector<std::string> vocab = build_vocabulary(counts, o, &log);
  INFO("target " << o.target_size << ", got " << vocab.size());
  CHECK(std::abs(static_cast<int64_t>(vocab.size()) - o.target_size) < o.threshold);
  REQUIRE(!log.empty());

  // Reserved ids, no duplicates, every character of the text has a subtoken of its own.
  REQUIRE(vocab.size() > 2);
  CHECK(vocab[0] == "<pad>");
  CHECK(vocab[1] == "<EOS>");
  CHECK(std::set<std::string>(vocab.begin(), vocab.end()).size() == vocab.size());
  std::set<std::string> singles(vocab.begin(), vocab.end());
  for (char32_t c : text::utf8_decode(corpus, "corpus")) {
    if (c == U'\n') continue;
    INFO("character U+" << std::hex << static_cast<uint32_t>(c));
    CHECK(singles.count(u8(std::u32string(1, c))) == 1);
  }
  Subtokenizer sub(vocab);
  // Subtokens longer than a character do the work: the corpus encodes in fewer ids than it
  // has characters.
  size_t ids = 0, chars = 0;
  for (const auto& line : lines) {
    std::vector<int64_t> e = sub.encode(line);
    ids += e.size();
    chars += text::utf8_decode(line, "line").size();
    REQUIRE(sub.decode(e) == line);
  }
  CHECK(ids * 2 < chars);

  // decode(encode(s)) == s for random text, most of whose characters are not in the
  // alphabet (they go through the \N; escape).
  for (int i = 0; i < 500; ++i) {
    std::string s = random_text(rng, 40);
    std::vector<int64_t> e = sub.encode(s);
    for (int64_t id : e) REQUIRE((id >= 2 && id < sub.vocab_size()));
    REQUIRE(sub.decode(e) == s);
  }
}

TEST_CASE("subtokenizer: random bytes are answered with a result or an InputError", "[text]") {
  // Random vocabulary files, texts and id lists, biased towards the bytes the parsers care
  // about (quotes, newlines, backslashes, escape digits, UTF-8 lead and continuation
  // bytes). Anything but success or InputError (another exception, a crash) fails.
  test::TempDir dir;
  fs::path path = dir.path / "vocab";
  std::mt19937 rng(23);
  // Whole characters, and now and then (1 in 100) a raw byte that may break the UTF-8.
  const std::vector<std::string> pieces = {"'", "\n", "\\", "_", "u", ";", "0", "9", " ", "a", "b",
                                           "\xC3\xA9", "\xE4\xB8\x80", "\xF0\x9F\x98\x80", "\xE2\x80\xA8"};
  auto bytes = [&](size_t max_len, bool newlines = true) {
    std::string s;
    size_t n = rng() % (max_len + 1);
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 100 == 0) {
        s.push_back(static_cast<char>(rng() % 256));
      } else {
        const std::string& p = pieces[rng() % pieces.size()];
        s += newlines || p != "\n" ? p : "x";
      }
    }
    return s;
  };
  int parsed = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    // Mostly well-formed lines with random content, sometimes raw bytes.
    std::string content;
    if (i % 4 == 0) {
      content = bytes(80);
    } else {
      // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "'" + str.
      for (int l = 0; l < 8; ++l) content.append("'").append(bytes(4, false)).append("'\n");
    }
    write_text(path, content);
    std::optional<Subtokenizer> sub;
    try {
      sub.emplace(Subtokenizer::from_file(path.string()));
      ++parsed;
    } catch (const InputError&) {
      ++refused;
      continue;
    }
    for (int k = 0; k < 5; ++k) {
      try {
        std::vector<int64_t> ids = sub->encode(bytes(20));
        for (int64_t id : ids) REQUIRE((id >= 0 && id < sub->vocab_size()));
      } catch (const InputError&) {
      }
      std::vector<int64_t> ids;
      for (int j = 0; j < 8; ++j) ids.push_back(static_cast<int64_t>(rng() % 40) - 2);
      try {
        (void)sub->decode(ids);
      } catch (const InputError&) {
      }
    }
  }
  // Both outcomes happened, so both paths were exercised.
  INFO(parsed << " files parsed, " << refused << " refused");
  CHECK(parsed > 20);
  CHECK(refused > 50);
  for (int i = 0; i < 2000; ++i) {
    std::string s = bytes(30);
    try {
      (void)unescape_token(s);
      (void)split_to_tokens(s);
      (void)strip_whitespace(s);
    } catch (const InputError&) {
    }
  }
}
