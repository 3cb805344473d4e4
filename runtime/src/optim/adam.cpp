#include "tarantella/optim.hpp"

#include "backend/dispatch.hpp"
#include "optim/multi_tensor.hpp"
#include "optim/optim_cuda.hpp"
#include "optim/update_rules.hpp"

#include <fmt/format.h>

namespace tnt {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // see sgd.cpp

// The rule a private copy that no store can alias, as in sgd.cpp: the loop vectorises.
void adam_cpu(const optim::AdamRule rule, float* param, const float* grad, float* m, float* v, int64_t n) {
  // param, grad, m, v: (n,)
#pragma omp parallel for simd if (n >= kParallelMin) firstprivate(rule)
  for (int64_t i = 0; i < n; ++i) optim::apply(rule, param[i], grad[i], m[i], v[i]);
}

void adam_multi_tensor(const optim::MtLaunch& launch, const std::vector<optim::AdamRule>& rules) {
  TNT_CUDA_DISPATCH(launch.device,
                    cuda::multi_tensor_adam(launch, rules.data(), static_cast<int>(rules.size())));
  TNT_THROW("Adam: a multi-tensor step for parameters on {}: only CUDA has one", launch.device.str());
}

}  // namespace

Adam::Adam(SchedulePtr schedule, AdamOptions options, bool decoupled)
    : Optimizer(std::move(schedule)), options_(std::move(options)), decoupled_(decoupled) {
  TNT_CHECK(options_.beta1 >= 0 && options_.beta1 < 1 && options_.beta2 >= 0 && options_.beta2 < 1,
            "{}: betas must be in [0, 1), got ({}, {})", type(), options_.beta1, options_.beta2);
  TNT_CHECK(options_.eps >= 0, "{}: eps must be >= 0, got {}", type(), options_.eps);
  TNT_CHECK(options_.weight_decay >= 0, "{}: weight_decay must be >= 0, got {}", type(),
            options_.weight_decay);
  decay_filter_ = options_.decay_filter;
  set_clipping(options_.clipping);
}

Adam::Adam(SchedulePtr schedule, AdamOptions options) : Adam(std::move(schedule), std::move(options), false) {}

Adam::Adam(double lr, AdamOptions options)
    : Adam(std::make_shared<ConstantSchedule>(lr), std::move(options), false) {}

AdamW::AdamW(SchedulePtr schedule, AdamOptions options) : Adam(std::move(schedule), std::move(options), true) {}

AdamW::AdamW(double lr, AdamOptions options)
    : Adam(std::make_shared<ConstantSchedule>(lr), std::move(options), true) {}

std::string Adam::describe() const {
  return fmt::format("{}(lr={}, betas=({}, {}), eps={}, weight_decay={}{})", type(),
                     schedule().describe(), options_.beta1, options_.beta2, options_.eps,
                     options_.weight_decay, clipping_suffix());
}

void Adam::update(Parameter& param, ParamState& state, double lr, bool decay) {
  Tensor& p = param.value;
  TNT_CHECK(p.dtype() == DType::f32, "{}: parameter '{}' is {}; the update kernels take f32", type(),
            state.name, dtype_name(p.dtype()));
  const optim::AdamRule rule =
      optim::adam_rule(lr, options_.beta1, options_.beta2, options_.eps, decay ? options_.weight_decay : 0.0,
                       decoupled_, static_cast<double>(param_step(state)));
  TNT_CUDA_DISPATCH(p.device(), cuda::adam_update(rule, p.data<float>(), param.grad.data<float>(),
                                                  state.slots[0].data<float>(), state.slots[1].data<float>(),
                                                  p.numel(), p.device().index));
  adam_cpu(rule, p.data<float>(), param.grad.data<float>(), state.slots[0].data<float>(),
           state.slots[1].data<float>(), p.numel());
}

// The rules of update() for each class of parameters (decay or not, update count t), in
// one launch.
bool Adam::update_multi_tensor(const optim::MultiTensorStep& step, double lr) {
  std::vector<optim::AdamRule> rules;
  for (const optim::RuleClass& c : step.classes) {
    rules.push_back(optim::adam_rule(lr, options_.beta1, options_.beta2, options_.eps,
                                     c.decay ? options_.weight_decay : 0.0, decoupled_, static_cast<double>(c.t)));
  }
  adam_multi_tensor(step.launch, rules);
  return true;
}

}  // namespace tnt
