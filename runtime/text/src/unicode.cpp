// Character classes by binary search over the generated range tables, UTF-8 as Python's
// strict codec reads it, and str.lower() with its one context rule.
#include "unicode.hpp"

#include "tarantella/check.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace tnt::text {
namespace {

struct CodeRange {
  char32_t first;
  char32_t last;
};
struct LowerEntry {
  char32_t from;
  char32_t to[3];  // 0-terminated when shorter
};

#include "unicode_table.inc"

template <size_t N>
bool in_table(const CodeRange (&table)[N], char32_t c) {
  // The first range whose last >= c; c is in the table iff that range starts at or before c.
  auto it = std::lower_bound(std::begin(table), std::end(table), c,
                             [](const CodeRange& r, char32_t v) { return r.last < v; });
  return it != std::end(table) && it->first <= c;
}

// Text is mostly ASCII: the seven classes of the first 128 code points as bit masks, computed
// from the same tables at compile time, so the common case is one shift instead of a search
// (BLEU over a file spends most of its time classifying characters).
enum ClassBit : uint8_t {
  kBitAlnum = 1,
  kBitPunct = 2,
  kBitSymbol = 4,
  kBitDecimal = 8,
  kBitSpace = 16,
  kBitCased = 32,
  kBitCaseIgnorable = 64
};

struct AsciiClasses {
  uint8_t bits[128];
};

// Ranges are sorted, so only the first few of each table can reach below 128; the loops stay
// far inside the compilers' constant-evaluation step limits.
template <size_t N>
constexpr void mark_ascii(AsciiClasses& a, const CodeRange (&table)[N], uint8_t bit) {
  for (const CodeRange& r : table) {
    if (r.first >= 128) break;
    for (char32_t c = r.first; c <= r.last && c < 128; ++c) a.bits[c] |= bit;
  }
}

constexpr AsciiClasses make_ascii_classes() {
  AsciiClasses a{};
  mark_ascii(a, kAlnum, kBitAlnum);
  mark_ascii(a, kPunct, kBitPunct);
  mark_ascii(a, kSymbol, kBitSymbol);
  mark_ascii(a, kDecimal, kBitDecimal);
  mark_ascii(a, kSpace, kBitSpace);
  mark_ascii(a, kCased, kBitCased);
  mark_ascii(a, kCaseIgnorable, kBitCaseIgnorable);
  return a;
}

constexpr AsciiClasses kAscii = make_ascii_classes();

template <size_t N>
bool has_class(const CodeRange (&table)[N], uint8_t bit, char32_t c) {
  return c < 128 ? (kAscii.bits[c] & bit) != 0 : in_table(table, c);
}

}  // namespace

bool is_alnum(char32_t c) { return has_class(kAlnum, kBitAlnum, c); }
bool is_punct(char32_t c) { return has_class(kPunct, kBitPunct, c); }
bool is_symbol(char32_t c) { return has_class(kSymbol, kBitSymbol, c); }
bool is_decimal(char32_t c) { return has_class(kDecimal, kBitDecimal, c); }
bool is_space(char32_t c) { return has_class(kSpace, kBitSpace, c); }
bool is_cased(char32_t c) { return has_class(kCased, kBitCased, c); }
bool is_case_ignorable(char32_t c) { return has_class(kCaseIgnorable, kBitCaseIgnorable, c); }
const char* unicode_version() { return kUnicodeVersion; }

std::u32string utf8_decode(std::string_view bytes, const std::string& where) {
  std::u32string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  auto bad = [&](size_t at) {
    TNT_INPUT_ERROR("{}: invalid UTF-8 at byte {}", where, at);
  };
  for (size_t i = 0; i < n;) {
    unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    int len = 0;  // set below, or bad() throws
    char32_t c = 0;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3, c = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4, c = b & 0x07;
    } else {
      bad(i);
    }
    if (i + len > n) bad(i);
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) bad(i);
      c = (c << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are errors, as in Python.
    if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF))
      bad(i);
    out.push_back(c);
    i += static_cast<size_t>(len);
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) utf8_append(out, c);
  return out;
}

std::u32string python_lower(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char32_t c = text[i];
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
      continue;
    }
    if (c == 0x3A3) {
      // Final sigma: a cased character before it (case-ignorable ones skipped) and none
      // after it (same skipping).
      size_t j = i;
      while (j > 0 && is_case_ignorable(text[j - 1])) --j;
      bool final_sigma = j > 0 && is_cased(text[j - 1]);
      if (final_sigma) {
        size_t k = i + 1;
        while (k < text.size() && is_case_ignorable(text[k])) ++k;
        final_sigma = k == text.size() || !is_cased(text[k]);
      }
      out.push_back(final_sigma ? 0x3C2 : 0x3C3);
      continue;
    }
    auto it = std::lower_bound(std::begin(kLower), std::end(kLower), c,
                               [](const LowerEntry& e, char32_t v) { return e.from < v; });
    if (it != std::end(kLower) && it->from == c) {
      for (char32_t t : it->to)
        if (t) out.push_back(t);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::u32string_view python_strip(std::u32string_view text) {
  size_t b = 0, e = text.size();
  while (b < e && is_space(text[b])) ++b;
  while (e > b && is_space(text[e - 1])) --e;
  return text.substr(b, e - b);
}

}  // namespace tnt::text
