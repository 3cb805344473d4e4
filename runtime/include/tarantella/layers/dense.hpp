// Dense (PyTorch's Linear): y = x W^T + b over the last axis, (..., in) -> (..., units).
// Leading axes are flattened into rows, so the same layer serves (N, D) and (B, T, D).
// As Keras' Dense it may apply an activation to the product, and a dropout after it: the
// same values as Dense -> ReLU -> Dropout (bit for bit; the dropout's mask is the one a
// Dropout layer with this layer's name draws), in one pass over the product on a GPU and
// with only the output kept for the backward (no mask, no activation input).
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

// What Dense applies to x W^T + b: nothing (Keras' "linear"), or ReLU (y = v > 0 ? v : 0).
enum class DenseActivation { linear, relu };

struct DenseOptions {
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();  // Keras' default
  Initializer bias_initializer = Initializer::zeros();
  DenseActivation activation = DenseActivation::linear;
  // Dropout on the activation's output while training, rate in [0, 1); 0: none.
  double dropout = 0.0;
};

// "linear" or "relu" (model files), and back; an unknown name throws, naming it.
const char* dense_activation_name(DenseActivation a);
DenseActivation dense_activation_from_name(const std::string& name);

class Dense : public Layer {
 public:
  explicit Dense(int64_t units, DenseOptions options = {}, std::string name = "");
  Dense(int64_t units, std::string name) : Dense(units, DenseOptions{}, std::move(name)) {}

  std::string type() const override { return "Dense"; }
  bool cpu_computes_in(DType dtype) const override;  // f32, and bf16 where native_bf16 (oneDNN)
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  void build(const std::vector<Shape>& input_shapes) override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;

  int64_t units() const { return units_; }
  int64_t in_features() const { return in_features_; }  // known once built
  bool use_bias() const { return options_.use_bias; }
  const DenseOptions& options() const { return options_; }  // as given (model files save them)
  Parameter& weight() { return *weight_; }  // (units, in)
  Parameter* bias() { return bias_; }       // (units,); nullptr without bias

 private:
  int64_t units_;
  int64_t in_features_ = 0;
  DenseOptions options_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
};

}  // namespace tnt
