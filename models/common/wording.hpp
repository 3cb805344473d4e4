// Counted nouns in the programs' messages: "1 epoch", "2 epochs", never "1 epochs".
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace tnt_models {

// "N thing" for N == 1, else "N things" (or "N <plural>" when the plural is not thing + s).
inline std::string count_of(int64_t n, std::string_view singular, std::string_view plural = {}) {
  if (n == 1) return fmt::format("{} {}", n, singular);
  if (plural.empty()) return fmt::format("{} {}s", n, singular);
  return fmt::format("{} {}", n, plural);
}

}  // namespace tnt_models
