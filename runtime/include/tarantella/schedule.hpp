// Learning-rate schedules, all as a function of the optimizer's step counter: the number of
// updates done before this one (the first update uses lr(0), as tf.keras optimizers do
// with `iterations`). A schedule is a pure function of the step, so a run resumed from a
// checkpoint at step s continues with exactly the rates it would have had.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tnt {

class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  virtual double lr(int64_t step) const = 0;
  virtual std::string describe() const = 0;  // "Constant(0.001)", for logs
};

using SchedulePtr = std::shared_ptr<LearningRateSchedule>;

class ConstantSchedule : public LearningRateSchedule {
 public:
  explicit ConstantSchedule(double value);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double value_;
};

// The TF Model Garden ResNet's PiecewiseConstantDecayWithWarmup, in steps:
//   step <  warmup_steps:                 values[0] * step / warmup_steps
//   otherwise (tf piecewise_constant):    values[0]   if step <= boundaries[0]
//                                         values[i]   if boundaries[i-1] < step <= boundaries[i]
//                                         values[n]   if step >  boundaries[n-1]
// values has one more entry than boundaries; boundaries increase strictly.
class PiecewiseConstantWithWarmup : public LearningRateSchedule {
 public:
  PiecewiseConstantWithWarmup(std::vector<int64_t> boundaries, std::vector<double> values,
                              int64_t warmup_steps);
  // The tutorial's parameters: base rate 0.1 per 256 samples scaled to batch_size,
  // boundaries in epochs (e.g. {30, 60, 80}), multipliers of the scaled rate (e.g. {1, 0.1,
  // 0.01, 0.001}), steps_per_epoch = epoch_size / batch_size (rounded down).
  static std::shared_ptr<PiecewiseConstantWithWarmup> from_epochs(
      int64_t batch_size, int64_t epoch_size, int64_t warmup_epochs,
      const std::vector<int64_t>& boundary_epochs, const std::vector<double>& multipliers,
      double base_lr_per_256 = 0.1);

  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
  int64_t warmup_steps_;
};

// tf.keras CosineDecay with an optional linear warmup:
//   step < warmup_steps:  base * step / warmup_steps
//   otherwise:            t = min(step - warmup, total - warmup) / (total - warmup)
//                         base * ((1 - alpha) * 0.5 * (1 + cos(pi * t)) + alpha)
class CosineSchedule : public LearningRateSchedule {
 public:
  CosineSchedule(double base, int64_t total_steps, double alpha = 0.0, int64_t warmup_steps = 0);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double base_;
  int64_t total_steps_;
  double alpha_;
  int64_t warmup_steps_;
};

// "Attention is all you need", in the form of the TF official Transformer:
//   scale * d_model^-0.5 * min(1, step / warmup) / sqrt(max(step, warmup))
// which equals scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) for step >= 1
// and is 0 at step 0.
class InverseSqrtWithWarmup : public LearningRateSchedule {
 public:
  InverseSqrtWithWarmup(int64_t d_model, int64_t warmup_steps, double scale = 1.0);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  int64_t d_model_;
  int64_t warmup_steps_;
  double scale_;
};

}  // namespace tnt
