// One training step of a small Transformer on CUDA against the same step on the CPU, with
// every dropout on (the masks are the same Philox draws on both sides): the loss, and the
// gradient of every parameter. It runs the GPU-only paths of a Transformer step together:
// the Dropout -> Add chains of the residuals, LayerNorm's one-pass backward, the attention
// projections adding their input gradients in the GEMM, the loss's one-pass forward; in
// bf16 also the fused attention core and Dense's bias gradient summed with its ReLU/dropout
// pass. Each is tested alone beside its layer; this catches what only the whole graph shows
// (a gradient handed to the wrong producer, a chain that declines where it should run).
// Label gpu: needs a GPU, fails without one.
#include <catch2/catch.hpp>

#include "gpu_test_util.hpp"
#include "model.hpp"
#include "tarantella/tarantella.hpp"

#include <cmath>
#include <vector>

namespace {

constexpr int64_t kBatch = 3, kSrc = 6, kTgt = 5;

// Hidden 64 over 4 heads (depth 16: the fused attention's smallest), filter 128 (whole
// 8-column groups for Dense's fused bias gradient), a vocabulary of 16 (the loss reads 4
// logits an access), every dropout 0.1 (the model's defaults).
tnt_models::TransformerParams params() {
  tnt_models::TransformerParams p;
  p.vocab_size = 16;
  p.hidden_size = 64;
  p.num_heads = 4;
  p.filter_size = 128;
  p.num_hidden_layers = 2;
  return p;
}

struct Step {
  double loss = 0;
  std::vector<tnt::Tensor> grads;  // in named_parameters() order, on the host
  int64_t chains = 0;              // fused chains run by an engine in the forward
};

Step train_step(tnt::Device device, tnt::DType compute) {
  tnt_models::Transformer model(params());
  auto net = model.training_network(kSrc, kTgt);
  net->initialize(3);
  net->to(device);
  if (compute != tnt::DType::f32) net->set_compute_dtype(compute);
  // Row 1's source ends in padding; labels 0 are padding too (not counted).
  const std::vector<int64_t> src{5, 7, 2, 9, 3, 1, 4, 8, 1, 0, 0, 0, 6, 6, 2, 11, 13, 1};
  const std::vector<int64_t> tgt{0, 3, 4, 8, 8, 0, 15, 2, 1, 0, 0, 9, 9, 12, 10};
  const std::vector<int64_t> labels{3, 4, 8, 8, 1, 15, 2, 1, 0, 0, 9, 9, 12, 10, 1};
  tnt::RunContext rc;
  rc.training = true;
  rc.seed = 7;
  rc.step = 2;
  rc.sample_offset = 0;
  rc.device = device;
  net->zero_grad();
  const std::vector<tnt::Tensor> out =
      net->forward({tnt::Tensor::from_data(src.data(), {kBatch, kSrc}).to(device),
                    tnt::Tensor::from_data(tgt.data(), {kBatch, kTgt}).to(device)},
                   rc);
  Step s;
  s.chains = net->fused_engine_runs();
  tnt::LabelSmoothingCrossEntropy loss(0.1);
  tnt::SavedState saved;
  s.loss = tnt::Loss::value(loss.forward(out.at(0), tnt::Tensor::from_data(labels.data(), {kBatch, kTgt}).to(device),
                                         13, saved));
  net->backward({loss.backward(saved, 1.0)}, rc);
  for (auto& np : net->named_parameters()) s.grads.push_back(np.param->grad.to(tnt::Device::cpu()));
  return s;
}

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("a Transformer training step on CUDA matches the CPU, every dropout on", "[gpu][transformer]") {
  REQUIRE(tnt::cuda_available());
  const Step cpu = train_step(tnt::Device::cpu(), tnt::DType::f32);
  // 2 encoder layers x 2 residuals + 2 decoder layers x 3.
  constexpr int64_t kChains = 10;

  SECTION("f32") {
    const Step gpu = train_step(tnt::test::gpu(), tnt::DType::f32);
    CHECK(gpu.chains == kChains);
    // FP32 products on both sides (no TF32), float sums on the GPU against oneDNN's and double
    // ones on the CPU, __expf against std::exp: relative errors of a few 1e-7 per operation,
    // through 2 + 2 layers and back: ~1e-5 of a gradient's largest entry at worst. 1e-4 of it
    // is well above that and far below a wrong mask, a lost residual gradient or a bias
    // gradient summed twice (all O(1) of the tensor).
    CHECK(gpu.loss == Approx(cpu.loss).epsilon(1e-5));
    REQUIRE(gpu.grads.size() == cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      tnt::test::require_close(gpu.grads[i], cpu.grads[i], 1e-4 * tnt::test::max_abs(cpu.grads[i]) + 1e-7, 1e-4,
                               "gradient " + std::to_string(i));
    }
  }

  SECTION("bf16") {
    const Step gpu = train_step(tnt::test::gpu(), tnt::DType::bf16);
    CHECK(gpu.chains == kChains);
    // bf16 keeps 8 significant bits: every activation rounded (relative 2^-8 each) through
    // 4 layers and back. Compared as a whole: the loss within 2% and all gradients together
    // within 10% in the 2-norm; a wiring error moves whole tensors by O(1) of their size
    // (the gradient of a residual stream lost: about half the norm).
    CHECK(gpu.loss == Approx(cpu.loss).epsilon(0.02));
    std::vector<double> want, diff;
    REQUIRE(gpu.grads.size() == cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      const std::vector<double> g = gpu.grads[i].to_double_vector(), w = cpu.grads[i].to_double_vector();
      REQUIRE(g.size() == w.size());
      for (size_t j = 0; j < w.size(); ++j) {
        REQUIRE(std::isfinite(g[j]));
        want.push_back(w[j]);
        diff.push_back(g[j] - w[j]);
      }
    }
    INFO("relative 2-norm error of all gradients: " << norm(diff) / norm(want));
    CHECK(norm(diff) <= 0.1 * norm(want));
  }
}
