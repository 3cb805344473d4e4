// The subtokenizer's steps on code points, shared by encoding (subtokenizer.cpp) and
// vocabulary building (vocabulary.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tnt::text {

using Alphabet = std::unordered_set<char32_t>;
using SubtokenIds = std::unordered_map<std::u32string, int64_t>;

// Alphanumeric / other runs; a lone " " between two runs (not at the start) is dropped.
std::vector<std::u32string> split_tokens(std::u32string_view text);
std::u32string join(const std::vector<std::u32string>& tokens);
std::u32string escape(std::u32string_view token, const Alphabet& alphabet);
std::u32string unescape(std::u32string_view escaped);
// Greedy longest match, left to right; appends (start, id) of each piece to out. Returns
// false when some position has no subtoken (a character outside the vocabulary). Ids: a
// map from std::u32string or std::u32string_view to the id.
template <class Ids>
bool split_escaped(std::u32string_view token, const Ids& ids, size_t max_length,
                   std::vector<std::pair<size_t, int64_t>>& out) {
  typename Ids::key_type key;
  size_t start = 0;
  while (start < token.size()) {
    bool found = false;
    for (size_t end = std::min(token.size(), start + max_length); end > start; --end) {
      key = token.substr(start, end - start);
      auto it = ids.find(key);
      if (it != ids.end()) {
        out.emplace_back(start, it->second);
        start = end;
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

// The characters the escapes use: always part of an alphabet.
inline constexpr char32_t kEscapeChars[] = U"\\_u;0123456789";

}  // namespace tnt::text
