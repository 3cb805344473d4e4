// BLEU, as tarantella/text/bleu.hpp describes. The tokenizer's three regular-expression passes are
// written as the scans that Python's re.sub performs (non-overlapping matches, left to
// right), because a match consumes both characters it looked at: in "a.," only "." gets
// spaces from the first pass, the "," is the second pass's.
#include "tarantella/text/bleu.hpp"
#include "tarantella/files.hpp"

#include "unicode.hpp"
#include "tarantella/check.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string_view>
#include <sstream>
#include <unordered_map>

namespace tnt {
namespace {

using text::is_decimal;
using text::is_punct;
using text::is_space;
using text::is_symbol;

std::vector<std::string> tokenize32(std::u32string_view s) {
  // ([^\d])([P]) -> "\1 \2 "
  std::u32string a;
  a.reserve(s.size() * 2);
  for (size_t i = 0; i < s.size();) {
    if (i + 1 < s.size() && !is_decimal(s[i]) && is_punct(s[i + 1])) {
      a.push_back(s[i]), a.push_back(U' '), a.push_back(s[i + 1]), a.push_back(U' ');
      i += 2;
    } else {
      a.push_back(s[i++]);
    }
  }
  // ([P])([^\d]) -> " \1 \2"
  std::u32string b;
  b.reserve(a.size() * 2);
  for (size_t i = 0; i < a.size();) {
    if (i + 1 < a.size() && is_punct(a[i]) && !is_decimal(a[i + 1])) {
      b.push_back(U' '), b.push_back(a[i]), b.push_back(U' '), b.push_back(a[i + 1]);
      i += 2;
    } else {
      b.push_back(a[i++]);
    }
  }
  // ([S]) -> " \1 ", then str.split()
  std::vector<std::string> tokens;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) tokens.push_back(std::move(cur)), cur.clear();
  };
  for (char32_t c : b) {
    if (is_symbol(c)) {
      flush();
      text::utf8_append(cur, c);
      flush();
    } else if (is_space(c)) {
      flush();
    } else {
      text::utf8_append(cur, c);
    }
  }
  flush();
  return tokens;
}

// Counts of every n-gram of order 1..max_order of one sentence. Tokens are first replaced by
// numbers shared by the sentence pair (equal tokens, equal numbers), so an n-gram is the string
// of its numbers: its length is its order, and no two different n-grams share a key. (Keys of
// length-prefixed token text in an ordered map cost most of BLEU's time.)
using NgramCounts = std::unordered_map<std::u32string, int64_t>;

std::u32string token_ids(const std::vector<std::string>& tokens,
                         std::unordered_map<std::string_view, char32_t>& ids) {
  std::u32string out;
  out.reserve(tokens.size());
  for (const std::string& t : tokens) {
    auto [it, added] = ids.try_emplace(t, static_cast<char32_t>(ids.size()));
    out.push_back(it->second);
  }
  return out;
}

NgramCounts ngrams(std::u32string_view ids, int max_order) {
  // No n-gram is longer than the sentence, whatever max_order says.
  size_t top = std::min(ids.size(), static_cast<size_t>(max_order));
  NgramCounts counts;
  counts.reserve(ids.size() * top);
  for (size_t order = 1; order <= top; ++order)
    for (size_t i = 0; i + order <= ids.size(); ++i) ++counts[std::u32string(ids.substr(i, order))];
  return counts;
}

}  // namespace

std::vector<std::string> bleu_tokenize(std::string_view line) {
  return tokenize32(text::utf8_decode(line, "BLEU line"));
}

double compute_bleu(const std::vector<std::vector<std::string>>& references,
                    const std::vector<std::vector<std::string>>& translations, int max_order, bool use_bp) {
  TNT_INPUT_CHECK(max_order >= 1, "BLEU max order {}: must be at least 1", max_order);
  std::vector<int64_t> matches(static_cast<size_t>(max_order), 0), possible(static_cast<size_t>(max_order), 0);
  int64_t reference_length = 0, translation_length = 0;
  // zip(): the shorter list decides (callers check the counts).
  size_t n = std::min(references.size(), translations.size());
  for (size_t i = 0; i < n; ++i) {
    reference_length += static_cast<int64_t>(references[i].size());
    translation_length += static_cast<int64_t>(translations[i].size());
    std::unordered_map<std::string_view, char32_t> ids;
    NgramCounts ref = ngrams(token_ids(references[i], ids), max_order);
    NgramCounts hyp = ngrams(token_ids(translations[i], ids), max_order);
    for (const auto& [key, count] : ref) {
      auto it = hyp.find(key);
      if (it != hyp.end()) matches[key.size() - 1] += std::min(count, it->second);
    }
    for (const auto& [key, count] : hyp) possible[key.size() - 1] += count;
  }
  std::vector<double> precisions(static_cast<size_t>(max_order), 0.0);
  double smooth = 1.0;
  for (size_t i = 0; i < precisions.size(); ++i) {
    if (possible[i] > 0) {
      if (matches[i] > 0) {
        precisions[i] = static_cast<double>(matches[i]) / static_cast<double>(possible[i]);
      } else {
        smooth *= 2;
        precisions[i] = 1.0 / (smooth * static_cast<double>(possible[i]));
      }
    }
  }
  double geo_mean = 0.0;
  double max_precision = 0.0;
  for (double p : precisions) max_precision = std::max(max_precision, p);
  if (max_precision > 0) {
    double log_sum = 0.0;
    for (double p : precisions)
      if (p != 0.0) log_sum += std::log(p);
    geo_mean = std::exp(log_sum / max_order);
  }
  double bp = 1.0;
  if (use_bp && reference_length > 0) {
    double ratio = static_cast<double>(translation_length) / static_cast<double>(reference_length);
    if (ratio <= 0.0) {
      bp = 0.0;
    } else if (ratio < 1.0) {
      bp = std::exp(1.0 - 1.0 / ratio);
    }
  }
  return geo_mean * bp;
}

