// Multi-head attention (the Transformer's; TensorFlow Model Garden's Attention with
// PyTorch-style names). Inputs, by count and dtype:
//   {x}                      self-attention, no padding mask (the decoder's, causal)
//   {x, key_ids}             self-attention, keys j with key_ids[b, j] == 0 are padding
//   {x, memory}              encoder-decoder attention, no padding mask
//   {x, memory, key_ids}     encoder-decoder attention with the source's padding mask
// x (B, Tq, D), memory (B, Tk, D) floating, key_ids (B, Tk) i32 or i64 (the token ids of the
// keys' sequence; PAD = 0). Output (B, Tq, D).
//
//   q = x Wq^T, k = m Wk^T, v = m Wv^T         (Dense children without bias)
//   per head h (depth d = D / heads): logits = (q_h d^-0.5) k_h^T + bias,
//     bias = -1e9 where key j is padding, or j > i + (Tk - Tq) when causal (added in float,
//     as TensorFlow adds its attention bias: a fully masked row is uniform only while its
//     logits differ by less than the float spacing at 1e9, about 64; beyond, its largest
//     logits win, as in TensorFlow)
//   p = softmax(logits); in training, dropout on p (Philox, keyed on the run's seed, the
//     layer's name, the step and the global sample index, as Dropout is: p ranks draw what
//     one rank draws); o_h = p v_h; y = concat_h(o_h) Wo^T.
// Parameters: "<name>.q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight",
// each (D, D) as PyTorch's nn.Linear(D, D, bias=False) stores it (out, in); glorot_uniform.
//
// Incremental decoding (beam search with a key/value cache; inference only, no dropout,
// nothing kept for a backward) uses the same weights and the same core engines through
// three more entry points: project() turns a memory into projected keys and values once
// (encoder-decoder attention: once per source batch); step() appends one new position's
// keys and values to a self-attention cache, its rows first reordered (each row continues
// a parent row of the previous step, as beam search reorders its beams), and attends the
// new position over the whole cache; attend() attends queries over a cache. No causal mask
// is needed: the cache holds only the past and the new position.
#pragma once

#include "tarantella/layer.hpp"
#include "tarantella/layers/dense.hpp"

#include <memory>
#include <vector>

namespace tnt {

struct MultiHeadAttentionOptions {
  int64_t num_heads = 8;
  double dropout = 0.0;  // on the attention probabilities, in training
  bool causal = false;   // query i sees keys j <= i + (Tk - Tq)
};

// Projected keys and values for incremental decoding: k = m Wk^T, v = m Wv^T, each (B, T, D)
// on the layer's device, the layout the core takes. Empty (T = 0) before the first step.
struct AttentionCache {
  Tensor k, v;
  int64_t length() const { return k.defined() ? k.dim(1) : 0; }
};

class MultiHeadAttention : public Layer {
 public:
  MultiHeadAttention(int64_t hidden_size, MultiHeadAttentionOptions options = {}, std::string name = "");

  std::string type() const override { return "MultiHeadAttention"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const override;
  void build(const std::vector<Shape>& input_shapes) override;
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              SavedState& saved) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               SavedState& saved) override;

  int64_t hidden_size() const { return hidden_; }
  int64_t num_heads() const { return options_.num_heads; }
  int64_t depth() const { return hidden_ / options_.num_heads; }
  double dropout() const { return options_.dropout; }
  bool causal() const { return options_.causal; }
  // The Philox key of this step's attention-dropout mask.
  uint64_t dropout_key(const RunContext& rc) const;
  Dense& q_proj() { return *q_; }
  Dense& k_proj() { return *k_; }
  Dense& v_proj() { return *v_; }
  Dense& out_proj() { return *o_; }

  // Incremental decoding (see the top of the file); rc.training must be false.
  // memory (B, Tk, D) -> its keys and values (B, Tk, D).
  AttentionCache project(const Tensor& memory, const RunContext& rc);
  // x (B, 1, D), one new position per row. Row b of the new cache is row parents[b] of the
  // old one (0 <= parents[b] < the old row count; parents empty keeps the rows as they are;
  // ignored while the cache is empty) followed by x's keys and values, so the cache grows to
  // (B, T + 1, D): a new tensor, written once (as much work as the attention over it). The
  // result is the attention of x over all T + 1 positions, (B, 1, D), as the causal
  // forward() gives at the last position of the whole sequence.
  Tensor step(const Tensor& x, AttentionCache& cache, const std::vector<int64_t>& parents, const RunContext& rc);
  // x (B, Tq, D) over a cache (B, Tk, D), keys j with key_ids[b, j] == 0 masked when key_ids
  // (B, Tk) is defined; no causal mask. -> (B, Tq, D).
  Tensor attend(const Tensor& x, const AttentionCache& cache, const Tensor& key_ids, const RunContext& rc);

 private:
  // Incremental entry points: inference, x floating (B, T, hidden) on the layer's device.
  void check_incremental(const Tensor& x, const RunContext& rc, const char* what);

  int64_t hidden_;
  MultiHeadAttentionOptions options_;
  std::shared_ptr<Dense> q_, k_, v_, o_;
};

}  // namespace tnt
