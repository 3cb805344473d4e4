// Layer normalisation over the last axis (PyTorch's nn.LayerNorm(D, eps), TensorFlow's
// LayerNormalization(axis=-1)): for each row x of D values,
//   y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias,   var the biased variance,
// with weight (gamma, ones) and bias (beta, zeros) of shape (D). Default eps 1e-6 (the
// Transformer's). Inputs (..., D): (B, T, D) for sequences, (N, D) for vectors.
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

class LayerNorm : public Layer {
 public:
  explicit LayerNorm(double eps = 1e-6, std::string name = "");
  explicit LayerNorm(std::string name) : LayerNorm(1e-6, std::move(name)) {}

  std::string type() const override { return "LayerNorm"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  void build(const std::vector<Shape>& input_shapes) override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;

  double eps() const { return eps_; }
  int64_t features() const { return features_; }  // D, known once built
  Parameter& weight() { return *weight_; }          // (D)
  Parameter& bias() { return *bias_; }              // (D)

 private:
  double eps_;
  int64_t features_ = 0;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
};

}  // namespace tnt
