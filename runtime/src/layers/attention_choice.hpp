// The rules of TNT_CUDNN_ATTENTION=auto (the trial is attention_trial_cuda.cpp): at the first
// use of a shape, cuDNN's flash attention and the engine that would run otherwise (fused, or
// unfused) run on the same test operands; cuDNN takes the shape only where its results agree
// and it is faster. Pure: tested on the CPU (tests/layers/test_attention_choice.cpp).
//
// The checks, each able to fail on the mistakes a graph can hide:
// - without dropout, cuDNN's o, dq, dk and dv against the other engine's: largest difference
//   within 2^-4 of the other's largest value. The engines round probabilities, dS and outputs
//   to the half format, each a relative error of one unit (2^-8 in bf16) of a term, and the
//   GPU tests hold each within 8 units (2^-5) of the largest value of f32 results, so two of
//   them within 2^-4 of each other; a wrong scale, mask, padding bias or transpose moves
//   outputs by a sizeable fraction of their scale (a doubled scale: about their largest value).
// - with dropout (rate r), cuDNN's forward o and backward from dO = o: whatever the mask,
//   dV = P_d^T dO, so <V, dV> = <P_d V, o> = <o, o> when the backward drops the same
//   probabilities and scales them as the forward did (rounding moves the two sums by far less
//   than 2^-4); a backward with another mask, or without the 1/(1 - r), misses it by about
//   the dropped share or more.
// - with dropout, the mean: E[o] over masks is the undropped o, so <o, o_0> / <o_0, o_0> is 1
//   but for noise (o_0: the other engine's undropped output). Each row's noise is at most about
//   sqrt(r / (1 - r)) of its value, so over R = B * H * Tq rows the ratio's noise is about
//   sqrt(r / (1 - r) / R): for R >= 2^12 and r <= 0.5 at most 1/64, and the tolerance of 2^-4
//   is four times that. Keeping with probability r instead of 1 - r, or not scaling the kept
//   probabilities, moves the ratio by r or more (0.1 at the Transformer's rate). Smaller
//   cases, or r > 0.5, skip this check and the next.
// - with dropout, the noise: for V of independent zero-mean values (the trial's), the
//   expected |o - o_0|^2 / |o_0|^2 is r / (1 - r) whatever the probabilities (each row's
//   dropped part has variance r / (1 - r) * sum_j p_j^2 v_j^2 against the row's
//   (sum_j p_j v_j)^2, both sum_j p_j^2 times the values' variance on average). It must be
//   within a factor 2 of that: a dropout that drops nothing (0), or one that keeps with
//   probability r (the mean check catches it too), is far outside.
// Then both engines' forward + backward are timed (with the real dropout rate); cuDNN must be
// kMinGain faster, as a padded convolution or a cuDNN convolution graph must.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace tnt::attention_choice {

inline constexpr double kTolerance = 1.0 / 16;
inline constexpr double kMeanTolerance = 1.0 / 16;
inline constexpr int64_t kMeanMinRows = 4096;
inline constexpr double kMeanMaxRate = 0.5;
inline constexpr double kMinGain = 0.02;
inline constexpr int kTimedRuns = 3;
inline constexpr int kTimedRounds = 2;  // engines alternate; each keeps its best round

inline bool finite(double x) { return std::isfinite(x); }

// One output against the other engine's: {max |cudnn - other|, max |other|}. An all-zero or
// non-finite reference cannot tell a right graph from a wrong one: it fails too.
inline bool agrees(double diff, double largest) {
  return finite(diff) && finite(largest) && largest > 0 && diff <= kTolerance * largest;
}

// <o, o> and <V, dV> of cuDNN's dropout forward and its backward from dO = o.
inline bool dropout_backward_consistent(double o_dot_o, double v_dot_dv) {
  return finite(o_dot_o) && finite(v_dot_dv) && o_dot_o > 0 &&
         std::fabs(o_dot_o - v_dot_dv) <= kTolerance * o_dot_o;
}

inline bool dropout_mean_checkable(int64_t rows, double rate) { return rows >= kMeanMinRows && rate <= kMeanMaxRate; }

// <o, o_0> and <o_0, o_0>: o with dropout, o_0 the other engine's without.
inline bool dropout_mean_agrees(double o_dot_o0, double o0_dot_o0) {
  return finite(o_dot_o0) && finite(o0_dot_o0) && o0_dot_o0 > 0 &&
         std::fabs(o_dot_o0 / o0_dot_o0 - 1.0) <= kMeanTolerance;
}

// |o - o_0|^2 / |o_0|^2 = (<o, o> - 2 <o, o_0> + <o_0, o_0>) / <o_0, o_0> against its
// expectation r / (1 - r) (see the top; checked where dropout_mean_checkable).
inline double dropout_noise(double o_dot_o, double o_dot_o0, double o0_dot_o0) {
  return (o_dot_o - 2.0 * o_dot_o0 + o0_dot_o0) / o0_dot_o0;
}
inline bool dropout_noise_agrees(double noise, double rate) {
  if (!(rate > 0.0 && rate < 1.0) || !finite(noise)) return false;
  const double expected = rate / (1.0 - rate);
  return noise >= 0.5 * expected && noise <= 2.0 * expected;
}

// Forward + backward milliseconds of each engine (both measured): cuDNN runs where it is
// kMinGain faster.
inline bool prefer_cudnn(double cudnn_ms, double other_ms) {
  return finite(cudnn_ms) && finite(other_ms) && cudnn_ms > 0 && other_ms > 0 &&
         cudnn_ms <= other_ms * (1.0 - kMinGain);
}

}  // namespace tnt::attention_choice
