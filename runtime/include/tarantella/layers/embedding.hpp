// Embedding with shared weights (TensorFlow Model Garden's EmbeddingSharedWeights): ONE
// (vocab, hidden) matrix W that both looks tokens up and projects back onto the vocabulary.
// The mode of a call follows the dtype of its input:
//   ids (i32 or i64) (B, T)       -> y (B, T, hidden) = W[id] * sqrt(hidden), and 0 where
//                                    id == 0 (padding), as TF multiplies by (ids != 0)
//   x (floating) (..., hidden)    -> logits (..., vocab) = x W^T (no bias)
// Call the same layer object at every place (encoder ids, decoder ids, decoder output): the
// graph keeps one SavedState per call, the weight's gradient is the sum over the calls, and
// its gradient hook fires once, after the last backward (graph.hpp). The checkpoint name is
// "<name>.weight", (vocab, hidden) as PyTorch's nn.Embedding, whose matrix a tied
// nn.Linear(hidden, vocab, bias=False) shares.
// Initialisation: N(0, hidden^-0.5) (the Model Garden's). Ids outside [0, vocab) are an
// InputError naming the id. Ids get no gradient.
#pragma once

#include "tarantella/layer.hpp"

namespace tnt {

class Embedding : public Layer {
 public:
  Embedding(int64_t vocab_size, int64_t hidden_size, std::string name = "");

  std::string type() const override { return "Embedding"; }
  // Without dtypes the shape is taken as that of an id tensor (lookup).
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  std::vector<Shape> output_shapes_for(const std::vector<Shape>& input_shapes,
                                       const std::vector<DType>& input_dtypes) const override;
  void build(const std::vector<Shape>& input_shapes) override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;

  int64_t vocab_size() const { return vocab_; }
  int64_t hidden_size() const { return hidden_; }
  double scale() const;       // sqrt(hidden): the factor of looked-up rows
  Parameter& weight();        // (vocab, hidden)

 private:
  int64_t vocab_;
  int64_t hidden_;
  Parameter* weight_ = nullptr;
};

}  // namespace tnt
