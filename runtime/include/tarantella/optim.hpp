// Optimizers with PyTorch's update rules (so a run can be compared with, and a checkpoint
// moved to, PyTorch). For a parameter p with gradient g at learning rate lr (from the
// schedule at the optimizer's step counter) and this parameter's update number t = 1, 2, ...:
//
// SGD(momentum mu, dampening d, weight_decay wd, nesterov):
//   g <- g + wd * p
//   b <- g                          on the first update (t = 1)
//   b <- mu * b + (1 - d) * g       afterwards                        (only when mu != 0)
//   g <- g + mu * b  if nesterov,  else  g <- b                       (only when mu != 0)
//   p <- p - lr * g
// (Keras' SGD keeps v = mu*v - lr*g; the two agree while lr is constant.)
//
// Adam(beta1, beta2, eps, weight_decay wd as L2):
//   g <- g + wd * p
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g^2
//   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// AdamW: the same without the L2 term, after a decoupled decay p <- p * (1 - lr * wd).
//
// State, for checkpoints, is exposed by name: "<param full name>.<slot>" with PyTorch's slot
// names (momentum_buffer; exp_avg, exp_avg_sq) and "<param>.step" (the update count t, an
// i64 tensor of one element on the host), plus the optimizer's own step counter.
// State tensors live on their parameter's device and follow it when the model moves.
//
// Gradient clipping (GradientClipping, Keras' clipvalue / clipnorm / global_clipnorm) acts in
// step() on the gradients step() is given, before any update rule (so before weight decay
// is added, as torch.nn.utils.clip_grad_norm_ before optimizer.step()). In Model::fit those
// are the allreduced global gradients with the loss scale already divided out, bitwise equal
// on every rank, so every rank clips alike (fit refuses ranks whose GradientClipping
// differ); a step the loss scaler skips is never clipped. A norm that is NaN or infinite
// (clip_norm, clip_global_norm) clips nothing: the step's gradients go to the update as they
// are, and with them the NaN or infinity, which TerminateOnNaN or the loss scaler then stop
// (scaling by limit / inf = 0 would zero every gradient and hide the divergence; TensorFlow
// makes every gradient NaN, PyTorch scales by the non-finite factor or raises).
//
// On a CUDA device a step updates all its parameters in one kernel launch (and clips them in
// at most three), through a table of the parameters that is kept while they stay the same;
// the result is bitwise that of one launch per parameter.
#pragma once

#include "tarantella/layer.hpp"
#include "tarantella/schedule.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace tnt {

namespace optim {
class MultiTensorCache;
struct MultiTensorStep;
}  // namespace optim

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Which parameters weight decay applies to (by full name); empty = all of them. The TF
// ResNet, for instance, leaves out BatchNorm's weight and bias.
using DecayFilter = std::function<bool(const std::string& full_name)>;

// Each threshold, when given, must be positive (an InputError otherwise); norm and
// global_norm exclude each other (as in Keras). Order: the norm (per tensor or global)
// first, then the value. A gradient within a threshold is left untouched, bit for bit.
struct GradientClipping {
  // Each element into [-value, value] (a NaN stays NaN).
  std::optional<double> value = std::nullopt;
  // Each tensor g with |g|_2 > norm becomes g * norm / |g|_2.
  std::optional<double> norm = std::nullopt;
  // All gradients together: with n = sqrt(sum of |g|_2^2 over every parameter step()
  // updates), if n > global_norm every g becomes g * global_norm / n.
  std::optional<double> global_norm = std::nullopt;
  bool active() const { return value || norm || global_norm; }
  std::string describe() const;  // "clip_value=0.5, clip_global_norm=1"; "" when inactive
};

class Optimizer {
 public:
  explicit Optimizer(SchedulePtr schedule);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string type() const = 0;  // "SGD", "Adam", "AdamW"
  virtual std::string describe() const;  // type, hyperparameters and schedule, for logs

  // Updates every trainable parameter that has a gradient, at lr = learning_rate(), then
  // advances the step counter. Parameters are told apart by their full names, so pass the
  // same network's list every time (e.g. Network::trainable_parameters()).
  void step(const std::vector<NamedParameter>& params);

