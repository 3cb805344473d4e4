#include "tarantella/optim.hpp"

#include "backend/dispatch.hpp"
#include "optim/multi_tensor.hpp"
#include "optim/optim_cuda.hpp"
#include "optim/update_rules.hpp"

#include <fmt/format.h>

namespace tnt {

namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

// One loop per case, the rule's tests constants (the buffer pointer's, first, nesterov), and
// the rule a private copy that no store can alias: each loop vectorises.
template <bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(const optim::SgdRule rule, float* param, const float* grad, float* buf, int64_t n) {
  // param, grad, buf: (n,); buf unused without momentum
#pragma omp parallel for simd if (n >= kParallelMin) firstprivate(rule)
  for (int64_t i = 0; i < n; ++i)
    optim::apply_sgd<kFirst, kNesterov>(rule, param[i], grad[i], kMomentum ? buf + i : nullptr);
}

template <bool kMomentum>
void sgd_cpu(const optim::SgdRule& rule, float* param, const float* grad, float* buf, int64_t n) {
  if (!kMomentum) return sgd_loop<false, false, false>(rule, param, grad, buf, n);
  if (rule.first) {
    return rule.nesterov ? sgd_loop<kMomentum, true, true>(rule, param, grad, buf, n)
                         : sgd_loop<kMomentum, true, false>(rule, param, grad, buf, n);
  }
  return rule.nesterov ? sgd_loop<kMomentum, false, true>(rule, param, grad, buf, n)
                       : sgd_loop<kMomentum, false, false>(rule, param, grad, buf, n);
}

void sgd_multi_tensor(const optim::MtLaunch& launch, const std::vector<optim::SgdRule>& rules) {
  TNT_CUDA_DISPATCH(launch.device,
                    cuda::multi_tensor_sgd(launch, rules.data(), static_cast<int>(rules.size())));
  TNT_THROW("SGD: a multi-tensor step for parameters on {}: only CUDA has one", launch.device.str());
}

}  // namespace

SGD::SGD(SchedulePtr schedule, SgdOptions options)
    : Optimizer(std::move(schedule)), options_(std::move(options)) {
  TNT_CHECK(options_.momentum >= 0, "SGD: momentum must be >= 0, got {}", options_.momentum);
  TNT_CHECK(options_.weight_decay >= 0, "SGD: weight_decay must be >= 0, got {}", options_.weight_decay);
  TNT_CHECK(!options_.nesterov || (options_.momentum > 0 && options_.dampening == 0),
            "SGD: nesterov needs momentum > 0 and dampening 0 (momentum={}, dampening={})",
            options_.momentum, options_.dampening);
  decay_filter_ = options_.decay_filter;
  set_clipping(options_.clipping);
}

SGD::SGD(double lr, SgdOptions options)
    : SGD(std::make_shared<ConstantSchedule>(lr), std::move(options)) {}

std::string SGD::describe() const {
  return fmt::format("SGD(lr={}, momentum={}, dampening={}, weight_decay={}, nesterov={}{})",
                     schedule().describe(), options_.momentum, options_.dampening,
                     options_.weight_decay, options_.nesterov, clipping_suffix());
}

std::vector<std::string> SGD::slot_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(Parameter& param, ParamState& state, double lr, bool decay) {
  Tensor& p = param.value;
  TNT_CHECK(p.dtype() == DType::f32, "SGD: parameter '{}' is {}; the update kernels take f32",
            state.name, dtype_name(p.dtype()));
  const bool first = param_step(state) == 1;
  float* buf = state.slots.empty() ? nullptr : state.slots[0].data<float>();
  const optim::SgdRule rule = optim::sgd_rule(lr, options_.momentum, options_.dampening,
                                              decay ? options_.weight_decay : 0.0, options_.nesterov, first);
  TNT_CUDA_DISPATCH(p.device(),
                    cuda::sgd_update(rule, p.data<float>(), param.grad.data<float>(), buf, p.numel(), p.device().index));
  if (buf != nullptr) {
    sgd_cpu<true>(rule, p.data<float>(), param.grad.data<float>(), buf, p.numel());
  } else {
    sgd_cpu<false>(rule, p.data<float>(), param.grad.data<float>(), nullptr, p.numel());
  }
}

// The rules of update() for each class of parameters (decay or not, first update or not),
// in one launch.
bool SGD::update_multi_tensor(const optim::MultiTensorStep& step, double lr) {
  std::vector<optim::SgdRule> rules;
  for (const optim::RuleClass& c : step.classes) {
    rules.push_back(optim::sgd_rule(lr, options_.momentum, options_.dampening, c.decay ? options_.weight_decay : 0.0,
                                    options_.nesterov, c.t == 1));
  }
  sgd_multi_tensor(step.launch, rules);
  return true;
}

}  // namespace tnt
