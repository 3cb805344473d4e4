// Sigmoid, Tanh and LeakyReLU and their derivatives, written once for the CPU loops
// (activation.cpp) and the CUDA kernels (activation_cuda.cu), in float. The NaN and infinity
// rules are those of tarantella/layers/activation.hpp; they follow from these lines.
#pragma once

#include "core/host_device.hpp"

#include <cmath>

namespace tnt::act {

// exp of a non-positive argument only: no overflow in either tail. A NaN fails x >= 0 and
// gives exp(NaN) = NaN.
TNT_HD float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

// From the output y = sigmoid(x): exactly 0 where y saturated to 0 or 1.
TNT_HD float sigmoid_derivative(float y) { return y * (1.0f - y); }

TNT_HD float tanh_value(float x) { return tanhf(x); }

TNT_HD float tanh_derivative(float y) { return 1.0f - y * y; }

TNT_HD float leaky_relu(float x, float alpha) { return x > 0.0f ? x : alpha * x; }

TNT_HD float leaky_relu_derivative(float x, float alpha) { return x > 0.0f ? 1.0f : alpha; }

}  // namespace tnt::act
