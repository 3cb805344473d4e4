// The optimizers' update rules, each written once: the CPU loops (sgd.cpp, adam.cpp) and the
// CUDA kernels (optim_cuda.cu) call the same per-element function, compiled for host and
// device like core/philox.hpp. The scalars of one step are derived once on the host, in
// double and rounded to float once (as PyTorch), by sgd_rule() and adam_rule(); both engines
// then do the same f32 arithmetic per element, in the same order.
//
// The two engines are bitwise equal: every multiply and add of a rule goes through mul() and
// add() below, which the device compiles to __fmul_rn/__fadd_rn (never fused into an FMA,
// which nvcc does by default) and the host to plain float operations in files built with
// -ffp-contract=off (runtime/CMakeLists.txt; GCC would fuse under -march=x86-64-v3). sqrt and
// division are correctly rounded on both. A fused a * b + c skips a rounding, which under
// cancellation (momentum * buf + g of opposite signs) is a relative difference of 1e-5 and
// more; tests/optim/test_optim_cuda.cpp therefore compares bit for bit, and
// tests/optim/test_optim.cpp pins the CPU's bits, so a changed expression here fails there.
#pragma once

#include "core/host_device.hpp"

#include <cmath>
#include <cstdint>

namespace tnt::optim {

// One rounding per operation on both engines (see the top of the file).
TNT_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TNT_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TNT_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// Optimizer state (momentum buffers, Adam's moments) below the smallest normal float is kept
// as a zero of its sign, on both engines. A unit that stops getting gradients (a ReLU that
// never fires) has its moments decay geometrically, m by beta1 = 0.9 a step: after about 800
// steps they are subnormal, and on x86 every operation that reads or makes a subnormal takes
// a microcode assist of ~100 cycles. The Fashion-MNIST CNN's Adam step went from 5% to 43% of
// the training time after its first epoch that way. Flushed, such an element costs one slow
// operation in its life, then none. Adam's v is flushed only once m is 0 (a v flushed under
// a normal m would divide by eps alone, by 0 with eps = 0), and 0 / 0 is taken as 0. So
// against PyTorch's rule, which keeps subnormals, an update differs by less than
// 2^-126 * step_size / eps, or is 0 where PyTorch's is 0 / 0 (m and v both 0 with eps = 0).
// A NaN stays NaN. (eps = 0 stays fragile as in PyTorch: a gradient whose square underflows
// under a normal m divides by 0.)
TNT_HD float flush_subnormal(float x) {
  constexpr float kMinNormal = 0x1p-126f;
  // One compare of values computed anyway: no branch, so the CPU loops vectorise.
#if defined(__CUDA_ARCH__)
  return fabsf(x) < kMinNormal ? copysignf(0.0f, x) : x;
#else
  return std::fabs(x) < kMinNormal ? std::copysign(0.0f, x) : x;
#endif
}

// torch.optim.SGD, per element:
//   g = grad + weight_decay * p
//   with momentum: b = first ? g : momentum * b + (1 - dampening) * g   (flushed, above)
//                  g = nesterov ? g + momentum * b : b
//   p = p - lr * g
struct SgdRule {
  float lr = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float weight_decay = 0.0f;  // 0 where the decay filter excludes the parameter
  bool nesterov = false;
  bool first = false;  // the parameter's first step: the buffer starts as g
};

// Host: one step's scalars. 1 - dampening is taken in double, then rounded.
inline SgdRule sgd_rule(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                        bool first) {
  SgdRule r;
  r.lr = static_cast<float>(lr);
  r.momentum = static_cast<float>(momentum);
  r.one_minus_dampening = static_cast<float>(1.0 - dampening);
  r.weight_decay = static_cast<float>(weight_decay);
  r.nesterov = nesterov;
  r.first = first;
  return r;
}

// The rule with r.first and r.nesterov as constants (kFirst, kNesterov): what the CPU loop
// runs, one instantiation per case, so that it has no branch and vectorises.
template <bool kFirst, bool kNesterov>
TNT_HD void apply_sgd(const SgdRule& r, float& param, float grad, float* buf) {
  float g = add(grad, mul(r.weight_decay, param));
  if (buf != nullptr) {
    const float b = flush_subnormal(kFirst ? g : add(mul(r.momentum, *buf), mul(r.one_minus_dampening, g)));
    *buf = b;
    g = kNesterov ? add(g, mul(r.momentum, b)) : b;
  }
  param = sub(param, mul(r.lr, g));
}

// buf: this element of the momentum buffer, or null when momentum == 0 (no buffer).
TNT_HD void apply(const SgdRule& r, float& param, float grad, float* buf) {
  if (r.first) {
    r.nesterov ? apply_sgd<true, true>(r, param, grad, buf) : apply_sgd<true, false>(r, param, grad, buf);
  } else {
    r.nesterov ? apply_sgd<false, true>(r, param, grad, buf) : apply_sgd<false, false>(r, param, grad, buf);
  }
}

// torch.optim.Adam (L2: the decay is added to the gradient) and AdamW (decoupled: the
// parameter shrinks first), per element at step t:
//   p = p * decay_factor            decay_factor = 1 - lr * wd (AdamW), 1 (Adam)
//   g = grad + l2 * p               l2 = wd (Adam), 0 (AdamW)
//   m = beta1 * m + (1 - beta1) * g         (m, and v once m is 0, flushed: above)
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
//                                   step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t)
struct AdamRule {
  float beta1 = 0.0f, one_minus_beta1 = 1.0f;
  float beta2 = 0.0f, one_minus_beta2 = 1.0f;
  float eps = 0.0f;
  float l2 = 0.0f;
  float decay_factor = 1.0f;
  float step_size = 0.0f;
  float inv_sqrt_bc2 = 1.0f;
};

// Host: one step's scalars at step t >= 1. weight_decay is 0 where the decay filter excludes
// the parameter. Differences such as 1 - beta are taken in double, then rounded: 1.0f -
// 0.999f would be off by 1.3e-5 relative.
inline AdamRule adam_rule(double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                          double t) {
  AdamRule r;
  r.beta1 = static_cast<float>(beta1);
  r.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  r.beta2 = static_cast<float>(beta2);
  r.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  r.eps = static_cast<float>(eps);
  r.l2 = decoupled ? 0.0f : static_cast<float>(weight_decay);
  r.decay_factor = decoupled ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  r.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
  r.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2, t)));
  return r;
}

