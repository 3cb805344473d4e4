#include "tarantella/schedule.hpp"

#include "tarantella/check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tnt {

ConstantSchedule::ConstantSchedule(double value) : value_(value) {
  TNT_INPUT_CHECK(std::isfinite(value) && value >= 0, "learning rate must be finite and >= 0, got {}", value);
}

double ConstantSchedule::lr(int64_t) const { return value_; }

std::string ConstantSchedule::describe() const { return fmt::format("Constant({})", value_); }

PiecewiseConstantWithWarmup::PiecewiseConstantWithWarmup(std::vector<int64_t> boundaries,
                                                         std::vector<double> values,
                                                         int64_t warmup_steps)
    : boundaries_(std::move(boundaries)), values_(std::move(values)), warmup_steps_(warmup_steps) {
  TNT_CHECK(values_.size() == boundaries_.size() + 1,
            "PiecewiseConstantWithWarmup: {} boundaries need {} values, got {}", boundaries_.size(),
            boundaries_.size() + 1, values_.size());
  for (size_t i = 1; i < boundaries_.size(); ++i) {
    TNT_CHECK(boundaries_[i - 1] < boundaries_[i],
              "PiecewiseConstantWithWarmup: boundaries must increase, got {}", fmt::join(boundaries_, ", "));
  }
  TNT_CHECK(warmup_steps_ >= 0, "PiecewiseConstantWithWarmup: warmup_steps must be >= 0, got {}",
            warmup_steps_);
}

std::shared_ptr<PiecewiseConstantWithWarmup> PiecewiseConstantWithWarmup::from_epochs(
    int64_t batch_size, int64_t epoch_size, int64_t warmup_epochs,
    const std::vector<int64_t>& boundary_epochs, const std::vector<double>& multipliers,
    double base_lr_per_256) {
  TNT_CHECK(batch_size > 0, "PiecewiseConstantWithWarmup: batch_size must be > 0, got {}", batch_size);
  const int64_t steps_per_epoch = epoch_size / batch_size;
  const double rescaled = base_lr_per_256 * static_cast<double>(batch_size) / 256.0;
  std::vector<int64_t> boundaries;
  for (int64_t e : boundary_epochs) boundaries.push_back(e * steps_per_epoch);
  std::vector<double> values;
  for (double m : multipliers) values.push_back(rescaled * m);
  return std::make_shared<PiecewiseConstantWithWarmup>(std::move(boundaries), std::move(values),
                                                       warmup_epochs * steps_per_epoch);
}

double PiecewiseConstantWithWarmup::lr(int64_t step) const {
  if (step < warmup_steps_) {
    return values_[0] * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  }
  // tf.compat.v1.train.piecewise_constant: a boundary belongs to the interval it ends.
  size_t i = 0;
  while (i < boundaries_.size() && step > boundaries_[i]) ++i;
  return values_[i];
}

std::string PiecewiseConstantWithWarmup::describe() const {
  return fmt::format("PiecewiseConstantWithWarmup(boundaries=[{}], values=[{:g}], warmup_steps={})",
                     fmt::join(boundaries_, ", "), fmt::join(values_, ", "), warmup_steps_);
}

CosineSchedule::CosineSchedule(double base, int64_t total_steps, double alpha, int64_t warmup_steps)
    : base_(base), total_steps_(total_steps), alpha_(alpha), warmup_steps_(warmup_steps) {
  TNT_CHECK(warmup_steps_ >= 0 && total_steps_ > warmup_steps_,
            "CosineSchedule: need 0 <= warmup_steps < total_steps, got warmup_steps={} total_steps={}",
            warmup_steps_, total_steps_);
  TNT_CHECK(alpha_ >= 0 && alpha_ <= 1, "CosineSchedule: alpha must be in [0, 1], got {}", alpha_);
}

double CosineSchedule::lr(int64_t step) const {
  if (step < warmup_steps_) {
    return base_ * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  }
  const double span = static_cast<double>(total_steps_ - warmup_steps_);
  const double t = std::min(static_cast<double>(step - warmup_steps_), span) / span;
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  return base_ * ((1.0 - alpha_) * cosine + alpha_);
}

std::string CosineSchedule::describe() const {
  return fmt::format("Cosine(base={}, total_steps={}, alpha={}, warmup_steps={})", base_,
                     total_steps_, alpha_, warmup_steps_);
}

InverseSqrtWithWarmup::InverseSqrtWithWarmup(int64_t d_model, int64_t warmup_steps, double scale)
    : d_model_(d_model), warmup_steps_(warmup_steps), scale_(scale) {
  TNT_CHECK(d_model_ > 0, "InverseSqrtWithWarmup: d_model must be > 0, got {}", d_model_);
  TNT_CHECK(warmup_steps_ > 0, "InverseSqrtWithWarmup: warmup_steps must be > 0, got {}", warmup_steps_);
}

double InverseSqrtWithWarmup::lr(int64_t step) const {
  const double s = static_cast<double>(step);
  const double w = static_cast<double>(warmup_steps_);
  return scale_ / std::sqrt(static_cast<double>(d_model_)) * std::min(1.0, s / w) /
         std::sqrt(std::max(s, w));
}

std::string InverseSqrtWithWarmup::describe() const {
  return fmt::format("InverseSqrtWithWarmup(d_model={}, warmup_steps={}, scale={})", d_model_,
                     warmup_steps_, scale_);
}

}  // namespace tnt