  double learning_rate() const;  // the rate the next step will use
  // Replaces the schedule by a constant rate (what Keras' LR callbacks do); the rate given is
  // the rate, so a factor set by set_lr_factor is folded into it (reset to 1).
  void set_learning_rate(double lr);
  void set_schedule(SchedulePtr schedule);
  // A factor on the schedule (ReduceLROnPlateau's): with s the schedule's rate at the step,
  // learning_rate() = min(s, max(factor * s, floor)), so a schedule keeps its shape (warmup,
  // decay) scaled down, the factor never takes it below floor nor lifts it above s. factor
  // 1 (the default) leaves the schedule's rate as it is, bit for bit. Model checkpoints keep
  // factor and floor (metadata lr_factor, lr_floor).
  void set_lr_factor(double factor, double floor = 0.0);
  double lr_factor() const { return lr_factor_; }
  double lr_floor() const { return lr_floor_; }
  const LearningRateSchedule& schedule() const { return *schedule_; }
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t step);  // when resuming from a checkpoint
  // Throws InputError (naming the threshold) for a non-positive threshold or for norm and
  // global_norm together.
  void set_clipping(const GradientClipping& clipping);
  const GradientClipping& clipping() const { return clipping_; }

  // Slot names of one parameter's state (without "step").
  virtual std::vector<std::string> slot_names() const = 0;
  // Creates the (zero) state of every parameter that does not have it yet, so that a
  // checkpoint can be loaded into named_state() before the first step.
  void init_state(const std::vector<NamedParameter>& params);
  // "<param>.<slot>" for every slot, then "<param>.step", parameter by parameter in the
  // order they were first seen. The tensors share storage with the state.
  std::vector<NamedTensor> named_state() const;
  // Copies value into the state called name (see named_state); throws InputError for a
  // name that is not there or a value of another element count.
  void load_state(const std::string& name, const Tensor& value);

 protected:
  struct ParamState {
    std::string name;
    std::vector<Tensor> slots;  // slot_names() order, same shape and device as the param
    Tensor step;                // i64 (1,) on the host: this parameter's update count
  };
  // One update of one parameter: state.step already counts this update.
  virtual void update(Parameter& param, ParamState& state, double lr, bool decay) = 0;
  // The same update of every parameter of a step at once, on one CUDA device, through the
  // table of optim/multi_tensor.hpp (one launch per step instead of one per parameter).
  // Returns false where the optimizer has no such path (the default); step() then calls
  // update() per parameter. step() offers it only when every parameter, gradient and slot
  // is f32 on one CUDA device and the parameters fall into at most optim::kMaxRules rules.
  virtual bool update_multi_tensor(const optim::MultiTensorStep& step, double lr);
  // Off: every step takes the per-parameter path (update() and per-tensor clipping), e.g. to
  // compare the two. On by default.
  void set_multi_tensor(bool enabled) { multi_tensor_ = enabled; }
  static int64_t param_step(const ParamState& state);
  std::string clipping_suffix() const;  // ", clip_norm=1" for describe(); "" without clipping

  DecayFilter decay_filter_;  // set by the derived class from its options

 private:
  ParamState& state_for(const std::string& name, const Parameter& param);

  bool multi_tensor_ = true;  // see set_multi_tensor
  // The uploaded table of the last multi-tensor step (made on first use; shared_ptr because
  // the type is internal to the runtime).
  std::shared_ptr<optim::MultiTensorCache> multi_tensor_cache_;

  SchedulePtr schedule_;
  double lr_factor_ = 1.0;
  double lr_floor_ = 0.0;
  GradientClipping clipping_;
  int64_t step_count_ = 0;
  std::vector<ParamState> state_;
  std::unordered_map<std::string, size_t> index_;
};

struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  DecayFilter decay_filter = nullptr;
  GradientClipping clipping = {};
};

class SGD : public Optimizer {
 public:
  SGD(SchedulePtr schedule, SgdOptions options = {});
  SGD(double lr, SgdOptions options = {});
  std::string type() const override { return "SGD"; }
  std::string describe() const override;
  std::vector<std::string> slot_names() const override;

 protected:
  void update(Parameter& param, ParamState& state, double lr, bool decay) override;
  bool update_multi_tensor(const optim::MultiTensorStep& step, double lr) override;

 private:
  SgdOptions options_;
};

struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2 for Adam, decoupled for AdamW (PyTorch's default: 0.01)
  DecayFilter decay_filter = nullptr;
  GradientClipping clipping = {};
};

class Adam : public Optimizer {
 public:
  Adam(SchedulePtr schedule, AdamOptions options = {});
  Adam(double lr, AdamOptions options = {});
  std::string type() const override { return decoupled_ ? "AdamW" : "Adam"; }
  std::string describe() const override;
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 protected:
  Adam(SchedulePtr schedule, AdamOptions options, bool decoupled);
  void update(Parameter& param, ParamState& state, double lr, bool decay) override;
  bool update_multi_tensor(const optim::MultiTensorStep& step, double lr) override;

 private:
  AdamOptions options_;
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  static AdamOptions default_options() {
    AdamOptions o;
    o.weight_decay = 0.01;
    return o;
  }
  AdamW(SchedulePtr schedule, AdamOptions options = default_options());
  AdamW(double lr, AdamOptions options = default_options());
};

}  // namespace tnt
