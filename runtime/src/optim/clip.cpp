// Gradient clipping (optim.hpp): by norm per tensor or over all gradients, then by value.
// Norms are sums of squares in double in a fixed order (on the CPU ops::sum_squares; on CUDA
// chunk by chunk, optim_cuda.cu, the same sums per tensor as the multi-tensor path), so ranks
// that hold bitwise-equal gradients on like devices compute the same factor and clip alike. A
// gradient within its threshold is not touched at all: clipping that does not bite leaves
// the step bit for bit as without it. A step whose tensors form a multi-tensor table
// (Optimizer::step) clips them all in the launches of cuda::multi_tensor_clip instead.
#include "optim/clip.hpp"

#include "backend/dispatch.hpp"
#include "optim/optim_cuda.hpp"
#include "optim/update_rules.hpp"
#include "tarantella/check.hpp"
#include "tarantella/ops.hpp"

#include <fmt/format.h>

#include <cmath>

namespace tnt {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // see sgd.cpp

void clip_value(const Tensor& grad, double limit) {
  TNT_CHECK(grad.dtype() == DType::f32, "gradient clipping takes f32 gradients, got {}", grad.str());
  const float v = static_cast<float>(limit);
  float* g = grad.data<float>();  // (n)
  const int64_t n = grad.numel();
  TNT_CUDA_DISPATCH(grad.device(), cuda::clip_value(g, v, n, grad.device().index));
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) g[i] = optim::clip_value(g[i], v);
}

double squares_of(const Tensor& grad) {
  TNT_CHECK(!grad.device().is_cuda() || grad.dtype() == DType::f32,
            "gradient clipping on CUDA takes f32 gradients, got {}", grad.str());
  TNT_CUDA_DISPATCH(grad.device(), cuda::sum_squares_chunked(grad.data<float>(), grad.numel(), optim::kChunkElements,
                                                             grad.device().index));
  return ops::sum_squares(grad);
}

// Scales by limit / norm when norm exceeds limit. A non-finite norm is left alone: the loss
// scaler (or TerminateOnNaN) deals with a diverged step, and scaling by 0 would hide it.
void clip_to_norm(const std::vector<Tensor>& grads, double norm, double limit) {
  if (!(norm > limit) || !std::isfinite(norm)) return;
  for (const Tensor& g : grads) ops::scale(g, limit / norm);
}

std::string opt_str(const char* name, const std::optional<double>& v) {
  return v ? fmt::format("{}={}", name, *v) : std::string();
}

}  // namespace

std::string GradientClipping::describe() const {
  std::string out;
  for (const std::string& part : {opt_str("clip_value", value), opt_str("clip_norm", norm),
                                  opt_str("clip_global_norm", global_norm)}) {
    if (part.empty()) continue;
    out += (out.empty() ? "" : ", ") + part;
  }
  return out;
}

void check_clipping(const GradientClipping& c) {
  // !(x > 0) also refuses NaN.
  TNT_INPUT_CHECK(!c.value || *c.value > 0, "gradient clipping: clip value {} must be positive", *c.value);
  TNT_INPUT_CHECK(!c.norm || *c.norm > 0, "gradient clipping: clip norm {} must be positive", *c.norm);
  TNT_INPUT_CHECK(!c.global_norm || *c.global_norm > 0, "gradient clipping: clip global norm {} must be positive",
                  *c.global_norm);
  TNT_INPUT_CHECK(!(c.norm && c.global_norm),
                  "gradient clipping: clip norm ({}) and clip global norm ({}) are both given; choose one", *c.norm,
                  *c.global_norm);
}

void clip_gradients(const GradientClipping& c, const std::vector<Tensor>& grads) {
  if (c.norm) {
    for (const Tensor& g : grads) clip_to_norm({g}, std::sqrt(squares_of(g)), *c.norm);
  }
  if (c.global_norm) {
    double squares = 0;
    for (const Tensor& g : grads) squares += squares_of(g);
    clip_to_norm(grads, std::sqrt(squares), *c.global_norm);
  }
  if (c.value) {
    for (const Tensor& g : grads) clip_value(g, *c.value);
  }
}

void clip_gradients(const GradientClipping& c, const optim::MtLaunch& launch) {
  TNT_CHECK(launch.device.is_cuda(), "multi-tensor clipping of gradients on {}: only CUDA has it", launch.device.str());
  TNT_CUDA_DISPATCH(launch.device, cuda::multi_tensor_clip(launch, {c.value, c.norm, c.global_norm}));
}

}  // namespace tnt
