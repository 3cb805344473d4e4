// Element-wise and normalising activations: ReLU, GELU, Sigmoid, Tanh, LeakyReLU, Softmax
// (along one axis), and make_activation() to pick one by name.
//
// NaN and infinities. The piecewise ones choose their branch with the comparison x > 0, so a
// NaN takes the non-positive branch: ReLU's is the constant 0 (a NaN gives 0, gradient 0),
// LeakyReLU's is alpha * x (a NaN stays NaN, gradient alpha * dy). The smooth ones propagate
// a NaN in value and gradient, and saturate at the infinities: sigmoid(+-inf) = 1 and 0,
// tanh(+-inf) = +-1, both with gradient 0 there (never NaN).
#pragma once

#include "tarantella/layer.hpp"

#include <memory>
#include <string>

namespace tnt {

// A layer of one input whose output is computed element by element: the output has the
// input's shape, and the input's memory format is kept (Caffe's NeuronLayer). The
// activations below, and a program's own (examples/custom_layer), declare only their
// constructor, type() and the two passes.
class ElementwiseLayer : public Layer {
 public:
  using Layer::Layer;
  bool supports_memory_format(MemoryFormat) const override { return true; }
  // One input; the output's shape is its shape (a layer error naming type() and name otherwise).
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
};

// y = max(x, 0); the gradient at x == 0 is 0 (PyTorch's and oneDNN's choice).
class ReLU : public ElementwiseLayer {
 public:
  explicit ReLU(std::string name = "");
  std::string type() const override { return "ReLU"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

// GELU. approximate (the default, TensorFlow's gelu(approximate=True) and PyTorch's
// gelu(approximate='tanh')): y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
// exact (PyTorch's default): y = x/2 (1 + erf(x / sqrt(2))). Computed in float.
class GELU : public ElementwiseLayer {
 public:
  explicit GELU(bool approximate = true, std::string name = "");
  explicit GELU(std::string name) : GELU(true, std::move(name)) {}
  // GELU("gelu1"): a string literal would otherwise take the bool overload (a pointer
  // converts to bool before std::string) and the layer would lose its name.
  explicit GELU(const char* name) : GELU(true, std::string(name ? name : "")) {}
  std::string type() const override { return "GELU"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
  bool approximate() const { return approximate_; }

 private:
  bool approximate_;
};

// y = 1 / (1 + exp(-x)), computed as exp(x) / (1 + exp(x)) for x < 0 so that neither tail
// overflows; dy/dx = y (1 - y), from the saved output.
class Sigmoid : public ElementwiseLayer {
 public:
  explicit Sigmoid(std::string name = "");
  std::string type() const override { return "Sigmoid"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

// y = tanh(x); dy/dx = 1 - y^2, from the saved output.
class Tanh : public ElementwiseLayer {
 public:
  explicit Tanh(std::string name = "");
  std::string type() const override { return "Tanh"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

// y = x > 0 ? x : alpha x; the gradient at x == 0 is alpha (the x <= 0 branch, as ReLU's 0).
// alpha defaults to 0.3, the default of Keras' LeakyReLU layer (PyTorch's is 0.01: pass it
// to match a PyTorch model). alpha must be finite and >= 0 (an InputError otherwise).
class LeakyReLU : public ElementwiseLayer {
 public:
  static constexpr double kDefaultAlpha = 0.3;
  explicit LeakyReLU(double alpha = kDefaultAlpha, std::string name = "");
  explicit LeakyReLU(std::string name) : LeakyReLU(kDefaultAlpha, std::move(name)) {}
  std::string type() const override { return "LeakyReLU"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
  double alpha() const { return alpha_; }

 private:
  double alpha_;
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

// An activation layer by its name, for programs that take the activation as a flag:
// "relu", "gelu" (tanh form), "gelu_exact", "sigmoid", "tanh", "leaky_relu" (alpha 0.3),
// "softmax" (last axis). Another name is an InputError that lists these.
std::shared_ptr<Layer> make_activation(const std::string& activation, std::string name = "");

}  // namespace tnt
