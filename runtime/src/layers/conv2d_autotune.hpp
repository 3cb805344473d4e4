// Host-side pieces of the CUDA Conv2D's algorithm autotuning (conv2d_cuda.cu), kept apart
// so that CPU-only builds unit-test them: the key under which a timed choice is cached for
// the whole process. (The switch, TNT_CUDNN_AUTOTUNE, is the Config knob cudnn_autotune.)
#pragma once

#include "tarantella/check.hpp"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

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

// Channel padding (conv2d_cuda.cu). cuDNN's fastest kernels for a network's first
// convolution want 4 or 8 input channels (NVIDIA's performance guide: pad 3-channel images
// to 4 with stride 2; cuDNN has first-layer kernels for 4), so a channels_last Conv2D whose
// input has 1-3 channels may widen it with zero channels, and its filter likewise: the same
// results, exactly, as every product with a zero channel is zero.
//
// The channel counts to try for an input of c channels: {c} alone means no padding. The
// knob is TNT_CONV_PAD_CHANNELS (auto, 0, 4 or 8; Config checks it): auto tries c, 4 and 8
// when autotuning is on (the choice is timed) and keeps c when it is off.
inline std::vector<int64_t> pad_candidates(int64_t c, const std::string& knob, bool autotune, bool channels_last) {
  if (!channels_last || c >= 4 || knob == "0") return {c};
  if (knob == "4") return {4};
  if (knob == "8") return {8};
  TNT_CHECK(knob == "auto", "TNT_CONV_PAD_CHANNELS='{}' is not auto, 0, 4 or 8", knob);
  return autotune ? std::vector<int64_t>{c, 4, 8} : std::vector<int64_t>{c};
}

// A padded candidate must beat the unpadded one (candidates[0]) by this share of its time:
// padding costs what the timing leaves out (a copy of images that already are channels_last,
// a saved input and filter up to 8/c times larger), and timings of a few milliseconds vary
// by about a percent from run to run.
inline constexpr double kPadMinGain = 0.02;

// The channel count to run with, from each candidate's timed milliseconds (forward plus the
// backward directions the step runs). A time below zero means "not timed" (cuDNN's
// heuristics chose): then no padding, as nothing says it is faster.
inline int64_t choose_padding(const std::vector<int64_t>& candidates, const std::vector<double>& ms) {
  TNT_CHECK(!candidates.empty() && candidates.size() == ms.size(), "choose_padding: {} candidates, {} times",
            candidates.size(), ms.size());
  if (candidates.size() == 1) return candidates[0];
  for (double t : ms)
    if (t < 0) return candidates[0];
  size_t best = 0;
  for (size_t i = 1; i < ms.size(); ++i) {
    if (ms[i] < ms[best]) best = i;
  }
  if (best != 0 && ms[best] > ms[0] * (1.0 - kPadMinGain)) best = 0;
  return candidates[best];
}

// cuDNN graph candidates (conv2d_algorithms_cuda.cu). A candidate's output is checked
// against the chosen algorithm's on the same operands: largest difference within 2^-5 of
// the largest value (algorithms differ by the rounding of f32 sums to the half output,
// about 2^-8 of a value; a graph given wrong strides or layouts is off by the values
// themselves). diff and largest come from the check kernel, non-finite values as +inf.
// The check can tell a wrong graph from a right one only against a finite reference that
// is not all zero: a NaN or infinity in the reference makes largest +inf, under which any
// difference passes, and an all-zero reference (zero operands) is what a wrong layout
// gives too. Such a reference decides nothing, so the candidate is not taken: the
// algorithm stays, which is always right.
inline constexpr float kGraphTolerance = 1.0f / 32;
inline bool graph_reference_judges(float largest) {
  return largest > 0.0f && largest <= std::numeric_limits<float>::max();
}
inline bool graph_output_agrees(float diff, float largest) {
  return graph_reference_judges(largest) && diff <= kGraphTolerance * largest;
}

// The graph tensors tell cuDNN that their pointers are aligned to this many bytes
// (conv2d_graph_cuda.cpp), and engines may issue vector accesses of that width: a graph
// runs only on operands that are (the allocator's blocks are; a Tensor view at a byte
// offset, slice_rows, may not be), else the legacy algorithm runs, which takes any
// element-aligned pointer. A null pointer (no workspace) is aligned.
inline constexpr std::uintptr_t kGraphAlignment = 16;
inline bool graph_aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<std::uintptr_t>(p) % kGraphAlignment != 0) return false;
  return true;
}

}  // namespace tnt::conv_autotune
