// Element-wise and normalising activations: ReLU, GELU, Softmax (along one axis).
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

// y = max(x, 0); the gradient at x == 0 is 0 (PyTorch's and oneDNN's choice).
class ReLU : public Layer {
 public:
  explicit ReLU(std::string name = "");
  std::string type() const override { return "ReLU"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

// GELU. approximate (the default, TensorFlow's gelu(approximate=True) and PyTorch's
// gelu(approximate='tanh')): y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
// exact (PyTorch's default): y = x/2 (1 + erf(x / sqrt(2))). Computed in float.
class GELU : public Layer {
 public:
  explicit GELU(bool approximate = true, std::string name = "");
  explicit GELU(std::string name) : GELU(true, std::move(name)) {}
  std::string type() const override { return "GELU"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
  bool approximate() const { return approximate_; }

 private:
  bool approximate_;
};

// y = exp(x - max) / sum(exp(x - max)) along `axis` (negative counts from the end).
// Backward: dx = y * (dy - sum(dy * y)) along the axis.
class Softmax : public Layer {
 public:
  explicit Softmax(int64_t axis = -1, std::string name = "");
  explicit Softmax(std::string name) : Softmax(-1, std::move(name)) {}
  std::string type() const override { return "Softmax"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
  int64_t axis() const { return axis_; }  // as given (may be negative)

 private:
  int64_t axis_;
};

}  // namespace tnt
