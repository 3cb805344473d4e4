#include "tarantella/optim.hpp"

#include "optim/optim_cuda.hpp"

#include <fmt/format.h>

#include <cmath>

namespace tnt {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // see sgd.cpp

void adam_cpu(float* param, const float* grad, float* m, float* v, int64_t n, float beta1,
              float omb1, float beta2, float omb2, float eps, float l2, float decay_factor, float step_size,
              float inv_sqrt_bc2) {
  // param, grad, m, v: (n,)
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float p = param[i] * decay_factor;
    const float g = grad[i] + l2 * p;
    const float mi = beta1 * m[i] + omb1 * g;
    const float vi = beta2 * v[i] + omb2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
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
}

Adam::Adam(SchedulePtr schedule, AdamOptions options) : Adam(std::move(schedule), std::move(options), false) {}

Adam::Adam(double lr, AdamOptions options)
    : Adam(std::make_shared<ConstantSchedule>(lr), std::move(options), false) {}

AdamW::AdamW(SchedulePtr schedule, AdamOptions options) : Adam(std::move(schedule), std::move(options), true) {}

AdamW::AdamW(double lr, AdamOptions options)
    : Adam(std::make_shared<ConstantSchedule>(lr), std::move(options), true) {}

std::string Adam::describe() const {
  return fmt::format("{}(lr={}, betas=({}, {}), eps={}, weight_decay={})", type(),
                     schedule().describe(), options_.beta1, options_.beta2, options_.eps,
                     options_.weight_decay);
}

void Adam::update(Parameter& param, ParamState& state, double lr, bool decay) {
  Tensor& p = param.value;
  TNT_CHECK(p.dtype() == DType::f32, "{}: parameter '{}' is {}; the update kernels take f32", type(),
            state.name, dtype_name(p.dtype()));
  const double t = static_cast<double>(param_step(state));
  const double wd = decay ? options_.weight_decay : 0.0;
  const float l2 = decoupled_ ? 0.0f : static_cast<float>(wd);
  const float decay_factor = decoupled_ ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(options_.beta1, t)));
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(options_.beta2, t)));
  const float b1 = static_cast<float>(options_.beta1);
  const float b2 = static_cast<float>(options_.beta2);
  // 1 - beta in double, then rounded: 1.0f - 0.999f would be off by 1.3e-5 relative.
  const float omb1 = static_cast<float>(1.0 - options_.beta1);
  const float omb2 = static_cast<float>(1.0 - options_.beta2);
  const float eps = static_cast<float>(options_.eps);
  if (p.device().is_cpu()) {
    adam_cpu(p.data<float>(), param.grad.data<float>(), state.slots[0].data<float>(),
             state.slots[1].data<float>(), p.numel(), b1, omb1, b2, omb2, eps, l2, decay_factor, step_size,
             inv_sqrt_bc2);
    return;
  }
#ifdef TNT_WITH_CUDA
  cuda::adam_update(p.data<float>(), param.grad.data<float>(), state.slots[0].data<float>(),
                    state.slots[1].data<float>(), p.numel(), b1, omb1, b2, omb2, eps, l2, decay_factor,
                    step_size, inv_sqrt_bc2, p.device().index);
#else
  TNT_THROW("{}: parameter '{}' is on {}, but this build has no CUDA", type(), state.name,
            p.device().str());
#endif
}

}  // namespace tnt
