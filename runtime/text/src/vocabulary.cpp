// Building a subtoken vocabulary from raw text, step for step as TensorFlow's official
// Transformer does (its tokenizer's init_from_files), so that the same text gives the same
// vocabulary:
//
//   alphabet   every character of the counted tokens, of the reserved tokens, and the
//              escape characters \ _ u ; 0-9
//   one round  split every escaped token with the current subtokens (greedy longest match);
//              from each subtoken boundary, count every substring up to the token's end
//              (weighted by the token's count); keep the substrings counted >= min_count,
//              longest first, each one discounting its count from its own prefixes (so a
//              prefix that is mostly part of a longer kept subtoken falls behind); add the
//              single characters; order by (count, subtoken) descending; reserved first.
//   4 rounds   starting from the alphabet alone.
//   min_count  given, or found by bisection in [1, 1000]: the list closest to the target
//              size, stopping early once within the threshold.
#include "subtoken_algo.hpp"
#include "unicode.hpp"
#include "tarantella/check.hpp"
#include "tarantella/files.hpp"
#include "tarantella/text/subtokenizer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace tnt {
namespace {

// Substring counts keyed by views into the escaped tokens (Builder::escaped, which outlives
// every round), so that counting does not allocate a string per substring.
using Counts = std::unordered_map<std::u32string_view, int64_t>;
using TokenCounts = std::unordered_map<std::u32string, int64_t>;

struct Builder {
  std::vector<std::pair<std::u32string, int64_t>> escaped;  // (escaped token, count)
  text::Alphabet alphabet;
  std::vector<std::u32string> reserved;
  int iterations = 4;
  std::vector<std::string>* log = nullptr;

  // One round's new list from the substring counts.
  std::vector<std::u32string> new_list(Counts& counts, int64_t min_count, size_t* max_length) const {
    std::vector<std::vector<std::u32string_view>> buckets;  // by length
    for (const auto& [s, c] : counts) {
      if (c < min_count) continue;
      if (buckets.size() <= s.size()) buckets.resize(s.size() + 1);
      buckets[s.size()].push_back(s);
    }
    // The reference takes len(buckets) - 1, which is -1 when nothing is kept and then fails
    // to split anything; single characters always split, so 1 is the floor here.
    *max_length = buckets.empty() ? 1 : std::max<size_t>(1, buckets.size() - 1);
    std::vector<std::pair<int64_t, std::u32string>> candidates;
    // Prefixes are shorter, so the order within one length does not matter.
    for (size_t len = buckets.size(); len-- > 1;) {
      for (std::u32string_view s : buckets[len]) {
        int64_t count = counts[s];
        if (count < min_count) continue;  // its longer extensions took its count
        bool single = len == 1 && alphabet.count(s[0]);
        bool is_reserved = std::find(reserved.begin(), reserved.end(), s) != reserved.end();
        if (!single && !is_reserved) candidates.emplace_back(count, std::u32string(s));
        for (size_t end = 1; end < len; ++end) counts[s.substr(0, end)] -= count;
      }
    }
    for (char32_t a : alphabet) {
      std::u32string one(1, a);
      auto it = counts.find(one);
      candidates.emplace_back(it == counts.end() ? 0 : it->second, std::move(one));
    }
    std::sort(candidates.begin(), candidates.end(), [](const auto& x, const auto& y) {
      return x.first != y.first ? x.first > y.first : x.second > y.second;
    });
    std::vector<std::u32string> list = reserved;
    for (auto& c : candidates) list.push_back(std::move(c.second));
    return list;
  }

  std::vector<std::u32string> generate(int64_t min_count) const {
    std::vector<std::u32string> list = reserved;
    for (char32_t a : alphabet) list.emplace_back(1, a);
    size_t max_length = 1;
    std::vector<std::pair<size_t, int64_t>> pieces;
    for (int round = 0; round < iterations; ++round) {
      std::unordered_map<std::u32string_view, int64_t> ids;  // views into list
      for (size_t i = 0; i < list.size(); ++i) ids.emplace(list[i], static_cast<int64_t>(i));
      Counts counts;
      for (const auto& [token, count] : escaped) {
        pieces.clear();
        bool ok = text::split_escaped(token, ids, max_length, pieces);
        TNT_CHECK(ok, "vocabulary building: a token does not split into the alphabet");
        for (const auto& piece : pieces) {
          size_t start = piece.first;
          std::u32string_view view(token);
          for (size_t end = start + 1; end <= token.size(); ++end) counts[view.substr(start, end - start)] += count;
        }
      }
      list = new_list(counts, min_count, &max_length);
    }
    return list;
  }

