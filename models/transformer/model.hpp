// The Transformer of TensorFlow Model Garden's transformer v2 (the tutorial's), built from
// the runtime's layers with PyTorch-style parameter names; scripts/transformer_torch.py is
// the PyTorch module of the same structure and names, so a checkpoint loads into it.
//
//   encode(src):  x = dropout(embedding(src) + P);  per layer:
//                   x = x + dropout(self_attn(self_attn_norm(x), src ids))      (padding mask)
//                   x = x + dropout(ffn(ffn_norm(x)))
//                 memory = encoder.norm(x)
//   decode(tgt_in, memory, src): y = dropout(embedding(tgt_in) + P);  per layer:
//                   y = y + dropout(self_attn(self_attn_norm(y)))               (causal)
//                   y = y + dropout(cross_attn(cross_attn_norm(y), memory, src)) (padding)
//                   y = y + dropout(ffn(ffn_norm(y)))
//                 logits = embedding(decoder.norm(y))   (the shared matrix, x W^T)
//   ffn(x) = linear2(dropout(relu(linear1(x))))   (linear1 does ReLU and dropout itself)
//
// Parameter names: embedding.weight (V, D); encoder.layers.<i>.{self_attn_norm, ffn_norm}.
// {weight, bias}; encoder.layers.<i>.self_attn.{q_proj, k_proj, v_proj, out_proj}.weight;
// encoder.layers.<i>.ffn.{linear1, linear2}.{weight, bias}; encoder.norm.{weight, bias};
// decoder.layers.<i> as the encoder's plus cross_attn_norm and cross_attn; decoder.norm.
// The decoder input is the target shifted right (a 0 first, the last token dropped); the
// data pipeline makes it.
//
// Incremental decoding (start_decoding, decode_step) computes decode() one position at a
// time over the same layers: per decoder layer the self-attention keeps the keys and values
// of the positions so far (tnt::AttentionCache) and attends the new position over them; the
// encoder-decoder attention's keys and values of the memory are projected once. Dropout is
// the identity there (inference), so it is skipped.
#pragma once

#include <tarantella/graph.hpp>
#include <tarantella/layers.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tnt_models {

// The Model Garden's params (model_params.py), by the names of its flags.
struct TransformerParams {
  int64_t vocab_size = 33708;
  int64_t hidden_size = 512;
  int64_t num_hidden_layers = 6;
  int64_t num_heads = 8;
  int64_t filter_size = 2048;
  double layer_postprocess_dropout = 0.1;
  double attention_dropout = 0.1;
  double relu_dropout = 0.1;
  double label_smoothing = 0.1;
  double learning_rate = 2.0;
  int64_t learning_rate_warmup_steps = 16000;
  double optimizer_adam_beta1 = 0.9;
  double optimizer_adam_beta2 = 0.997;
  double optimizer_adam_epsilon = 1e-9;
  int64_t max_length = 256;
  int64_t extra_decode_length = 50;
  int64_t beam_size = 4;
  double alpha = 0.6;
};

// "tiny" (hidden 32, 4 heads, filter 256), "base" (512, 8, 2048) or "big" (1024, 16, 4096);
// 6 + 6 layers each. Anything else is an InputError naming the three.
TransformerParams transformer_params(const std::string& param_set);

// The parameters of the model these params make (what Network::parameter_count() reports
// once it is built), counted without building it: the shared [vocab, hidden] embedding;
// per encoder layer self-attention (4 hidden^2, no bias), the FFN (two Dense with bias) and
// two LayerNorms; per decoder layer also the encoder-decoder attention and a third
// LayerNorm; a final LayerNorm per stack.
int64_t transformer_parameter_count(const TransformerParams& p);

class Transformer {
 public:
  explicit Transformer(const TransformerParams& params);

  // src_ids (B, S) i64 -> memory (B, S, D).
  tnt::SymTensor encode(const tnt::SymTensor& src_ids);
  // decoder_ids (B, T) i64, memory (B, S, D), src_ids (B, S) -> logits (B, T, V).
  tnt::SymTensor decode(const tnt::SymTensor& decoder_ids, const tnt::SymTensor& memory,
                        const tnt::SymTensor& src_ids);
  // Inputs: source ids (B, source_length), decoder input ids (B, target_length), both i64;
  // output: logits (B, target_length, V). Every network made by one Transformer shares its
  // layers (its weights).
  std::shared_ptr<tnt::Network> training_network(int64_t source_length, int64_t target_length,
                                                  const std::string& name = "transformer");

  // For decoding (beam search), over the same layers: src ids (B, S) -> memory (B, S, D);
  // and {decoder ids (B, T), memory (B, S, D) f32, src ids (B, S)} -> logits (B, T, V).
  // The decoder's self-attention is causal, so the logits at position t depend only on
  // decoder ids 0..t: a prefix padded to T gives the prefix's next-token logits at its end.
  std::shared_ptr<tnt::Network> encoder_network(int64_t source_length, const std::string& name = "encoder");
  std::shared_ptr<tnt::Network> decoder_network(int64_t source_length, int64_t target_length,
                                                const std::string& name = "decoder");

  // The state of incremental decoding for B rows (beam search: batch x beam).
  struct DecoderCache {
    std::vector<tnt::AttentionCache> self, cross;  // per decoder layer: (B, t, D), (B, S, D)
    tnt::Tensor src_ids;                           // (B, S): the padding mask of the memory
    int64_t length = 0;                            // positions decoded so far (t)
    tnt::Tensor positions;                         // position encoding table (>= t + 1, D), host
  };
  // memory (B, S, D) f32 and src ids (B, S), on rc.device: projects the memory into every
  // decoder layer's encoder-decoder keys and values. rc.training must be false.
  DecoderCache start_decoding(const tnt::Tensor& memory, const tnt::Tensor& src_ids, const tnt::RunContext& rc);
  // last_ids (B, 1) i64 on rc.device: the token at position t of every row; row b continues
  // row parents[b] of the previous step (empty: row b; ignored at t = 0). Parents must keep
  // a row's source: the encoder-decoder caches are not reordered. Returns the logits of
  // position t, (B, 1, V), what decode() gives at position t of the whole prefix.
  tnt::Tensor decode_step(DecoderCache& cache, const tnt::Tensor& last_ids, const std::vector<int64_t>& parents,
                          const tnt::RunContext& rc);

  const TransformerParams& params() const { return params_; }
  tnt::Embedding& embedding() { return *embedding_; }

 private:
  struct Block;  // one encoder or decoder layer's layers
  tnt::SymTensor sublayer(const tnt::SymTensor& x, const std::shared_ptr<tnt::Layer>& norm,
                          const std::shared_ptr<tnt::Layer>& dropout, const std::shared_ptr<tnt::Layer>& residual,
                          const std::function<tnt::SymTensor(const tnt::SymTensor&)>& body);
  tnt::SymTensor embed(const std::string& stack, const tnt::SymTensor& ids);

  TransformerParams params_;
  std::shared_ptr<tnt::Embedding> embedding_;
  std::vector<std::shared_ptr<Block>> encoder_, decoder_;
  std::shared_ptr<tnt::LayerNorm> encoder_norm_, decoder_norm_;
  std::shared_ptr<tnt::Layer> encoder_position_, decoder_position_, encoder_dropout_, decoder_dropout_;
};

}  // namespace tnt_models