TNT_HD float sqrt_f32(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

// m, v: this element of exp_avg and exp_avg_sq.
TNT_HD void apply(const AdamRule& r, float& param, float grad, float& m, float& v) {
  const float p = mul(param, r.decay_factor);
  const float g = add(grad, mul(r.l2, p));
  const float mi = flush_subnormal(add(mul(r.beta1, m), mul(r.one_minus_beta1, g)));
  const float v_next = add(mul(r.beta2, v), mul(mul(r.one_minus_beta2, g), g));
  const float v_flushed = flush_subnormal(v_next);
  const float vi = mi == 0.0f ? v_flushed : v_next;  // (see flush_subnormal)
  m = mi;
  v = vi;
  // The quotient, but +-0 for 0 / 0 (m and v both 0 with eps = 0): a NaN or infinite
  // denominator still gives its NaN or 0. Both are computed and one is chosen, so that the
  // CPU loop has no branch and vectorises.
  const float step = mul(r.step_size, mi);
  const float denom = add(mul(sqrt_f32(vi), r.inv_sqrt_bc2), r.eps);
  const float quotient = step / denom;
  param = sub(p, mi == 0.0f && denom == 0.0f ? step : quotient);
}

// Gradient clipping by value (optim/clip.cpp): g into [-limit, limit]. Comparisons, not
// fmin/fmax, so that a NaN stays NaN for the loss scaler to see.
TNT_HD float clip_value(float g, float limit) { return g > limit ? limit : (g < -limit ? -limit : g); }

}  // namespace tnt::optim