  std::vector<std::u32string> bisect(int64_t lo, int64_t hi, int64_t target, int64_t threshold) const {
    int64_t cur = (lo + hi) / 2;
    std::vector<std::u32string> list = generate(cur);
    int64_t size = static_cast<int64_t>(list.size());
    if (log) log->push_back(fmt::format("min_count={} (search in [{}, {}]): {} subtokens", cur, lo, hi, size));
    if (std::abs(size - target) < threshold || lo >= hi || cur < 2) return list;
    std::vector<std::u32string> other = size > target ? bisect(cur + 1, hi, target, threshold)
                                                      : bisect(lo, cur - 1, target, threshold);
    int64_t other_size = static_cast<int64_t>(other.size());
    return std::abs(other_size - target) < std::abs(size - target) ? other : list;
  }
};

}  // namespace

std::unordered_map<std::string, int64_t> count_tokens(const std::vector<std::string>& files, double file_byte_limit) {
  TNT_INPUT_CHECK(file_byte_limit > 0, "file byte limit {}: must be positive", file_byte_limit);
  TokenCounts counts;
  for (const auto& path : files) {
    const uint64_t size = check_regular_file(path, "text file");
    std::ifstream in = open_text_file(path, "text file");
    double budget = file_byte_limit;
    auto lines_to_skip = static_cast<int64_t>(static_cast<double>(size) / (budget * 2));
    int64_t counter = 0;
    int64_t line_no = 0;
    std::string line;
    while (std::getline(in, line)) {
      ++line_no;
      if (counter < lines_to_skip) {
        ++counter;
        continue;
      }
      if (budget < 0) break;
      std::u32string s32 = text::utf8_decode(line, fmt::format("text file '{}' line {}", path, line_no));
      std::u32string_view stripped = text::python_strip(s32);
      budget -= static_cast<double>(stripped.size());
      counter = 0;
      for (auto& token : text::split_tokens(stripped)) ++counts[std::move(token)];
    }
    if (in.bad()) TNT_INPUT_ERROR("text file '{}': read error after line {}", path, line_no);
  }
  std::unordered_map<std::string, int64_t> out;
  out.reserve(counts.size());
  for (const auto& [t, c] : counts) out.emplace(text::utf8_encode(t), c);
  return out;
}

std::vector<std::string> build_vocabulary(const std::unordered_map<std::string, int64_t>& token_counts,
                                          const VocabularyOptions& options, std::vector<std::string>* log) {
  TNT_INPUT_CHECK(options.min_count >= 0, "vocabulary min_count {}: must be >= 0 (0 searches for it)",
                  options.min_count);
  TNT_INPUT_CHECK(options.min_count > 0 || options.target_size > 2,
                  "vocabulary target size {}: must be larger than the 2 reserved tokens", options.target_size);
  TNT_INPUT_CHECK(options.threshold > 0, "vocabulary threshold {}: must be positive", options.threshold);
  TNT_INPUT_CHECK(options.iterations > 0, "vocabulary iterations {}: must be positive", options.iterations);
  TNT_INPUT_CHECK(!token_counts.empty(), "vocabulary: no text to build it from");
  Builder b;
  b.iterations = options.iterations;
  b.log = log;
  b.reserved = {U"<pad>", U"<EOS>"};
  std::vector<std::pair<std::u32string, int64_t>> tokens;
  for (const auto& [t, c] : token_counts) {
    std::u32string t32 = text::utf8_decode(t, "vocabulary token");
    for (char32_t ch : t32) b.alphabet.insert(ch);
    tokens.emplace_back(std::move(t32), c);
  }
  for (const auto& r : b.reserved)
    for (char32_t ch : r) b.alphabet.insert(ch);
  for (char32_t ch : std::u32string_view(U"\\_u;0123456789")) b.alphabet.insert(ch);
  // The alphabet is fixed from here on, so every token is escaped once.
  for (auto& [t, c] : tokens) b.escaped.emplace_back(text::escape(t, b.alphabet), c);

  std::vector<std::u32string> list;
  if (options.min_count > 0) {
    list = b.generate(options.min_count);
    if (log) log->push_back(fmt::format("min_count={}: {} subtokens", options.min_count, list.size()));
  } else {
    list = b.bisect(1, 1000, options.target_size, options.threshold);
  }
  std::vector<std::string> out;
  out.reserve(list.size());
  for (const auto& s : list) out.push_back(text::utf8_encode(s));
  return out;
}

}  // namespace tnt
