#include "scaled_tanh.hpp"

#include <cmath>

// Called once, by ensure_built, with the shapes of the first inputs.
void ScaledTanh::build(const std::vector<tnt::Shape>&) { add_parameter("alpha", {1}, tnt::Initializer::ones()); }

std::vector<tnt::Tensor> ScaledTanh::forward(const std::vector<tnt::Tensor>& inputs, const tnt::RunContext&,
                                             tnt::SavedState& saved) {
  check_inputs(inputs, 1);  // one defined f32 input on this layer's device
  ensure_built({inputs[0].shape()});
  const tnt::Tensor& x = inputs[0];
  saved.tensors = {x};
  if (x.device().is_cuda()) {
#ifdef EXAMPLE_WITH_CUDA
    return {scaled_tanh_forward_cuda(x, alpha().value)};
#else
    TNT_THROW("ScaledTanh '{}': this program was built without the layer's CUDA engine", name());
#endif
  }
  tnt::Tensor y = tnt::Tensor::empty(x.shape());
  const float a = alpha().value.data<float>()[0];
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) ys[i] = a * std::tanh(xs[i]);
  return {y};
}

std::vector<tnt::Tensor> ScaledTanh::backward(const std::vector<tnt::Tensor>& grad_outputs, const tnt::RunContext&,
                                              tnt::SavedState& saved) {
  const tnt::Tensor& x = saved.tensors.at(0);
  const tnt::Tensor& dy = grad_outputs.at(0);
  if (x.device().is_cuda()) {
#ifdef EXAMPLE_WITH_CUDA
    return {scaled_tanh_backward_cuda(x, dy, alpha().value, alpha().grad)};
#else
    TNT_THROW("ScaledTanh '{}': this program was built without the layer's CUDA engine", name());
#endif
  }
  tnt::Tensor dx = tnt::Tensor::empty(x.shape());
  const float a = alpha().value.data<float>()[0];
  const float* xs = x.data<float>();
  const float* g = dy.data<float>();
  float* d = dx.data<float>();
  double da = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float t = std::tanh(xs[i]);
    d[i] = g[i] * a * (1.0f - t * t);
    da += static_cast<double>(g[i]) * t;
  }
  alpha().grad.data<float>()[0] += static_cast<float>(da);  // gradients accumulate (+=)
  return {dx};
}
