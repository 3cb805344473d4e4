#include "model.hpp"

#include <tarantella/check.hpp>
#include <tarantella/ops.hpp>

#include <algorithm>
#include <cstring>
#include <functional>

namespace tnt_models {

TransformerParams transformer_params(const std::string& param_set) {
  TransformerParams p;  // base
  if (param_set == "base") return p;
  if (param_set == "tiny") {
    p.hidden_size = 32;
    p.num_heads = 4;
    p.filter_size = 256;
    return p;
  }
  if (param_set == "big") {
    p.hidden_size = 1024;
    p.num_heads = 16;
    p.filter_size = 4096;
    return p;
  }
  TNT_INPUT_ERROR("--param_set={}: expected tiny, base or big", param_set);
}

// The layers of one encoder or decoder layer (cross_* only in the decoder).
struct Transformer::Block {
  std::shared_ptr<tnt::Layer> self_attn_norm, self_attn, self_attn_dropout, self_attn_residual;
  std::shared_ptr<tnt::Layer> cross_attn_norm, cross_attn, cross_attn_dropout, cross_attn_residual;
  // linear1 applies the ReLU and the dropout after it (DenseOptions): one pass on a GPU.
  std::shared_ptr<tnt::Layer> ffn_norm, linear1, linear2, ffn_dropout, ffn_residual;
};

int64_t transformer_parameter_count(const TransformerParams& p) {
  const int64_t h = p.hidden_size, f = p.filter_size, layers = p.num_hidden_layers;
  const int64_t attention = 4 * h * h, ffn = h * f + f + f * h + h, norm = 2 * h;
  const int64_t encoder_layer = attention + ffn + 2 * norm, decoder_layer = 2 * attention + ffn + 3 * norm;
  return p.vocab_size * h + layers * (encoder_layer + decoder_layer) + 2 * norm;
}

Transformer::Transformer(const TransformerParams& p) : params_(p) {
  TNT_INPUT_CHECK(p.vocab_size > 1 && p.hidden_size > 0 && p.num_hidden_layers > 0 && p.filter_size > 0,
                  "Transformer: vocab_size {}, hidden_size {}, num_hidden_layers {} and filter_size {} must be "
                  "positive (vocab_size > 1)",
                  p.vocab_size, p.hidden_size, p.num_hidden_layers, p.filter_size);
  TNT_INPUT_CHECK(p.num_heads > 0 && p.hidden_size % p.num_heads == 0 && p.hidden_size % 2 == 0,
                  "Transformer: hidden_size {} must be even and a multiple of num_heads {}", p.hidden_size, p.num_heads);
  for (double r : {p.layer_postprocess_dropout, p.attention_dropout, p.relu_dropout}) {
    TNT_INPUT_CHECK(r >= 0 && r < 1, "Transformer: dropout rate {} is not in [0, 1)", r);
  }
  using namespace tnt;
  embedding_ = std::make_shared<Embedding>(p.vocab_size, p.hidden_size, "embedding");
  const double post = p.layer_postprocess_dropout;
  for (const std::string stack : {"encoder", "decoder"}) {
    const bool dec = stack == "decoder";
    auto& blocks = dec ? decoder_ : encoder_;
    for (int64_t i = 0; i < p.num_hidden_layers; ++i) {
      const std::string at = stack + ".layers." + std::to_string(i) + ".";
      auto b = std::make_shared<Block>();
      b->self_attn_norm = std::make_shared<LayerNorm>(1e-6, at + "self_attn_norm");
      b->self_attn = std::make_shared<MultiHeadAttention>(
          p.hidden_size, MultiHeadAttentionOptions{.num_heads = p.num_heads, .dropout = p.attention_dropout,
                                                   .causal = dec},
          at + "self_attn");
      b->self_attn_dropout = std::make_shared<Dropout>(post, at + "self_attn_dropout");
      b->self_attn_residual = std::make_shared<Add>(at + "self_attn_residual");
      if (dec) {
        b->cross_attn_norm = std::make_shared<LayerNorm>(1e-6, at + "cross_attn_norm");
        b->cross_attn = std::make_shared<MultiHeadAttention>(
            p.hidden_size, MultiHeadAttentionOptions{.num_heads = p.num_heads, .dropout = p.attention_dropout},
            at + "cross_attn");
        b->cross_attn_dropout = std::make_shared<Dropout>(post, at + "cross_attn_dropout");
        b->cross_attn_residual = std::make_shared<Add>(at + "cross_attn_residual");
      }
      b->ffn_norm = std::make_shared<LayerNorm>(1e-6, at + "ffn_norm");
      DenseOptions relu_dropout;
      relu_dropout.activation = DenseActivation::relu;
      relu_dropout.dropout = p.relu_dropout;
      b->linear1 = std::make_shared<Dense>(p.filter_size, relu_dropout, at + "ffn.linear1");
      b->linear2 = std::make_shared<Dense>(p.hidden_size, at + "ffn.linear2");
      b->ffn_dropout = std::make_shared<Dropout>(post, at + "ffn_dropout");
      b->ffn_residual = std::make_shared<Add>(at + "ffn_residual");
      blocks.push_back(b);
    }
  }
  encoder_norm_ = std::make_shared<LayerNorm>(1e-6, "encoder.norm");
  decoder_norm_ = std::make_shared<LayerNorm>(1e-6, "decoder.norm");
  encoder_position_ = std::make_shared<PositionEncoding>("encoder.position_encoding");
  decoder_position_ = std::make_shared<PositionEncoding>("decoder.position_encoding");
  encoder_dropout_ = std::make_shared<Dropout>(post, "encoder.dropout");
  decoder_dropout_ = std::make_shared<Dropout>(post, "decoder.dropout");
}

// x + dropout(body(norm(x)))
tnt::SymTensor Transformer::sublayer(const tnt::SymTensor& x, const std::shared_ptr<tnt::Layer>& norm,
                                     const std::shared_ptr<tnt::Layer>& dropout,
                                     const std::shared_ptr<tnt::Layer>& residual,
                                     const std::function<tnt::SymTensor(const tnt::SymTensor&)>& body) {
  using tnt::call;
  return call(residual, std::vector<tnt::SymTensor>{x, call(dropout, body(call(norm, x)))});
}

tnt::SymTensor Transformer::embed(const std::string& stack, const tnt::SymTensor& ids) {
  using tnt::call;
  const bool dec = stack == "decoder";
  tnt::SymTensor e = call(embedding_, ids);  // (B, T, D), scaled, 0 at padding
  e = call(dec ? decoder_position_ : encoder_position_, e);
  return call(dec ? decoder_dropout_ : encoder_dropout_, e);
}

tnt::SymTensor Transformer::encode(const tnt::SymTensor& src_ids) {
  using tnt::call;
  tnt::SymTensor x = embed("encoder", src_ids);  // (B, S, D)
  for (const auto& b : encoder_) {
    x = sublayer(x, b->self_attn_norm, b->self_attn_dropout, b->self_attn_residual, [&](const tnt::SymTensor& h) {
      return tnt::SymTensor(call(b->self_attn, std::vector<tnt::SymTensor>{h, src_ids}));
    });
    x = sublayer(x, b->ffn_norm, b->ffn_dropout, b->ffn_residual, [&](const tnt::SymTensor& h) {
      return call(b->linear2, call(b->linear1, h));
    });
  }
  return call(encoder_norm_, x);
}

tnt::SymTensor Transformer::decode(const tnt::SymTensor& decoder_ids, const tnt::SymTensor& memory,
                                   const tnt::SymTensor& src_ids) {
  using tnt::call;
  tnt::SymTensor y = embed("decoder", decoder_ids);  // (B, T, D)
  for (const auto& b : decoder_) {
    y = sublayer(y, b->self_attn_norm, b->self_attn_dropout, b->self_attn_residual,
                 [&](const tnt::SymTensor& h) { return call(b->self_attn, h); });
    y = sublayer(y, b->cross_attn_norm, b->cross_attn_dropout, b->cross_attn_residual, [&](const tnt::SymTensor& h) {
      return tnt::SymTensor(call(b->cross_attn, std::vector<tnt::SymTensor>{h, memory, src_ids}));
    });
    y = sublayer(y, b->ffn_norm, b->ffn_dropout, b->ffn_residual, [&](const tnt::SymTensor& h) {
      return call(b->linear2, call(b->linear1, h));
    });
  }
  return call(embedding_, call(decoder_norm_, y));  // (B, T, V)
}

std::shared_ptr<tnt::Network> Transformer::training_network(int64_t source_length, int64_t target_length,
                                                             const std::string& name) {
  TNT_INPUT_CHECK(source_length > 0 && target_length > 0, "Transformer: sequence lengths {} and {} must be positive",
                  source_length, target_length);
  tnt::SymTensor src = tnt::Input({source_length}, tnt::DType::i64, "inputs");
  tnt::SymTensor tgt = tnt::Input({target_length}, tnt::DType::i64, "decoder_inputs");
  tnt::SymTensor logits = decode(tgt, encode(src), src);
  return std::make_shared<tnt::Network>(std::vector<tnt::SymTensor>{src, tgt}, std::vector<tnt::SymTensor>{logits},
                                        name);
}

std::shared_ptr<tnt::Network> Transformer::encoder_network(int64_t source_length, const std::string& name) {
  TNT_INPUT_CHECK(source_length > 0, "Transformer: source length {} must be positive", source_length);
  tnt::SymTensor src = tnt::Input({source_length}, tnt::DType::i64, "inputs");
  return std::make_shared<tnt::Network>(std::vector<tnt::SymTensor>{src}, std::vector<tnt::SymTensor>{encode(src)},
                                        name);
}

std::shared_ptr<tnt::Network> Transformer::decoder_network(int64_t source_length, int64_t target_length,
                                                           const std::string& name) {
  TNT_INPUT_CHECK(source_length > 0 && target_length > 0, "Transformer: sequence lengths {} and {} must be positive",
                  source_length, target_length);
  tnt::SymTensor tgt = tnt::Input({target_length}, tnt::DType::i64, "decoder_inputs");
  tnt::SymTensor memory = tnt::Input({source_length, params_.hidden_size}, tnt::DType::f32, "memory");
  tnt::SymTensor src = tnt::Input({source_length}, tnt::DType::i64, "inputs");
  return std::make_shared<tnt::Network>(std::vector<tnt::SymTensor>{tgt, memory, src},
                                        std::vector<tnt::SymTensor>{decode(tgt, memory, src)}, name);
}

// ---------------------------------------------------------------------------------------
// Incremental decoding

namespace {

// One inference call of a layer, its single output.
tnt::Tensor run(tnt::Layer& layer, const std::vector<tnt::Tensor>& inputs, const tnt::RunContext& rc) {
  tnt::SavedState saved;
  saved.need_input_grads = false;
  return layer.forward(inputs, rc, saved).at(0);
}

void move_to(tnt::Layer& layer, tnt::Device device) {
  if (layer.device() != device) layer.to(device);
}

}  // namespace

Transformer::DecoderCache Transformer::start_decoding(const tnt::Tensor& memory, const tnt::Tensor& src_ids,
                                                      const tnt::RunContext& rc) {
  TNT_CHECK(!rc.training, "Transformer: incremental decoding is for inference, not a training step");
  TNT_CHECK(memory.defined() && src_ids.defined() && memory.ndim() == 3 && memory.dim(2) == params_.hidden_size &&
                src_ids.ndim() == 2 && src_ids.dim(0) == memory.dim(0) && src_ids.dim(1) == memory.dim(1),
            "Transformer: decoding needs memory (B, S, {}) and source ids (B, S), got {} and {}", params_.hidden_size,
            memory.defined() ? memory.str() : "none", src_ids.defined() ? src_ids.str() : "none");
  // The layers decode_step calls, on the memory's device (the networks of the uncached path
  // move them the same way).
  const tnt::Device device = memory.device();
  move_to(*embedding_, device);
  move_to(*decoder_norm_, device);
  for (const auto& b : decoder_) {
    for (const auto& layer : {b->self_attn_norm, b->self_attn, b->self_attn_residual, b->cross_attn_norm, b->cross_attn,
                              b->cross_attn_residual, b->ffn_norm, b->linear1, b->linear2, b->ffn_residual})
      move_to(*layer, device);
  }
  DecoderCache cache;
  cache.src_ids = src_ids;
  cache.self.resize(decoder_.size());
  for (const auto& b : decoder_)  // (B, S, D) keys and values per layer, once
    cache.cross.push_back(static_cast<tnt::MultiHeadAttention&>(*b->cross_attn).project(memory, rc));
  return cache;
}

tnt::Tensor Transformer::decode_step(DecoderCache& cache, const tnt::Tensor& last_ids,
                                     const std::vector<int64_t>& parents, const tnt::RunContext& rc) {
  TNT_CHECK(!rc.training, "Transformer: incremental decoding is for inference, not a training step");
  TNT_CHECK(cache.self.size() == decoder_.size() && cache.cross.size() == decoder_.size() && cache.src_ids.defined(),
            "Transformer: a decoder cache that start_decoding did not make");
  TNT_CHECK(
      last_ids.defined() && last_ids.ndim() == 2 && last_ids.dim(1) == 1 && last_ids.dim(0) == cache.src_ids.dim(0),
      "Transformer: decode_step takes one id per row, ({}, 1), got {}", cache.src_ids.dim(0),
      last_ids.defined() ? last_ids.str() : "none");
  const int64_t rows = last_ids.dim(0), d = params_.hidden_size, t = cache.length;
  // y = embedding(id) + P[t]: the table the decoder's PositionEncoding layer adds (the same
  // function builds it, so the same floats), only its row t; grown in doublings.
  if (!cache.positions.defined() || cache.positions.dim(0) <= t)
    cache.positions = tnt::position_encoding(std::max<int64_t>(64, 2 * (t + 1)), d);
  tnt::Tensor y = run(*embedding_, {last_ids}, rc);  // (B, 1, D), scaled, 0 at padding
  tnt::Tensor p = tnt::Tensor::empty({rows, 1, d});  // (B, 1, D): P[t] on every row
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(p.data<float>() + r * d, cache.positions.data<float>() + t * d, static_cast<size_t>(d) * sizeof(float));
  tnt::ops::axpy(1.0, y.device().is_cpu() ? p : p.to(y.device()), y);
  for (size_t i = 0; i < decoder_.size(); ++i) {
    const Block& b = *decoder_[i];
    auto& self_attn = static_cast<tnt::MultiHeadAttention&>(*b.self_attn);
    auto& cross_attn = static_cast<tnt::MultiHeadAttention&>(*b.cross_attn);
    // As decode(): y + body(norm(y)) per sublayer, dropout being the identity.
    tnt::Tensor h = run(*b.self_attn_norm, {y}, rc);
    y = run(*b.self_attn_residual, {y, self_attn.step(h, cache.self[i], parents, rc)}, rc);
    h = run(*b.cross_attn_norm, {y}, rc);
    y = run(*b.cross_attn_residual, {y, cross_attn.attend(h, cache.cross[i], cache.src_ids, rc)}, rc);
    h = run(*b.ffn_norm, {y}, rc);
    h = run(*b.linear2, {run(*b.linear1, {h}, rc)}, rc);
    y = run(*b.ffn_residual, {y, h}, rc);
  }
  cache.length = t + 1;
  return run(*embedding_, {run(*decoder_norm_, {y}, rc)}, rc);  // (B, 1, V)
}

}  // namespace tnt_models
