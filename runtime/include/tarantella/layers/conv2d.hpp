// 2-D convolution (cross-correlation, as every framework), NCHW:
// (N, C, H, W) -> (N, F, Ho, Wo), Ho = (H + 2 padding - kernel) / stride + 1.
// Square kernel, stride and symmetric zero padding; weight (F, C, k, k), bias (F,).
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

struct Conv2DOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();  // Keras' default
  Initializer bias_initializer = Initializer::zeros();
};

class Conv2D : public Layer {
 public:
  Conv2D(int64_t filters, int64_t kernel_size, Conv2DOptions options = {}, std::string name = "");
  Conv2D(int64_t filters, int64_t kernel_size, std::string name)
      : Conv2D(filters, kernel_size, Conv2DOptions{}, std::move(name)) {}

  std::string type() const override { return "Conv2D"; }
  bool supports_memory_format(MemoryFormat) const override { return true; }  // produces rc.memory_format
  bool cpu_computes_in(DType dtype) const override;  // f32, and bf16 where native_bf16 (oneDNN)
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  void build(const std::vector<Shape>& input_shapes) override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;

  int64_t filters() const { return filters_; }
  int64_t in_channels() const { return in_channels_; }  // known once built
  int64_t kernel_size() const { return kernel_; }
  int64_t stride() const { return options_.stride; }
  int64_t padding() const { return options_.padding; }
  bool use_bias() const { return options_.use_bias; }
  const Conv2DOptions& options() const { return options_; }  // as given (model files save them)
  Parameter& weight() { return *weight_; }  // (F, C, k, k)
  Parameter* bias() { return bias_; }       // (F,); nullptr without bias

 private:
  int64_t filters_;
  int64_t kernel_;
  int64_t in_channels_ = 0;
  Conv2DOptions options_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
};

}  // namespace tnt
