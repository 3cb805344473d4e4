// Dense (PyTorch's Linear): y = x W^T + b over the last axis, (..., in) -> (..., units).
// Leading axes are flattened into rows, so the same layer serves (N, D) and (B, T, D).
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

struct DenseOptions {
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();  // Keras' default
  Initializer bias_initializer = Initializer::zeros();
};

class Dense : public Layer {
 public:
  explicit Dense(int64_t units, DenseOptions options = {}, std::string name = "");
  Dense(int64_t units, std::string name) : Dense(units, DenseOptions{}, std::move(name)) {}

  std::string type() const override { return "Dense"; }
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
