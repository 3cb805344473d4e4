// Mixed precision: what Model::compile takes, and the dynamic loss scaler.
//
//   model.compile(optimizer, loss, metrics, tnt::Precision::from_name("bf16"));
//
// With compute dtype bf16 or f16 the network runs its layers in that dtype (activations,
// their gradients, convolution and matrix products with f32 accumulation on the GPU), while
// parameters, their gradients, the allreduce, the optimizer and its state stay f32: the
// "master weights" (Network::set_compute_dtype has the details). The loss and the metrics
// see f32 outputs.
//
// Loss scaling (f16 only by default: its largest finite value is 65504 and small gradients
// vanish below 2^-24; bf16 has f32's range). The loss is multiplied by S before backward,
// the summed gradients by 1/S after the allreduce. If any summed gradient is then NaN or
// infinite, the step is skipped (no optimizer update; the batch counts as consumed) and
// S *= backoff_factor; after growth_interval good steps in a row, S *= growth_factor.
// Gradients are summed before the check, so every rank sees the same values and makes the
// same decision without another collective. The defaults are PyTorch's GradScaler's.
// The scale and the good-step count are saved in checkpoints.
#pragma once

#include "tarantella/dtype.hpp"

#include <cstdint>
#include <string>

namespace tnt {

enum class LossScaling { automatic, dynamic, none };  // automatic: dynamic for f16, else none

struct Precision {
  DType compute_dtype = DType::f32;  // f32, bf16 or f16
  LossScaling loss_scaling = LossScaling::automatic;
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;

  // "fp32"/"f32", "bf16", "fp16"/"f16" (the --dtype flag); an InputError names anything else.
  static Precision from_name(const std::string& name);
  bool mixed() const { return compute_dtype != DType::f32; }
  bool scales_loss() const;
  std::string name() const;  // "fp32", "bf16", "fp16"
};

class LossScaler {
 public:
  explicit LossScaler(const Precision& precision = {});
  bool enabled() const { return enabled_; }
  double scale() const { return enabled_ ? scale_ : 1.0; }
  // After the step's gradients are summed and unscaled. Returns whether the optimizer may
  // step (false: skip it). Throws an Error when the scale falls below 2^-24: then the
  // gradients overflow whatever the scale, which means the training itself diverged.
  bool update(bool found_non_finite);
  int64_t good_steps() const { return good_steps_; }        // since the last change of scale
  int64_t skipped_steps() const { return skipped_steps_; }  // since construction
  void set_state(double scale, int64_t good_steps);         // from a checkpoint

 private:
  bool enabled_ = false;
  double scale_ = 1.0;
  double growth_factor_ = 2.0;
  double backoff_factor_ = 0.5;
  int64_t growth_interval_ = 2000;
  int64_t good_steps_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace tnt
