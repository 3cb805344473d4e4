// Subtokenizer: vocabulary files, encode and decode (the algorithm is described in
// tarantella/text/subtokenizer.hpp). Text is handled as code points, because the reference counts
// lengths (the longest subtoken, escapes) in characters, not bytes.
#include "tarantella/text/subtokenizer.hpp"
#include "tarantella/files.hpp"

#include "subtoken_algo.hpp"
#include "unicode.hpp"
#include "tarantella/check.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace tnt {
namespace text {

std::vector<std::u32string> split_tokens(std::u32string_view text) {
  std::vector<std::u32string> out;
  if (text.empty()) return out;
  size_t start = 0;
  bool prev = is_alnum(text[0]);
  for (size_t pos = 1; pos < text.size(); ++pos) {
    bool cur = is_alnum(text[pos]);
    if (cur != prev) {
      std::u32string_view token = text.substr(start, pos - start);
      if (token != U" " || start == 0) out.emplace_back(token);
      start = pos;
    }
    prev = cur;
  }
  out.emplace_back(text.substr(start));
  return out;
}

std::u32string join(const std::vector<std::u32string>& tokens) {
  std::u32string out;
  bool prev_alnum = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    // Tokens from decoding are never empty; an empty one counts as not alphanumeric.
    bool alnum = !tokens[i].empty() && is_alnum(tokens[i][0]);
    if (i > 0 && prev_alnum && alnum) out.push_back(U' ');
    out += tokens[i];
    prev_alnum = alnum;
  }
  return out;
}

std::u32string escape(std::u32string_view token, const Alphabet& alphabet) {
  std::u32string out;
  out.reserve(token.size() + 1);
  auto put = [&](char32_t c) {
    if (c != U'\n' && alphabet.count(c)) {
      out.push_back(c);
    } else {
      out.push_back(U'\\');
      for (char d : std::to_string(static_cast<uint32_t>(c))) out.push_back(static_cast<char32_t>(d));
      out.push_back(U';');
    }
  };
  for (char32_t c : token) {
    // '\' and '_' first become two characters each, which are then escaped in turn.
    if (c == U'\\') {
      put(U'\\'), put(U'\\');
    } else if (c == U'_') {
      put(U'\\'), put(U'u');
    } else {
      put(c);
    }
  }
  out.push_back(U'_');
  return out;
}

std::u32string unescape(std::u32string_view s) {
  // Left to right, the first of "\u", "\\", "\<digits>;" that matches at a backslash.
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] == U'\\' && i + 1 < s.size()) {
      char32_t n = s[i + 1];
      if (n == U'u') {
        out.push_back(U'_');
        i += 2;
        continue;
      }
      if (n == U'\\') {
        out.push_back(U'\\');
        i += 2;
        continue;
      }
      size_t j = i + 1;
      while (j < s.size() && s[j] >= U'0' && s[j] <= U'9') ++j;
      if (j > i + 1 && j < s.size() && s[j] == U';') {
        // Python's chr() takes 0..0x10FFFF; larger numbers give U+3013. A surrogate, which
        // chr() accepts but UTF-8 cannot hold, gives U+3013 too.
        uint64_t v = 0;
        bool too_big = false;
        for (size_t k = i + 1; k < j; ++k) {
          v = v * 10 + (s[k] - U'0');
          if (v > 0x10FFFF) too_big = true, v = 0x110000;
        }
        bool valid = !too_big && !(v >= 0xD800 && v <= 0xDFFF);
        out.push_back(valid ? static_cast<char32_t>(v) : char32_t{0x3013});
        i = j + 1;
        continue;
      }
    }
    out.push_back(s[i]);
    ++i;
  }
  return out;
}

}  // namespace text

Subtokenizer::Subtokenizer(const std::vector<std::string>& subtokens) {
  const std::string reserved[2] = {kPadToken, kEosToken};
  subtokens_.assign(std::begin(reserved), std::end(reserved));
  for (const auto& s : subtokens) {
    if (s == reserved[0] || s == reserved[1]) continue;
    subtokens_.push_back(s);
  }
  subtokens32_.reserve(subtokens_.size());
  for (size_t i = 0; i < subtokens_.size(); ++i) {
    const std::string& s = subtokens_[i];
    TNT_INPUT_CHECK(!s.empty(), "vocabulary: subtoken {} is empty", i);
    std::u32string s32 = text::utf8_decode(s, fmt::format("vocabulary: subtoken {}", i));
    auto [it, inserted] = ids_.emplace(s32, static_cast<int64_t>(i));
    TNT_INPUT_CHECK(inserted, "vocabulary: subtoken {} '{}' repeats subtoken {}", i, s, it->second);
    max_subtoken_length_ = std::max(max_subtoken_length_, s32.size());
    for (char32_t c : s32) alphabet_.insert(c);
    subtokens32_.push_back(std::move(s32));
  }
  for (char32_t c : std::u32string_view(U"\\_u;0123456789")) alphabet_.insert(c);
}

