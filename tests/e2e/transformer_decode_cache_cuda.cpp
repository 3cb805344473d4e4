// Incremental decoding (Transformer::start_decoding, decode_step) on CUDA against the same
// steps on the CPU: a tiny Transformer with random weights, rows reordered between steps
// as beam search reorders beams, sources padded. This runs every CUDA engine of the cached
// path (embedding, position row, norms, the attention's cache append and core, the FFN,
// the logits). Label gpu: needs a GPU, fails without one.
#include <catch2/catch.hpp>

#include "gpu_test_util.hpp"
#include "model.hpp"
#include "tarantella/tarantella.hpp"

#include <cmath>

namespace {

constexpr int64_t kEos = 1;

tnt::RunContext inference(tnt::Device device) {
  tnt::RunContext rc;
  rc.training = false;
  rc.device = device;
  return rc;
}

// Steps of decode_step from the start on `device`: the logits of every step, (rows, 1, V) each, on the host.
std::vector<tnt::Tensor> decode(tnt_models::Transformer& model, const tnt::Tensor& src, tnt::Device device,
                                const std::vector<std::vector<int64_t>>& tokens,
                                const std::vector<std::vector<int64_t>>& parents) {
  const tnt::RunContext rc = inference(device);
  auto encoder = model.encoder_network(src.dim(1));
  encoder->to(device);
  const tnt::Tensor src_dev = src.to(device);
  const tnt::Tensor memory = encoder->forward({src_dev}, rc, false).at(0);
  tnt_models::Transformer::DecoderCache cache = model.start_decoding(memory, src_dev, rc);
  std::vector<tnt::Tensor> out;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const tnt::Tensor ids = tnt::Tensor::from_data(tokens[t].data(), {static_cast<int64_t>(tokens[t].size()), 1});
    out.push_back(model.decode_step(cache, ids.to(device), parents[t], rc).to(tnt::Device::cpu()));
  }
  return out;
}

}  // namespace

TEST_CASE("incremental decoding on CUDA matches the CPU", "[gpu][transformer][cache]") {
  tnt_models::TransformerParams p;
  p.vocab_size = 13;
  p.hidden_size = 32;
  p.num_heads = 4;
  p.filter_size = 64;
  p.num_hidden_layers = 2;
  tnt_models::Transformer model(p);
  model.training_network(4, 1)->initialize(3);
  // Two sources, each on two rows (a row's parent keeps its source); the second padded.
  std::vector<int64_t> src{5, 7, 2, kEos, 5, 7, 2, kEos, 9, kEos, 0, 0, 9, kEos, 0, 0};
  const tnt::Tensor src_ids = tnt::Tensor::from_data(src.data(), {4, 4});
  const std::vector<std::vector<int64_t>> tokens{{0, 0, 0, 0}, {3, 4, 8, 8}, {kEos, 6, 2, 0}, {12, 3, 3, 5}};
  const std::vector<std::vector<int64_t>> parents{{}, {0, 0, 2, 3}, {1, 0, 3, 3}, {0, 1, 3, 2}};
  const std::vector<tnt::Tensor> cpu = decode(model, src_ids, tnt::Device::cpu(), tokens, parents);
  const std::vector<tnt::Tensor> gpu = decode(model, src_ids, tnt::test::gpu(), tokens, parents);
  REQUIRE(gpu.size() == cpu.size());
  for (size_t t = 0; t < cpu.size(); ++t) {
    INFO("step " << t);
    const double largest = tnt::test::max_abs(cpu[t]);
    // FP32 products of at most 64 terms on both sides (cuBLAS without TF32, oneDNN), float
    // LayerNorm sums on the GPU against double on the CPU, __expf against std::exp: each a
    // few ulps relative, through 2 layers: ~1e-5 of the largest logit at worst. 1e-4 of it
    // is well above that and far below the O(1) of a wrong position, mask or parent.
    tnt::test::require_close(gpu[t], cpu[t], 1e-4 * largest, 1e-4, "logits");
  }
}
