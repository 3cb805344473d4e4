// Batch normalisation over axis 1 of (N, C) or (N, C, H, W).
// Training: normalise with the batch mean and biased variance, and update the running
// averages in PyTorch's convention: running = (1 - momentum) * running + momentum * batch,
// running_var from the UNBIASED batch variance. Keras' momentum m is 1 - m here (Keras'
// default 0.99 is 0.01 here; PyTorch's default 0.1 is ours). Inference: the running
// averages. Statistics are local to each rank (as in Tarantella).
// Parameters weight (gamma), bias (beta); buffers running_mean, running_var (all (C,)).
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

struct BatchNormOptions {
  double momentum = 0.1;  // PyTorch's default
  double epsilon = 1e-5;
  bool affine = true;     // with weight and bias
  Initializer weight_initializer = Initializer::ones();
  Initializer bias_initializer = Initializer::zeros();
};

class BatchNorm : public Layer {
 public:
  explicit BatchNorm(BatchNormOptions options = {}, std::string name = "");
  explicit BatchNorm(std::string name) : BatchNorm(BatchNormOptions{}, std::move(name)) {}

  std::string type() const override { return "BatchNorm"; }
  bool supports_memory_format(MemoryFormat) const override { return true; }  // keeps its input's format
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  void build(const std::vector<Shape>& input_shapes) override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;

  // What forward does before its engine runs: checks x, builds the layer, counts a training
  // pass. The fused chains' engine call (layers/batch_norm_fusion.cpp) runs it too.
  void begin_forward(const Tensor& x, const RunContext& rc);
  double momentum() const { return options_.momentum; }
  double epsilon() const { return options_.epsilon; }
  bool affine() const { return options_.affine; }
  const BatchNormOptions& options() const { return options_; }  // as given (model files save them)
  int64_t num_features() const { return num_features_; }  // C, known once built
  Parameter* weight() { return weight_; }  // (C,); nullptr when not affine
  Parameter* bias() { return bias_; }      // (C,); nullptr when not affine
  Parameter& running_mean() { return *running_mean_; }  // (C,)
  Parameter& running_var() { return *running_var_; }    // (C,)
  // () i64: training forward passes so far, as PyTorch's buffer of the same name (so a
  // checkpoint loads strictly into torch.nn.BatchNorm2d). It stays in host memory on every
  // device: counting on the host costs nothing, reading it from a GPU would cost a sync.
  Parameter& num_batches_tracked() { return *num_batches_tracked_; }
  void to(Device device) override;

 private:
  BatchNormOptions options_;
  int64_t num_features_ = 0;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  Parameter* running_mean_ = nullptr;
  Parameter* running_var_ = nullptr;
  Parameter* num_batches_tracked_ = nullptr;
};

}  // namespace tnt
