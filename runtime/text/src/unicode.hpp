// The Unicode facts the subtokenizer and BLEU need, as Python sees them (both algorithms are
// defined by TensorFlow's Python code): UTF-8 <-> code points, character classes, and
// str.lower(). The tables come from scripts/gen_unicode_table.py (unicode_table.inc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tnt::text {

// Code points of UTF-8 text. Throws InputError "<where>: invalid UTF-8 at byte N" for a
// malformed sequence, an overlong form, a surrogate or a value above U+10FFFF.
std::u32string utf8_decode(std::string_view bytes, const std::string& where);
std::string utf8_encode(std::u32string_view text);
void utf8_append(std::string& out, char32_t c);

bool is_alnum(char32_t c);           // category L* or N* (the subtokenizer's split)
bool is_punct(char32_t c);           // category P*
bool is_symbol(char32_t c);          // category S*
bool is_decimal(char32_t c);         // str.isdecimal(): what Python's regex \d matches
bool is_space(char32_t c);           // str.isspace()
bool is_cased(char32_t c);           // Unicode Cased
bool is_case_ignorable(char32_t c);  // Unicode Case_Ignorable

// Python's str.lower(): full lower-case mappings (U+0130 becomes two code points) and the
// final-sigma rule for U+03A3.
std::u32string python_lower(std::u32string_view text);

// str.strip() and str.split() with no argument (Python's whitespace).
std::u32string_view python_strip(std::u32string_view text);

const char* unicode_version();  // of the tables

}  // namespace tnt::text
