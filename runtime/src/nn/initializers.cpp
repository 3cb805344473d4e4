// Initialisers: every element is a pure function of (seed, full parameter name, index),
// drawn on the host in double and converted once, then copied to the tensor's device. The
// truncated normal needs no sequential redraw: element i tries Philox blocks
// (key, i, attempt = 0, 1, ...) in turn, each giving two Box-Muller normals, and takes the
// first one inside the bounds, so each element stays independent of every other.
#include "tarantella/initializers.hpp"

#include "core/half.hpp"
#include "core/philox.hpp"
#include "tarantella/check.hpp"

#include <cmath>
#include <numbers>
#include <vector>

namespace tnt {

namespace {

// Standard normal restricted to [-2, 2].
double truncated_standard_normal(uint64_t key, uint64_t counter) {
  for (uint32_t attempt = 0;; ++attempt) {
    uint32_t block[4];
    philox::block(key, counter, attempt, block);
    double z0, z1;
    philox::box_muller(block, z0, z1);
    if (std::fabs(z0) <= 2.0) return z0;
    if (std::fabs(z1) <= 2.0) return z1;
    // P(both outside) = 0.0455^2 ~ 0.2%: a few attempts at most in practice.
  }
}

void fans(const Shape& shape, double& fan_in, double& fan_out) {
  if (shape.empty()) {
    fan_in = fan_out = 1;
  } else if (shape.size() == 1) {
    fan_in = fan_out = static_cast<double>(shape[0]);
  } else {
    double receptive = 1;
    for (size_t i = 2; i < shape.size(); ++i) receptive *= static_cast<double>(shape[i]);
    fan_in = static_cast<double>(shape[1]) * receptive;
    fan_out = static_cast<double>(shape[0]) * receptive;
  }
}

}  // namespace

std::string Initializer::str() const {
  switch (kind) {
    case Kind::zeros: return "zeros";
    case Kind::ones: return "ones";
    case Kind::constant: return fmt::format("constant({})", a);
    case Kind::uniform: return fmt::format("uniform({}, {})", a, b);
    case Kind::normal: return fmt::format("normal({}, {})", a, b);
    case Kind::truncated_normal: return fmt::format("truncated_normal({}, {})", a, b);
    case Kind::glorot_uniform: return "glorot_uniform";
    case Kind::glorot_normal: return "glorot_normal";
    case Kind::he_uniform: return "he_uniform";
    case Kind::he_normal: return "he_normal";
  }
  return "?";
}

void Initializer::apply(Tensor& t, uint64_t seed, const std::string& full_name) const {
  TNT_CHECK(t.defined(), "initializer {} for '{}': the tensor is undefined", str(), full_name);
  bool constant_kind = kind == Kind::zeros || kind == Kind::ones || kind == Kind::constant;
  if (constant_kind) {
    t.fill_(kind == Kind::zeros ? 0.0 : kind == Kind::ones ? 1.0 : a);
    return;
  }
  DType dt = t.dtype();
  TNT_CHECK(dt == DType::f32 || dt == DType::f64 || dt == DType::f16 || dt == DType::bf16,
            "initializer {} for '{}': needs a floating tensor, got {}", str(), full_name, t.str());
  if (kind == Kind::uniform) TNT_CHECK(a <= b, "initializer uniform({}, {}) for '{}': low > high", a, b, full_name);
  if (kind == Kind::normal || kind == Kind::truncated_normal)
    TNT_CHECK(b >= 0, "initializer {} for '{}': negative stddev", str(), full_name);

  double fan_in, fan_out;
  fans(t.shape(), fan_in, fan_out);
  TNT_CHECK((fan_in > 0 && fan_out > 0) || t.numel() == 0, "initializer {} for '{}': empty fan in shape {}", str(),
            full_name, shape_str(t.shape()));

  // Every kind is either lo + (hi - lo) * U or mean + stddev * Z.
  bool use_uniform = false, truncated = false;
  double lo = 0, hi = 0, mean = 0, stddev = 0;
  switch (kind) {
    case Kind::uniform: use_uniform = true; lo = a; hi = b; break;
    case Kind::normal: mean = a; stddev = b; break;
    case Kind::truncated_normal: mean = a; stddev = b; truncated = true; break;
    case Kind::glorot_uniform: use_uniform = true; hi = std::sqrt(6.0 / (fan_in + fan_out)); lo = -hi; break;
    case Kind::glorot_normal: stddev = std::sqrt(2.0 / (fan_in + fan_out)); break;
    case Kind::he_uniform: use_uniform = true; hi = std::sqrt(6.0 / fan_in); lo = -hi; break;
    case Kind::he_normal: stddev = std::sqrt(2.0 / fan_in); break;
    default: break;
  }

  const uint64_t key = CounterRng(seed, full_name).key();
  const int64_t n = t.numel();
  Tensor host = Tensor::empty(t.shape(), dt, Device::cpu());
  void* out = host.raw();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t c = static_cast<uint64_t>(i);
    double v;
    if (use_uniform) {
      v = lo + (hi - lo) * static_cast<double>(philox::uniform(key, c));
    } else if (truncated) {
      v = mean + stddev * truncated_standard_normal(key, c);
    } else {
      uint32_t block[4];
      philox::block(key, c, 0, block);
      double z0, z1;
      philox::box_muller(block, z0, z1);
      v = mean + stddev * z0;
    }
    switch (dt) {
      case DType::f32: static_cast<float*>(out)[i] = static_cast<float>(v); break;
      case DType::f64: static_cast<double*>(out)[i] = v; break;
      case DType::f16: static_cast<uint16_t*>(out)[i] = float_to_f16(static_cast<float>(v)); break;
      case DType::bf16: static_cast<uint16_t*>(out)[i] = float_to_bf16(static_cast<float>(v)); break;
      default: break;
    }
  }
  t.copy_from(host);
}

}  // namespace tnt
