// (N, d1, d2, ...) -> (N, d1 * d2 * ...). A reshape: no copy, any device.
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

class Flatten : public Layer {
 public:
  explicit Flatten(std::string name = "");
  std::string type() const override { return "Flatten"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
};

}  // namespace tnt
