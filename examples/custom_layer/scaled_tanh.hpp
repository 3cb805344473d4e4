// A custom layer: y = alpha * tanh(x), with one trainable scalar alpha (PyTorch name
// "<layer>.alpha", shape [1]). Its CPU engine is in scaled_tanh.cpp, its CUDA engine in
// scaled_tanh_cuda.cu; forward and backward pick the engine by the device of the input.
#pragma once

#include <tarantella/tarantella.hpp>

class ScaledTanh : public tnt::Layer {
 public:
  explicit ScaledTanh(std::string name = "") : tnt::Layer(std::move(name)) { default_name("scaled_tanh"); }
  std::string type() const override { return "ScaledTanh"; }
  std::vector<tnt::Shape> output_shapes(const std::vector<tnt::Shape>& in) const override { return {in.at(0)}; }
  void build(const std::vector<tnt::Shape>& in) override;
  std::vector<tnt::Tensor> forward(const std::vector<tnt::Tensor>& inputs, const tnt::RunContext& rc,
                                   tnt::SavedState& saved) override;
  std::vector<tnt::Tensor> backward(const std::vector<tnt::Tensor>& grad_outputs, const tnt::RunContext& rc,
                                    tnt::SavedState& saved) override;
  tnt::Parameter& alpha() { return *params_.at(0); }
};

// The CUDA engine (scaled_tanh_cuda.cu). Same contract as the CPU code: forward keeps x for
// backward; backward returns dx and ADDS to alpha's gradient.
tnt::Tensor scaled_tanh_forward_cuda(const tnt::Tensor& x, const tnt::Tensor& alpha);
tnt::Tensor scaled_tanh_backward_cuda(const tnt::Tensor& x, const tnt::Tensor& dy, const tnt::Tensor& alpha,
                                      tnt::Tensor& alpha_grad);
