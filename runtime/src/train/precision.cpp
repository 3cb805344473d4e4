#include "tarantella/precision.hpp"

#include "tarantella/check.hpp"
#include "tarantella/log.hpp"

#include <cmath>

namespace tnt {

Precision Precision::from_name(const std::string& name) {
  Precision p;
  if (name == "fp32" || name == "f32") {
    p.compute_dtype = DType::f32;
  } else if (name == "bf16") {
    p.compute_dtype = DType::bf16;
  } else if (name == "fp16" || name == "f16") {
    p.compute_dtype = DType::f16;
  } else {
    TNT_INPUT_ERROR("precision '{}': expected fp32, bf16 or fp16", name);
  }
  return p;
}

bool Precision::scales_loss() const {
  switch (loss_scaling) {
    case LossScaling::automatic: return compute_dtype == DType::f16;
    case LossScaling::dynamic: return true;
    case LossScaling::none: return false;
  }
  return false;
}

std::string Precision::name() const {
  switch (compute_dtype) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    default: return dtype_name(compute_dtype);
  }
}

LossScaler::LossScaler(const Precision& p)
    : enabled_(p.scales_loss()),
      scale_(p.initial_scale),
      growth_factor_(p.growth_factor),
      backoff_factor_(p.backoff_factor),
      growth_interval_(p.growth_interval) {
  if (!enabled_) return;
  if (!(p.initial_scale > 0) || !std::isfinite(p.initial_scale)) {
    TNT_INPUT_ERROR("loss scaling: initial_scale={} must be positive and finite", p.initial_scale);
  }
  if (!(p.growth_factor >= 1) || !std::isfinite(p.growth_factor)) {
    TNT_INPUT_ERROR("loss scaling: growth_factor={} must be >= 1", p.growth_factor);
  }
  if (!(p.backoff_factor > 0 && p.backoff_factor < 1)) {
    TNT_INPUT_ERROR("loss scaling: backoff_factor={} must lie in (0, 1)", p.backoff_factor);
  }
  if (p.growth_interval < 1) {
    TNT_INPUT_ERROR("loss scaling: growth_interval={} must be positive", p.growth_interval);
  }
}

bool LossScaler::update(bool found_non_finite) {
  if (!enabled_) return true;  // without scaling the optimizer always steps (as PyTorch without a GradScaler)
  if (found_non_finite) {
    ++skipped_steps_;
    good_steps_ = 0;
    const double before = scale_;
    scale_ *= backoff_factor_;
    log_info("loss scaling: a gradient overflowed at scale {}; step skipped, scale now {}", before, scale_);
    // 2^-24 is f16's smallest subnormal: with a scale below it even a gradient of 1 would
    // not survive, so overflow at such a scale comes from the model, not from the scale.
    if (scale_ < std::ldexp(1.0, -24)) {
      throw Error(fmt::format("loss scaling: gradients were NaN or infinite at every scale down to {} "
                              "({} steps skipped): the training diverged (a NaN loss, a too-high learning "
                              "rate, or values outside the f16 range in the forward pass; try bf16)",
                              before, skipped_steps_));
    }
    return false;
  }
  if (++good_steps_ >= growth_interval_) {
    scale_ *= growth_factor_;
    good_steps_ = 0;
  }
  return true;
}

void LossScaler::set_state(double scale, int64_t good_steps) {
  TNT_CHECK(scale > 0 && std::isfinite(scale), "loss scaler: scale {} must be positive and finite", scale);
  TNT_CHECK(good_steps >= 0, "loss scaler: good_steps {} must be >= 0", good_steps);
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace tnt
