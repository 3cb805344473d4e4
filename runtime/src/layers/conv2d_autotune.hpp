// Host-side pieces of the CUDA Conv2D's algorithm autotuning (conv2d_cuda.cu), kept apart
// so that CPU-only builds unit-test them: the key under which a timed choice is cached for
// the whole process. (The switch, TNT_CUDNN_AUTOTUNE, is the Config knob cudnn_autotune.)
#pragma once

#include "tarantella/check.hpp"

#include <array>
#include <cstdint>
#include <string>

namespace tnt::conv_autotune {

enum class Direction : int64_t { forward = 0, backward_data = 1, backward_filter = 2 };

// Everything that defines one timed problem: the device, the input shape, the filter, the
// geometry, the data type, the memory format (tensors and filter), the math type allowed,
// whether only deterministic algorithms qualify, and the direction. Two layers with equal
// problems (ResNet-50 repeats its bottleneck shapes) share one timing.
struct Problem {
  int64_t device = 0;
  int64_t n = 0, c = 0, h = 0, w = 0;  // input (N, C, H, W)
  int64_t filters = 0, kernel = 0, stride = 1, padding = 0;
  int64_t dtype = 0;   // tnt::DType of x, y and the filter
  int64_t format = 0;  // tnt::MemoryFormat of x, y and the filter
  int64_t math = 0;    // cudnnMathType_t the descriptor allows
  bool deterministic = false;
  Direction direction = Direction::forward;

  using Key = std::array<int64_t, 14>;
  Key key() const {
    return {device, n, c, h, w, filters, kernel, stride, padding, dtype, format, math, deterministic ? 1 : 0,
            static_cast<int64_t>(direction)};
  }
  std::string str() const {
    static const char* const directions[] = {"forward", "backward-data", "backward-filter"};
    return fmt::format(
        "{} on device {}: x ({}, {}, {}, {}) * {} filters {}x{} stride {} padding {}, dtype {}, format {}, math {}{}",
        directions[static_cast<int>(direction)], device, n, c, h, w, filters, kernel, kernel, stride, padding, dtype,
        format, math, deterministic ? ", deterministic" : "");
  }
};

}  // namespace tnt::conv_autotune
