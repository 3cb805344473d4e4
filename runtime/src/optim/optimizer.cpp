#include "tarantella/optim.hpp"

#include "optim/clip.hpp"
#include "optim/multi_tensor.hpp"
#include "tarantella/check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace tnt {

Optimizer::Optimizer(SchedulePtr schedule) : schedule_(std::move(schedule)) {
  TNT_CHECK(schedule_ != nullptr, "optimizer needs a learning-rate schedule, got null");
}

std::string Optimizer::describe() const {
  return fmt::format("{}(lr={}{})", type(), schedule_->describe(), clipping_suffix());
}

std::string Optimizer::clipping_suffix() const {
  return clipping_.active() ? ", " + clipping_.describe() : std::string();
}

void Optimizer::set_clipping(const GradientClipping& clipping) {
  check_clipping(clipping);
  clipping_ = clipping;
}

double Optimizer::learning_rate() const {
  const double s = schedule_->lr(step_count_);
  if (lr_factor_ == 1.0) return s;
  return std::min(s, std::max(lr_factor_ * s, lr_floor_));
}

void Optimizer::set_learning_rate(double lr) {
  schedule_ = std::make_shared<ConstantSchedule>(lr);
  lr_factor_ = 1.0;
  lr_floor_ = 0.0;
}

void Optimizer::set_lr_factor(double factor, double floor) {
  TNT_INPUT_CHECK(std::isfinite(factor) && factor > 0 && factor <= 1,
                  "{}: learning-rate factor {} must be in (0, 1]", type(), factor);
  TNT_INPUT_CHECK(std::isfinite(floor) && floor >= 0, "{}: learning-rate floor {} must be >= 0", type(), floor);
  lr_factor_ = factor;
  lr_floor_ = floor;
}

void Optimizer::set_schedule(SchedulePtr schedule) {
  TNT_CHECK(schedule != nullptr, "set_schedule: null schedule");
  schedule_ = std::move(schedule);
}

void Optimizer::set_step_count(int64_t step) {
  TNT_CHECK(step >= 0, "optimizer step count must be >= 0, got {}", step);
  step_count_ = step;
}

int64_t Optimizer::param_step(const ParamState& state) { return state.step.data<int64_t>()[0]; }

Optimizer::ParamState& Optimizer::state_for(const std::string& name, const Parameter& param) {
  auto it = index_.find(name);
  if (it == index_.end()) {
    ParamState st;
    st.name = name;
    for (size_t i = 0; i < slot_names().size(); ++i) {
      st.slots.push_back(Tensor::zeros(param.value.shape(), param.value.dtype(), param.value.device()));
    }
    st.step = Tensor::zeros({1}, DType::i64);
    index_.emplace(name, state_.size());
    state_.push_back(std::move(st));
    return state_.back();
  }
  ParamState& st = state_[it->second];
  for (Tensor& slot : st.slots) {
    TNT_CHECK(slot.shape() == param.value.shape(),
              "{}: parameter '{}' has shape {} but its optimizer state has {}", type(), name,
              shape_str(param.value.shape()), shape_str(slot.shape()));
    // The model moved (Network::to) after the state was made: the state follows.
    if (slot.device() != param.value.device()) slot = slot.to(param.value.device());
  }
  return st;
}

bool Optimizer::update_multi_tensor(const optim::MultiTensorStep&, double) { return false; }

