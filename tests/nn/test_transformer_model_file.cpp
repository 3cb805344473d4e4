// The Transformer of models/transformer (its "tiny" parameters: 6 + 6 layers, hidden 32,
// 4 heads, filter 256; a small vocabulary to keep the test quick) through a whole-model
// file: one Embedding called at three places, attention with padding and causal masks,
// every residual Add and every Dropout come back with their names, so the loaded model's
// logits, its training-mode dropout masks and one Adam step from it are bitwise those of the
// original. Bitwise: the same engines on the same weights in the same order, on one rank.
#include <catch2/catch.hpp>

#include "../../models/transformer/model.hpp"
#include "temp_dir.hpp"
#include "tarantella/tarantella.hpp"

#include <cstring>

namespace {

constexpr int64_t kSamples = 6, kSrcLen = 7, kTgtLen = 5, kVocab = 40;

std::vector<uint8_t> bytes_of(const tnt::Tensor& t) {
  tnt::Tensor h = t.to(tnt::Device::cpu());
  std::vector<uint8_t> b(static_cast<size_t>(h.numel()) * tnt::dtype_size(h.dtype()));
  if (!b.empty()) std::memcpy(b.data(), h.raw(), b.size());
  return b;
}

// Same shape, dtype and bytes (a bool, so that a failure does not print whole tensors).
bool bitwise_equal(const tnt::Tensor& a, const tnt::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && bytes_of(a) == bytes_of(b);
}

void require_same_weights(tnt::Network& a, tnt::Network& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].name);
    REQUIRE(pa[i].name == pb[i].name);
    CHECK(bitwise_equal(pa[i].param->value, pb[i].param->value));
  }
}

// Token ids in 2..kVocab-1 with a padded tail (0) of a per-sample length.
tnt::Tensor ids(int64_t length, const std::string& key) {
  tnt::Tensor t = tnt::Tensor::zeros({kSamples, length}, tnt::DType::i64);
  tnt::CounterRng rng(6, key);
  for (int64_t n = 0; n < kSamples; ++n) {
    const int64_t len = 2 + static_cast<int64_t>(rng.bits(static_cast<uint64_t>(n * 100)) % (length - 1));
    for (int64_t i = 0; i < len; ++i) {
      const uint64_t draw = rng.bits(static_cast<uint64_t>(n * 100 + 1 + i));
      t.data<int64_t>()[n * length + i] = 2 + static_cast<int64_t>(draw % (kVocab - 2));
    }
  }
  return t;
}

void fit_one_step(tnt::Model& model, const tnt::Dataset& data) {
  model.compile(std::make_shared<tnt::Adam>(1e-3), std::make_shared<tnt::LabelSmoothingCrossEntropy>(0.1));
  tnt::FitOptions fit;
  fit.batch_size = kSamples;
  fit.verbose = 0;
  model.fit(data, fit);
}

}  // namespace

TEST_CASE("the tiny Transformer round trips through a model file") {
  tnt::test::TempDir dir("tnt-transformer-model");
  tnt_models::TransformerParams params = tnt_models::transformer_params("tiny");
  params.vocab_size = kVocab;
  tnt_models::Transformer transformer(params);
  auto net = transformer.training_network(kSrcLen, kTgtLen);
  tnt::Model model(net, 17);
  // Weights away from what any constructor draws, so that only loaded weights can match.
  for (auto& p : net->named_parameters()) tnt::Initializer::uniform(-0.3, 0.3).apply(p.param->value, 5, p.name);

  const std::string path = dir.file("transformer.safetensors");
  tnt::save_model(model, path);
  std::unique_ptr<tnt::Model> loaded = tnt::load_model(path, model.seed());
  tnt::Network& lnet = loaded->network();
  CHECK(tnt::model_to_json(lnet) == tnt::model_to_json(*net));
  require_same_weights(lnet, *net);
  CHECK(lnet.layers().size() == net->layers().size());

  const tnt::Tensor src = ids(kSrcLen, "src"), dec = ids(kTgtLen, "dec"), tgt = ids(kTgtLen, "tgt");
  tnt::Dataset data = tnt::Dataset::from_tensors({src, dec, tgt});
  tnt::Tensor a = model.predict(data, 4), b = loaded->predict(data, 4);
  CHECK(a.shape() == tnt::Shape{kSamples, kTgtLen, kVocab});
  CHECK(bitwise_equal(a, b));

  // Training mode: attention and residual dropout masks are keyed on the layers' names.
  tnt::RunContext rc;
  rc.training = true;
  rc.seed = model.seed();
  rc.step = 2;
  rc.device = tnt::Device::cpu();
  tnt::Tensor ta = net->forward({src, dec}, rc, false).at(0);
  CHECK(bitwise_equal(ta, lnet.forward({src, dec}, rc, false).at(0)));
  CHECK_FALSE(bitwise_equal(ta, a));

  fit_one_step(model, data);
  fit_one_step(*loaded, data);
  require_same_weights(lnet, *net);
  CHECK_FALSE(bitwise_equal(model.predict(data, 4), a));  // the step moved the weights

  // The decoding network over the same layers (three inputs, one of them f32 memory).
  auto decoder = transformer.decoder_network(kSrcLen, kTgtLen);
  const std::string text = tnt::model_to_json(*decoder);
  CHECK(tnt::model_to_json(*tnt::model_from_json(text)) == text);
}