Subtokenizer Subtokenizer::from_file(const std::string& path) {
  std::ifstream in = open_text_file(path, "vocabulary file");
  std::vector<std::string> subtokens;
  std::string line;
  int64_t line_no = 0;
  std::vector<int64_t> line_of;  // file line of each subtoken, for error messages
  while (std::getline(in, line)) {
    ++line_no;
    std::string where = fmt::format("vocabulary file '{}' line {}", path, line_no);
    // The reference strips whitespace around the line, then drops the first and last
    // character (the quotes).
    std::u32string s32 = text::utf8_decode(line, where);
    std::u32string_view stripped = text::python_strip(s32);
    if (stripped.size() < 3 || stripped.front() != U'\'' || stripped.back() != U'\'')
      TNT_INPUT_ERROR("{}: expected a subtoken in single quotes, e.g. 'the_', found \"{}\"", where, line);
    subtokens.push_back(text::utf8_encode(stripped.substr(1, stripped.size() - 2)));
    line_of.push_back(line_no);
  }
  if (in.bad()) TNT_INPUT_ERROR("vocabulary file '{}': read error after line {}", path, line_no);
  TNT_INPUT_CHECK(!subtokens.empty(), "vocabulary file '{}': no subtokens in it", path);
  // Duplicates are found here to name both lines.
  std::unordered_map<std::string, int64_t> seen;
  for (size_t i = 0; i < subtokens.size(); ++i) {
    auto [it, inserted] = seen.emplace(subtokens[i], line_of[i]);
    if (!inserted)
      TNT_INPUT_ERROR("vocabulary file '{}' line {}: subtoken '{}' is already on line {}", path, line_of[i],
                      subtokens[i], it->second);
  }
  return Subtokenizer(subtokens);
}

const std::string& Subtokenizer::subtoken(int64_t id) const {
  TNT_INPUT_CHECK(id >= 0 && id < vocab_size(), "subtoken id {} is outside the vocabulary [0, {})", id, vocab_size());
  return subtokens_[static_cast<size_t>(id)];
}

std::vector<int64_t> Subtokenizer::encode(std::string_view raw, bool add_eos) const {
  std::u32string text32 = text::utf8_decode(raw, "text to encode");
  std::vector<int64_t> ids;
  std::vector<std::pair<size_t, int64_t>> pieces;
  for (const auto& token : text::split_tokens(text32)) {
    std::u32string escaped = text::escape(token, alphabet_);
    pieces.clear();
    if (!text::split_escaped(escaped, ids_, max_subtoken_length_, pieces))
      TNT_INPUT_ERROR("cannot encode the token \"{}\" with this vocabulary: it lacks a character of \"{}\" "
                      "(a vocabulary needs every escape character \\ u ; 0-9 as a subtoken of its own)",
                      text::utf8_encode(token), text::utf8_encode(escaped));
    for (const auto& p : pieces) ids.push_back(p.second);
  }
  if (add_eos) ids.push_back(kEosId);
  return ids;
}

std::string Subtokenizer::decode(const std::vector<int64_t>& ids) const {
  std::u32string all;
  for (int64_t id : ids) {
    TNT_INPUT_CHECK(id >= 0, "cannot decode the negative subtoken id {}", id);
    if (id < vocab_size()) all += subtokens32_[static_cast<size_t>(id)];
  }
  std::vector<std::u32string> tokens;
  size_t start = 0;
  for (size_t i = 0; i <= all.size(); ++i) {
    if (i == all.size() || all[i] == U'_') {
      if (i > start) tokens.push_back(text::unescape(std::u32string_view(all).substr(start, i - start)));
      start = i + 1;
    }
  }
  return text::utf8_encode(text::join(tokens));
}

void Subtokenizer::save(const std::string& path) const {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) TNT_INPUT_ERROR("vocabulary file '{}': cannot write: {}", tmp, std::strerror(errno));
    for (const auto& s : subtokens_) out << '\'' << s << "'\n";
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      TNT_INPUT_ERROR("vocabulary file '{}': write error", tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    TNT_INPUT_ERROR("vocabulary file '{}': cannot move it into place: {}", path, ec.message());
  }
}

std::vector<int64_t> trim_at_eos(const std::vector<int64_t>& ids) {
  std::vector<int64_t> out;
  for (int64_t id : ids) {
    if (id == kEosId) break;
    out.push_back(id);
  }
  return out;
}

std::string strip_whitespace(std::string_view s) {
  std::u32string s32 = text::utf8_decode(s, "text");
  return text::utf8_encode(text::python_strip(s32));
}

std::vector<std::string> split_to_tokens(std::string_view s) {
  std::vector<std::string> out;
  for (const auto& t : text::split_tokens(text::utf8_decode(s, "text"))) out.push_back(text::utf8_encode(t));
  return out;
}

std::string join_tokens(const std::vector<std::string>& tokens) {
  std::vector<std::u32string> t32;
  for (const auto& t : tokens) t32.push_back(text::utf8_decode(t, "token"));
  return text::utf8_encode(text::join(t32));
}

std::string escape_token(std::string_view token, std::string_view alphabet) {
  text::Alphabet a;
  for (char32_t c : text::utf8_decode(alphabet, "alphabet")) a.insert(c);
  return text::utf8_encode(text::escape(text::utf8_decode(token, "token"), a));
}

std::string unescape_token(std::string_view escaped) {
  return text::utf8_encode(text::unescape(text::utf8_decode(escaped, "escaped token")));
}

}  // namespace tnt