namespace {

// The step's tensors as a multi-tensor table sees them, or nothing where the table cannot
// hold them: a parameter, gradient or slot that is not f32 on the one CUDA device of the
// step (mixed devices, the CPU engine), layouts that differ, more than two slots.
std::optional<std::vector<optim::MtTensor>> table_rows(const std::vector<Parameter*>& params,
                                                       const std::vector<const std::vector<Tensor>*>& slots,
                                                       Device& device) {
  if (params.empty()) return std::nullopt;
  device = params[0]->value.device();
  if (!device.is_cuda()) return std::nullopt;
  const MemoryFormat format = params[0]->value.memory_format();
  auto fits = [&](const Tensor& t) {
    return t.dtype() == DType::f32 && t.device() == device && t.memory_format() == format;
  };
  std::vector<optim::MtTensor> rows;
  rows.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = *params[i];
    const std::vector<Tensor>& s = *slots[i];
    if (s.size() > 2 || !fits(p.value) || !fits(p.grad)) return std::nullopt;
    for (const Tensor& slot : s) {
      if (!fits(slot)) return std::nullopt;
    }
    optim::MtTensor row;
    row.param = p.value.data<float>();
    row.grad = p.grad.data<float>();
    row.slot0 = s.size() > 0 ? s[0].data<float>() : nullptr;
    row.slot1 = s.size() > 1 ? s[1].data<float>() : nullptr;
    row.numel = p.value.numel();
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

void Optimizer::step(const std::vector<NamedParameter>& params) {
  const double lr = learning_rate();
  std::vector<const NamedParameter*> updated;
  for (const NamedParameter& np : params) {
    Parameter& p = *np.param;
    if (!p.trainable || !p.grad.defined()) continue;
    TNT_CHECK(p.grad.shape() == p.value.shape() && p.grad.dtype() == p.value.dtype() &&
                  p.grad.device() == p.value.device(),
              "{}: gradient of '{}' is {}, but the parameter is {}", type(), np.name, p.grad.str(),
              p.value.str());
    updated.push_back(&np);
  }
  // The state of every parameter first (state_for may add to state_, which moves its
  // elements: pointers into it are taken after).
  for (const NamedParameter* np : updated) state_for(np->name, *np->param);
  std::vector<Parameter*> ps;
  std::vector<ParamState*> states;
  std::vector<const std::vector<Tensor>*> slots;
  std::vector<optim::RuleClass> classes;  // (decay, t after this update) per parameter
  for (const NamedParameter* np : updated) {
    ParamState* st = &state_[index_.at(np->name)];
    ps.push_back(np->param);
    states.push_back(st);
    slots.push_back(&st->slots);
    classes.push_back({!decay_filter_ || decay_filter_(np->name), param_step(*st) + 1});
  }

  // One table for the clipping and the update, where the step fits one (else nothing: the
  // per-parameter path below, as without the table).
  std::optional<optim::MultiTensorStep> mt;
  if (multi_tensor_) {
    Device device;
    std::optional<std::vector<optim::MtTensor>> rows = table_rows(ps, slots, device);
    std::vector<int32_t> rule_of;
    std::vector<optim::RuleClass> distinct = optim::rule_classes(classes, rule_of);
    if (rows && distinct.size() <= static_cast<size_t>(optim::kMaxRules)) {
      for (size_t i = 0; i < rows->size(); ++i) (*rows)[i].rule = rule_of[i];
      if (!multi_tensor_cache_) multi_tensor_cache_ = std::make_shared<optim::MultiTensorCache>();
      mt.emplace();
      mt->launch = multi_tensor_cache_->launch_for(*rows, device);
      mt->classes = std::move(distinct);
    }
  }

  if (clipping_.active()) {
    // Before any update: the global norm is over every gradient of this step.
    if (mt) {
      clip_gradients(clipping_, mt->launch);
    } else {
      std::vector<Tensor> grads;
      for (const Parameter* p : ps) grads.push_back(p->grad);
      clip_gradients(clipping_, grads);
    }
  }
  for (ParamState* st : states) st->step.data<int64_t>()[0] += 1;
  if (!mt || !update_multi_tensor(*mt, lr)) {
    for (size_t i = 0; i < ps.size(); ++i) update(*ps[i], *states[i], lr, classes[i].decay);
  }
  ++step_count_;
}

void Optimizer::init_state(const std::vector<NamedParameter>& params) {
  for (const NamedParameter& np : params) {
    if (np.param->trainable) state_for(np.name, *np.param);
  }
}

std::vector<NamedTensor> Optimizer::named_state() const {
  std::vector<NamedTensor> out;
  const std::vector<std::string> slots = slot_names();
  for (const ParamState& st : state_) {
    for (size_t i = 0; i < slots.size(); ++i) out.push_back({st.name + "." + slots[i], st.slots[i]});
    out.push_back({st.name + ".step", st.step});
  }
  return out;
}

void Optimizer::load_state(const std::string& name, const Tensor& value) {
  for (NamedTensor& nt : named_state()) {
    if (nt.name != name) continue;
    TNT_INPUT_CHECK(nt.tensor.numel() == value.numel(), "optimizer state '{}' has {} elements, the value given has {}",
                    name, nt.tensor.numel(), value.numel());
    if (nt.tensor.dtype() == value.dtype()) {
      nt.tensor.copy_from(value);
    } else {
      // A step count saved as another integer or float type (PyTorch keeps f32).
      const std::vector<double> v = value.to_double_vector();
      TNT_INPUT_CHECK(nt.tensor.dtype() == DType::i64, "optimizer state '{}' is {}, the value given is {}", name,
                      dtype_name(nt.tensor.dtype()), dtype_name(value.dtype()));
      nt.tensor.data<int64_t>()[0] = static_cast<int64_t>(v.at(0));
    }
    return;
  }
  TNT_INPUT_ERROR(
      "optimizer state '{}' matches no parameter slot of this {} (call init_state() with the "
      "model's parameters before loading)",
      name, type());
}

}  // namespace tnt
