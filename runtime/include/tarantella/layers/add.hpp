// Element-wise sum of two or more inputs of one shape (residual connections). Any device
// (through tarantella/ops.hpp).
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

class Add : public Layer {
 public:
  explicit Add(std::string name = "");
  std::string type() const override { return "Add"; }
  bool supports_memory_format(MemoryFormat) const override { return true; }  // the first input's format
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

}  // namespace tnt
