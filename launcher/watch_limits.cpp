#include "watch_limits.hpp"

#include <fmt/format.h>

namespace tnt::launcher {

std::string format_seconds(Seconds s) { return fmt::format("{:g}", s.count()); }

}  // namespace tnt::launcher
