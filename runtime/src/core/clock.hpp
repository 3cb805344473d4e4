// The one clock of the runtime's timings (steps, epochs, callbacks): steady, in seconds.
#pragma once

#include <chrono>

namespace tnt::detail {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace tnt::detail
