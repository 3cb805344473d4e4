// Inverted dropout: in training, element i is kept (and scaled by 1 / (1 - rate)) when
// philox::uniform4(mask_key(rc), mask_counter(rc, shape) + i) >= float(rate) (word c % 4 of
// Philox block c / 4, one block drawn per four counters); in inference
// it is the identity. The mask depends on (seed, layer name, step, global sample index)
// only: the same on CPU and GPU, and p ranks draw the masks 1 rank would draw.
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

class Dropout : public Layer {
 public:
  explicit Dropout(double rate, std::string name = "");
  std::string type() const override { return "Dropout"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;

  double rate() const { return rate_; }
  // The Philox key of this step's mask: CounterRng(rc.seed, "<name>/dropout/<step>").key().
  uint64_t mask_key(const RunContext& rc) const;
  // Counter of the first element of this rank's input: rc.sample_offset * (numel / N).
  static uint64_t mask_counter(const RunContext& rc, const Shape& input_shape);

 private:
  double rate_;
};

}  // namespace tnt
