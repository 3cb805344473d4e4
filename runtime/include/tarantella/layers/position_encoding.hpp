// Sinusoidal position encoding as TensorFlow's Model Garden computes it (transformer v2's
// get_position_encoding), added to its input: x (B, T, D) -> x + P, P (T, D) with
//   n = D / 2 timescales, inc = ln(max_timescale / min_timescale) / max(n - 1, 1),
//   inv_k = min_timescale * exp(-k * inc), k = 0 .. n - 1,
//   P[t, k] = sin(t * inv_k),  P[t, n + k] = cos(t * inv_k)   (sin half, then cos half).
// Timescales from 1 to 1e4; D must be even. No parameters; dx = dy.
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

// The table P (T, D), f32 on the host, computed in double and rounded once.
Tensor position_encoding(int64_t length, int64_t hidden_size, double min_timescale = 1.0,
                         double max_timescale = 1.0e4);

class PositionEncoding : public Layer {
 public:
  explicit PositionEncoding(std::string name = "");

  std::string type() const override { return "PositionEncoding"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;
  // The table for (T, D) on device (cached per layer and engine; built on the host).
  const Tensor& table(int64_t length, int64_t hidden_size, Device device);
};

}  // namespace tnt
