// GELU and its derivative, written once for the CPU loop and the CUDA kernel (float).
//   tanh form: y = x/2 (1 + tanh(u)), u = c (x + a x^3), c = sqrt(2/pi), a = 0.044715
//              y' = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) c (1 + 3 a x^2)
//   exact:     y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2))/2;  y' = Phi(x) + x phi(x)
#pragma once

#include "core/host_device.hpp"

#include <cmath>

namespace tnt::gelu {

constexpr float kC = 0.7978845608028654f;   // sqrt(2 / pi)
constexpr float kA = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)

TNT_HD float value(float x, bool approximate) {
  if (approximate) return 0.5f * x * (1.0f + tanhf(kC * (x + kA * x * x * x)));
  return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}

TNT_HD float derivative(float x, bool approximate) {
  if (approximate) {
    const float t = tanhf(kC * (x + kA * x * x * x));
    // Where tanh has saturated its slope is 0: the second term is then 0 (for |x| above about
    // 1.9e19, x^2 overflows and 0 * inf would make it NaN; below, the same bits as before).
    const float sech2 = 1.0f - t * t;
    if (sech2 == 0.0f) return 0.5f * (1.0f + t);
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kC * (1.0f + 3.0f * kA * x * x);
  }
  return 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}

}  // namespace tnt::gelu