double bleu_on_lines(const std::vector<std::string>& reference_lines, const std::vector<std::string>& translation_lines,
                    bool case_sensitive) {
  TNT_INPUT_CHECK(reference_lines.size() == translation_lines.size(),
                  "BLEU: the reference has {} lines and the translation {} (blank lines at the start and end do "
                  "not count); they must be equal",
                  reference_lines.size(), translation_lines.size());
  std::vector<std::vector<std::string>> refs, hyps;
  refs.reserve(reference_lines.size());
  hyps.reserve(translation_lines.size());
  auto tokens_of = [&](const std::string& line, size_t i, const char* side) {
    std::u32string s = text::utf8_decode(line, fmt::format("BLEU {} line {}", side, i + 1));
    if (!case_sensitive) s = text::python_lower(s);
    return tokenize32(s);
  };
  for (size_t i = 0; i < reference_lines.size(); ++i) {
    refs.push_back(tokens_of(reference_lines[i], i, "reference"));
    hyps.push_back(tokens_of(translation_lines[i], i, "translation"));
  }
  float bleu = static_cast<float>(compute_bleu(refs, hyps));
  return static_cast<double>(bleu) * 100.0;
}

std::vector<std::string> read_bleu_lines(const std::string& path) {
  std::ifstream in = open_text_file(path, "BLEU: text file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) TNT_INPUT_ERROR("BLEU: read error in '{}'", path);
  std::string bytes = buffer.str();
  // Invalid UTF-8 is reported with its line (counted at '\n').
  std::u32string all;
  {
    size_t start = 0;
    int64_t line_no = 1;
    while (start <= bytes.size()) {
      size_t end = bytes.find('\n', start);
      if (end == std::string::npos) end = bytes.size();
      all += text::utf8_decode(std::string_view(bytes).substr(start, end - start),
                               fmt::format("BLEU file '{}' line {}", path, line_no));
      if (end < bytes.size()) all.push_back(U'\n');
      start = end + 1;
      ++line_no;
    }
  }
  std::u32string_view s = text::python_strip(all);
  std::vector<std::string> lines;
  // str.splitlines(): a boundary ends a line; "\r\n" is one boundary; no empty last line.
  auto boundary = [](char32_t c) {
    return c == U'\n' || c == U'\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
  };
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!boundary(s[i])) continue;
    lines.push_back(text::utf8_encode(s.substr(start, i - start)));
    if (s[i] == U'\r' && i + 1 < s.size() && s[i + 1] == U'\n') ++i;
    start = i + 1;
  }
  if (start < s.size()) lines.push_back(text::utf8_encode(s.substr(start)));
  return lines;
}

BleuScores bleu_on_files(const std::string& reference_path, const std::string& translation_path) {
  std::vector<std::string> ref = read_bleu_lines(reference_path);
  std::vector<std::string> hyp = read_bleu_lines(translation_path);
  TNT_INPUT_CHECK(ref.size() == hyp.size(),
                  "BLEU: the reference '{}' has {} lines and the translation '{}' has {} (blank lines at the start "
                  "and end do not count); they must be equal",
                  reference_path, ref.size(), translation_path, hyp.size());
  return {bleu_on_lines(ref, hyp, false), bleu_on_lines(ref, hyp, true)};
}

std::string format_bleu(double score) {
  // Python's repr: the shortest digits that read back as the same double, in fixed notation
  // for decimal exponents -4..15 (with at least one decimal), else d.ddde-XX.
  if (!std::isfinite(score)) return std::isnan(score) ? "nan" : (score > 0 ? "inf" : "-inf");
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, score, std::chars_format::scientific);
  TNT_CHECK(ec == std::errc(), "format_bleu: to_chars failed");
  std::string sci(buf, end);  // e.g. "-1.234e-04"
  std::string sign;
  if (sci[0] == '-') sign = "-", sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp = std::stoi(sci.substr(e + 1));
  if (exp < -4 || exp >= 16) {
    // Appended, not "." + substr: GCC 12 warns (-Wrestrict, a false positive) on that operator+.
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m.append(".").append(digits, 1, std::string::npos);
    return fmt::format("{}{}e{}{:02d}", sign, m, exp < 0 ? '-' : '+', std::abs(exp));
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  auto int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

}  // namespace tnt
