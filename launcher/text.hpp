// Small string helpers shared by the parsers. Numbers are parsed strictly (no sign, no
// spaces, no trailing garbage) because "4x" in a hostfile is a typo to report, not 4.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <vector>

namespace tnt::launcher {

inline std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n\f\v";
  auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

inline std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    auto pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

// Unsigned decimal digits only; nullopt on anything else or overflow.
inline std::optional<std::uint64_t> parse_unsigned(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// A count of ranks or slots: 1 .. 1'000'000 (a bound that catches pasted garbage long
// before it becomes an allocation).
inline std::optional<int> parse_count(std::string_view s) {
  auto v = parse_unsigned(s);
  if (!v || *v == 0 || *v > 1'000'000) return std::nullopt;
  return static_cast<int>(*v);
}

// Seconds as a user writes them: a non-negative decimal number ("2", "0.5"), at most a year.
inline std::optional<double> parse_seconds(std::string_view s) {
  double v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || ptr != end || !std::isfinite(v) || v < 0 || v > 366.0 * 86400) {
    return std::nullopt;
  }
  return v;
}

inline bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// A piece of a user's file or argument as a message quotes it: at most `max` bytes, bytes
// outside printable ASCII as \xNN, "..." when cut. A binary file given as a hostfile must
// not write its bytes to the user's terminal, nor a megabyte line into one message.
inline std::string excerpt(std::string_view s, size_t max = 40) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += {'\\', 'x', hex[c >> 4], hex[c & 0xf]};
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

// What a file that is not a regular one is, for a message refusing it: "a directory".
inline const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

}  // namespace tnt::launcher
