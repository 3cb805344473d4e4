// The element-wise losses' rules, each written once: the CPU loop (losses.cpp) and the CUDA
// kernel (losses_cuda.cu) call the same function per element, compiled for host and device
// like the optimizers' update rules. A rule gives the element's loss f(p, t) in double (it
// is summed in double) and its slope df/dp in float (the gradient is stored in f32).
// Sample weights are applied by weighted(): a weight of 0 gives exactly 0, even for an
// infinite loss, so such a sample is out of the sum as if it were not there.
#pragma once

#include "core/host_device.hpp"

#include <cmath>
#include <cstdint>

namespace tnt::losses {

enum class Pointwise : int32_t {
  squared,   // MeanSquaredError:   f = d^2,                     f' = 2d          (d = p - t)
  absolute,  // MeanAbsoluteError:  f = |d|,                     f' = sign(d), 0 at 0
  huber,     // Huber:              f = d^2/2 (|d| <= delta),    f' = d
             //                       delta (|d| - delta/2),     f' = delta sign(d)
  logistic,  // BinaryCrossEntropy on a logit p = x with target t in [0, 1]:
             //   f = max(x, 0) - x t + log1p(exp(-|x|)), f' = sigmoid(x) - t
};

struct PointwiseTerm {
  double value = 0;  // f(p, t)
  float slope = 0;   // df/dp
};

TNT_HD float sign_of(float d) { return d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f); }

// sigmoid(x) without overflow: exp of a non-positive number only.
TNT_HD double stable_sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  const double e = exp(x);
  return e / (1.0 + e);
}

struct PointwiseRule {
  Pointwise kind = Pointwise::squared;
  double delta = 1.0;  // huber only

  TNT_HD PointwiseTerm operator()(float p, float t) const {
    PointwiseTerm r;
    if (kind == Pointwise::logistic) {
      const double x = p;
      // log(1 + exp(-|x|)) <= log 2, and max(x, 0) - x t is exact enough: finite for every x.
      r.value = (x > 0 ? x : 0.0) - x * static_cast<double>(t) + log1p(exp(-fabs(x)));
      r.slope = static_cast<float>(stable_sigmoid(x) - static_cast<double>(t));
      return r;
    }
    const float d = p - t;
    const double a = fabs(static_cast<double>(d));
    switch (kind) {
      case Pointwise::squared:
        r.value = static_cast<double>(d) * d;
        r.slope = 2.0f * d;
        break;
      case Pointwise::absolute:
        r.value = a;
        r.slope = sign_of(d);
        break;
      default:  // huber: the quadratic piece up to and including |d| = delta
        if (a <= delta) {
          r.value = 0.5 * a * a;
          r.slope = d;
        } else {
          r.value = delta * (a - 0.5 * delta);
          r.slope = static_cast<float>(delta) * sign_of(d);
        }
        break;
    }
    return r;
  }
};

// A BinaryCrossEntropy target must lie in [0, 1]; NaN fails too.
TNT_HD bool valid_probability(float t) { return t >= 0.0f && t <= 1.0f; }

TNT_HD double weighted(double value, float w) { return w == 0.0f ? 0.0 : static_cast<double>(w) * value; }
TNT_HD float weighted(float value, float w) { return w == 0.0f ? 0.0f : w * value; }

}  // namespace tnt::losses
