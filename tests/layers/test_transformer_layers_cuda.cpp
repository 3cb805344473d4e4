// The Transformer's layers: each CUDA engine against its CPU engine on the same random
// inputs and weights, forward and backward (input gradients and ACCUMULATED parameter
// gradients). Every tolerance says why it has its size. Label gpu: needs a GPU, fails
// without one.
#include "gpu_test_util.hpp"

#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
#include <memory>

using namespace tnt;
using tnt::test::dot_atol;
using tnt::test::gpu;
using tnt::test::kUlp;
using tnt::test::kUnitBf16;
using tnt::test::kUnitFp32;
using tnt::test::max_abs;
using tnt::test::require_close;
using tnt::test::require_equal;

namespace {


RunContext context(bool training, Device device) { return tnt::test::layer_context(training, device, 3); }

// Two copies of one layer (same name, so the same initial weights), one per device.
template <typename L, typename... Args>
std::pair<std::shared_ptr<L>, std::shared_ptr<L>> twins(const std::vector<Shape>& shapes, Args... args) {
  auto a = std::make_shared<L>(args...);
  auto b = std::make_shared<L>(args...);
  b->to(gpu());
  a->ensure_built(shapes);
  b->ensure_built(shapes);
  a->initialize(11);
  b->initialize(11);
  auto pa = a->parameters(), pb = b->parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) require_equal(pb[i]->value, pa[i]->value, "initial " + pa[i]->name);
  return {a, b};
}

struct Run {
  std::vector<Tensor> y_cpu, y_gpu, dx_cpu, dx_gpu;
};

// Forward on both; backward with one random dy after setting every parameter gradient to
// the same random values on both sides (backward must ADD to them).
Run run_both(Layer& a, Layer& b, const std::vector<Tensor>& inputs, bool training, const std::string& key) {
  Run r;
  SavedState sa, sb;
  std::vector<Tensor> gpu_inputs;
  for (const Tensor& x : inputs) gpu_inputs.push_back(x.to(gpu()));
  r.y_cpu = a.forward(inputs, context(training, Device::cpu()), sa);
  r.y_gpu = b.forward(gpu_inputs, context(training, gpu()), sb);
  REQUIRE(r.y_gpu.size() == r.y_cpu.size());
  std::vector<Tensor> dy;
  for (size_t i = 0; i < r.y_cpu.size(); ++i) {
    REQUIRE(r.y_gpu[i].shape() == r.y_cpu[i].shape());
    dy.push_back(test::random_tensor(r.y_cpu[i].shape(), key + "_dy" + std::to_string(i)));
  }
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    Tensor g = test::random_tensor(pa[i]->grad.shape(), key + "_grad_" + pa[i]->name, -0.5f, 0.5f);
    pa[i]->grad.copy_from(g);
    pb[i]->grad.copy_from(g);
  }
  std::vector<Tensor> gpu_dy;
  for (const Tensor& t : dy) gpu_dy.push_back(t.to(gpu()));
  r.dx_cpu = a.backward(dy, context(training, Device::cpu()), sa);
  r.dx_gpu = b.backward(gpu_dy, context(training, gpu()), sb);
  REQUIRE(r.dx_gpu.size() == r.dx_cpu.size());
  return r;
}

Tensor ids64(std::vector<int64_t> v, Shape shape) { return Tensor::from_data(v.data(), shape); }

}  // namespace

TEST_CASE("Embedding: CUDA lookup and projection match the CPU", "[gpu][transformer]") {
  auto [a, b] = twins<Embedding>({{2, 4}}, int64_t{9}, int64_t{16}, std::string("embedding"));
  SECTION("lookup") {
    const Tensor ids = ids64({3, 8, 0, 3, 1, 3, 0, 0}, {2, 4});
    Run r = run_both(*a, *b, {ids}, true, "emb_lookup");
    // A copy times the same float scale: bitwise equal.
    require_equal(r.y_gpu[0], r.y_cpu[0], "y");
    CHECK_FALSE(r.dx_gpu[0].defined());
    // Per id, a sum of at most 3 rows of |dy| <= 1 times 4, added in another order.
    require_close(b->weight().grad, a->weight().grad, dot_atol(3, 1, 4, kUnitFp32), kUlp, "dW");
    // Ids are checked on the device; after a synchronisation (to_vector) the layer's next
    // call reports them (embedding_cuda.hpp).
    SavedState s, s2;
    CHECK_NOTHROW(b->forward({ids64({9}, {1, 1}).to(gpu())}, context(false, gpu()), s)[0].to_vector());
    CHECK_THROWS_AS(b->forward({ids64({1}, {1, 1}).to(gpu())}, context(false, gpu()), s2), InputError);
  }
  SECTION("projection") {
    const Tensor x = test::random_tensor({2, 3, 16}, "emb_x");
    Run r = run_both(*a, *b, {x}, true, "emb_proj");
    const double xmax = max_abs(x), wmax = max_abs(a->weight().value);
    // FP32 products on both sides (cuBLAS without TF32, oneDNN) in different orders.
    require_close(r.y_gpu[0], r.y_cpu[0], dot_atol(16, xmax, wmax, kUnitFp32), 0, "logits");
    require_close(r.dx_gpu[0], r.dx_cpu[0], dot_atol(9, 1, wmax, kUnitFp32), 0, "dx");
    require_close(b->weight().grad, a->weight().grad, dot_atol(6, xmax, 1, kUnitFp32), kUlp, "dW");
  }
}

TEST_CASE("LayerNorm: CUDA engine matches the CPU engine", "[gpu][transformer]") {
  // {3, 700, 40}: 2100 rows, more than one stripe of column_sum's first pass (256 rows), so
  // the two-pass weight and bias gradients run.
  for (const Shape& shape : {Shape{4, 7, 32}, Shape{3, 100}, Shape{2, 1, 1000}, Shape{3, 700, 40}}) {
    INFO("input " << shape_str(shape));
    auto [a, b] = twins<LayerNorm>({shape}, 1e-6, std::string("ln"));
    Tensor g = test::random_tensor({shape.back()}, "ln_g", 0.5f, 1.5f), bias = test::random_tensor({shape.back()}, "ln_b");
    a->weight().value.copy_from(g);
    b->weight().value.copy_from(g);
    a->bias().value.copy_from(bias);
    b->bias().value.copy_from(bias);
    Tensor x = test::random_tensor(shape, "ln_x", -2.0f, 3.0f);
    Run r = run_both(*a, *b, {x}, true, "ln");
    // Mean and variance: double sums on the CPU, float warp sums on the GPU, of D <= 1000
    // values: relative error <= D * 2^-24 ~ 6e-5 at worst on the variance, which moves
    // |xhat| <= 4 by < 1e-4 (times |gamma| <= 1.5).
    require_close(r.y_gpu[0], r.y_cpu[0], 2e-4, 1e-4, "y");
    require_close(r.dx_gpu[0], r.dx_cpu[0], 2e-4, 1e-4, "dx");
    const int64_t rows = x.numel() / shape.back();
    // Column sums over the rows of dy * xhat (|dy| <= 1, |xhat| <= 4), xhat off by ~1e-4.
    require_close(b->weight().grad, a->weight().grad, static_cast<double>(rows) * 1e-4 + dot_atol(rows, 1, 4, kUnitFp32),
                  kUlp, "dgamma");
    require_close(b->bias().grad, a->bias().grad, dot_atol(rows, 1, 1, kUnitFp32), kUlp, "dbeta");
  }
}

TEST_CASE("MultiHeadAttention: CUDA core matches the CPU core", "[gpu][transformer]") {
  struct Case {
    bool cross, ids, causal;
    double dropout;
  };
  for (const Case& c : {Case{false, true, false, 0.0}, Case{false, false, true, 0.0}, Case{true, true, false, 0.0},
                        Case{true, false, false, 0.25}, Case{false, false, true, 0.25}}) {
    INFO("cross " << c.cross << " ids " << c.ids << " causal " << c.causal << " dropout " << c.dropout);
    auto [a, b] = twins<MultiHeadAttention>({{1, 1, 32}}, int64_t{32},
                                            MultiHeadAttentionOptions{.num_heads = 4, .dropout = c.dropout,
                                                                      .causal = c.causal},
                                            std::string("attn"));
    std::vector<Tensor> inputs{test::random_tensor({3, 5, 32}, "attn_x")};
    if (c.cross) inputs.push_back(test::random_tensor({3, 7, 32}, "attn_mem"));
    const int64_t tk = c.cross ? 7 : 5;
    if (c.ids) {
      std::vector<int64_t> v(static_cast<size_t>(3 * tk));
      for (int64_t i = 0; i < 3 * tk; ++i) v[i] = (i % tk) < tk - (i / tk) ? 1 + i % 5 : 0;  // 0, 1, 2 pads
      inputs.push_back(ids64(v, {3, tk}));
    }
    Run r = run_both(*a, *b, inputs, true, "attn");
    // Every product is FP32 on both sides (depth 8, D 32, Tk <= 7 terms); softmax uses
    // __expf on the GPU (a few ulps, relative ~1e-6) against std::exp; the dropout masks
    // are the same Philox draws. Values and gradients are O(1) here; 1e-4 absolute and
    // relative is two orders above these errors, far below a wrong mask or scale.
    require_close(r.y_gpu[0], r.y_cpu[0], 1e-4, 1e-4, "y");
    for (size_t i = 0; i < r.dx_cpu.size(); ++i) {
      if (!r.dx_cpu[i].defined()) {
        CHECK_FALSE(r.dx_gpu[i].defined());
        continue;
      }
      require_close(r.dx_gpu[i], r.dx_cpu[i], 1e-4, 1e-4, "dx" + std::to_string(i));
    }
    auto pa = a->named_parameters(), pb = b->named_parameters();
    // Parameter gradients sum over 15 rows more: 1e-4 per row-product bound.
    for (size_t i = 0; i < pa.size(); ++i) require_close(pb[i].second->grad, pa[i].second->grad, 1.5e-3, 1e-4, pa[i].first);
  }
}

TEST_CASE("MultiHeadAttention and Embedding in bf16 on CUDA against the f32 CPU", "[gpu][transformer]") {
  auto [a, b] = twins<MultiHeadAttention>({{1, 1, 32}}, int64_t{32}, MultiHeadAttentionOptions{.num_heads = 4},
                                          std::string("attn_bf16"));
  for (Parameter* p : b->parameters()) p->compute = ops::cast(p->value, DType::bf16);
  const Tensor x = test::random_tensor({2, 6, 32}, "bf16_x");
  SavedState sa, sb;
  Tensor y_cpu = a->forward({x}, context(false, Device::cpu()), sa)[0];
  Tensor y_gpu = b->forward({ops::cast(x.to(gpu()), DType::bf16)}, context(false, gpu()), sb)[0];
  CHECK(y_gpu.dtype() == DType::bf16);
  // bf16 keeps 8 significant bits: x, the weights, q, k, v, p and o are each rounded once
  // (relative 2^-8 each), through 5 products of <= 32 terms of O(0.3); outputs are O(0.5):
  // 3e-2 absolute is ~8 roundings' worth, far below the O(1) of a wrong path.
  require_close(y_gpu, y_cpu, 3e-2, 3e-2, "y bf16");

  auto [ea, eb] = twins<Embedding>({{1, 1}}, int64_t{7}, int64_t{8}, std::string("emb_bf16"));
  eb->weight().compute = ops::cast(eb->weight().value, DType::bf16);
  const Tensor ids = ids64({1, 6, 0}, {1, 3});
  SavedState s1, s2;
  Tensor e_cpu = ea->forward({ids}, context(false, Device::cpu()), s1)[0];
  Tensor e_gpu = eb->forward({ids.to(gpu())}, context(false, gpu()), s2)[0];
  CHECK(e_gpu.dtype() == DType::bf16);  // activations enter the network in the compute dtype
  // One rounding of W * sqrt(8) (|.| <= 1.5) to bf16: 2^-8 relative.
  require_close(e_gpu, e_cpu, 0, kUnitBf16, "lookup bf16");
}

TEST_CASE("MultiHeadAttention: incremental decoding on CUDA matches the CPU", "[gpu][transformer][cache]") {
  auto [a, b] = twins<MultiHeadAttention>({{1, 1, 32}}, int64_t{32},
                                          MultiHeadAttentionOptions{.num_heads = 4, .causal = true},
                                          std::string("attn_step"));
  const RunContext cpu_rc = context(false, Device::cpu()), gpu_rc = context(false, gpu());
  // Rows reordered every step as beam search does (duplicates, swaps, a row dropped).
  const std::vector<std::vector<int64_t>> parents{{}, {0, 0, 2, 3}, {3, 1, 0, 2}, {1, 1, 1, 0}, {2, 3, 0, 1}};
  AttentionCache ca, cb;
  for (size_t t = 0; t < parents.size(); ++t) {
    INFO("step " << t);
    const Tensor x = test::random_tensor({4, 1, 32}, "step_x" + std::to_string(t));
    const Tensor y_cpu = a->step(x, ca, parents[t], cpu_rc);
    const Tensor y_gpu = b->step(x.to(gpu()), cb, parents[t], gpu_rc);
    REQUIRE(cb.length() == static_cast<int64_t>(t + 1));
    REQUIRE(cb.k.device() == gpu());
    // The cache: projections of the same inputs (FP32 products of 32 terms, cuBLAS against
    // oneDNN), gathered by the same parents: a wrong gather moves whole rows by O(1).
    const double wmax = max_abs(a->k_proj().weight().value);
    require_close(cb.k, ca.k, dot_atol(32, 1, wmax, kUnitFp32), 0, "cached keys");
    require_close(cb.v, ca.v, dot_atol(32, 1, wmax, kUnitFp32), 0, "cached values");
    // As the core test above: FP32 products and __expf against std::exp, O(1) values.
    require_close(y_gpu, y_cpu, 1e-4, 1e-4, "step y");
  }
  // attend() over a projected memory with a padding mask.
  const Tensor x = test::random_tensor({3, 2, 32}, "attend_x");
  const Tensor mem = test::random_tensor({3, 6, 32}, "attend_mem");
  const Tensor ids = ids64({4, 4, 4, 4, 4, 4, 5, 5, 5, 0, 0, 0, 6, 0, 0, 0, 0, 0}, {3, 6});
  const Tensor y_cpu = a->attend(x, a->project(mem, cpu_rc), ids, cpu_rc);
  const Tensor y_gpu = b->attend(x.to(gpu()), b->project(mem.to(gpu()), gpu_rc), ids.to(gpu()), gpu_rc);
  require_close(y_gpu, y_cpu, 1e-4, 1e-4, "attend y");
}

TEST_CASE("MultiHeadAttention: incremental decoding in bf16 on CUDA against the f32 CPU", "[gpu][transformer][cache]") {
  auto [a, b] = twins<MultiHeadAttention>({{1, 1, 32}}, int64_t{32},
                                          MultiHeadAttentionOptions{.num_heads = 4, .causal = true},
                                          std::string("attn_step_bf16"));
  for (Parameter* p : b->parameters()) p->compute = ops::cast(p->value, DType::bf16);
  const RunContext cpu_rc = context(false, Device::cpu()), gpu_rc = context(false, gpu());
  const std::vector<std::vector<int64_t>> parents{{}, {1, 0}, {1, 1}, {0, 1}};
  AttentionCache ca, cb;
  for (size_t t = 0; t < parents.size(); ++t) {
    INFO("step " << t);
    const Tensor x = test::random_tensor({2, 1, 32}, "step_bf16_x" + std::to_string(t));
    const Tensor y_cpu = a->step(x, ca, parents[t], cpu_rc);
    const Tensor y_gpu = b->step(ops::cast(x.to(gpu()), DType::bf16), cb, parents[t], gpu_rc);
    CHECK(cb.k.dtype() == DType::bf16);
    // As the bf16 forward test above: ~8 roundings to 8 significant bits of O(0.5) values.
    require_close(ops::cast(y_gpu, DType::f32), y_cpu, 3e-2, 3e-2, "step y bf16");
    require_close(ops::cast(cb.v, DType::f32), ca.v, 3e-2, 3e-2, "cached values bf16");
  }
}

TEST_CASE("PositionEncoding and GELU: CUDA engines match the CPU", "[gpu][transformer]") {
  auto [pa, pb] = twins<PositionEncoding>({{2, 9, 16}}, std::string("pe"));
  Run r = run_both(*pa, *pb, {test::random_tensor({2, 9, 16}, "pe_x")}, true, "pe");
  // The same host-built table, added in float: bitwise equal.
  require_equal(r.y_gpu[0], r.y_cpu[0], "pe y");
  require_equal(r.dx_gpu[0], r.dx_cpu[0], "pe dx");
  for (bool approx : {true, false}) {
    auto [a, b] = twins<GELU>({{4, 50}}, approx, std::string("gelu"));
    Run g = run_both(*a, *b, {test::random_tensor({4, 50}, "gelu_x", -4.0f, 4.0f)}, true, "gelu");
    // tanhf / erff / expf on the device against the host's: a few ulps of O(1) values.
    require_close(g.y_gpu[0], g.y_cpu[0], 1e-6, 1e-5, "gelu y");
    require_close(g.dx_gpu[0], g.dx_cpu[0], 1e-6, 1e-5, "gelu dx");
  }
}

TEST_CASE("LabelSmoothingCrossEntropy: CUDA engine matches the CPU engine", "[gpu][transformer][losses]") {
  LabelSmoothingCrossEntropy loss(0.1);
  const Tensor logits = test::random_tensor({3, 4, 300}, "ls_logits", -5.0f, 5.0f);
  std::vector<int64_t> v(12);
  for (int i = 0; i < 12; ++i) v[i] = i % 5 == 4 ? 0 : (i * 37) % 300;
  const Tensor labels = ids64(v, {3, 4});
  SavedState sc, sg;
  const double l_cpu = Loss::value(loss.forward(logits, labels, 17, sc));
  const double l_gpu = Loss::value(loss.forward(logits.to(gpu()), labels.to(gpu()), 17, sg));
  // Per-row sums in double on both sides, in different orders, of exp terms computed in
  // float on the GPU (expf, a few ulps: ~3e-7 relative on each row's sum, so ~3e-7 absolute
  // on a log-sum-exp) and in double on the CPU; the loss per token is ~8 here, so 1e-6
  // relative holds that with room, and a wrong constant (0.1 / (V - 1) vs 0.1 / V) moves it
  // by ~1e-3.
  CHECK(l_gpu == Approx(l_cpu).epsilon(1e-6));
  // (p - q) * 2 / 17 with p = expf(x - lse) on the device against std::exp on the host.
  require_close(loss.backward(sg, 2.0), loss.backward(sc, 2.0), 1e-8, 1e-5, "grad");
  v[5] = 300;
  SavedState bad;
  CHECK_THROWS_AS(loss.forward(logits.to(gpu()), ids64(v, {3, 4}).to(gpu()), 0, bad), InputError);
}

TEST_CASE("LabelSmoothingCrossEntropy on CUDA reads bf16/f16 logits as they are, bit for bit", "[gpu][transformer][losses]") {
  // Loss::reads_half_predictions: the Model then skips the network's f32 widening, so the
  // loss and the gradient must be exactly those of the widened logits (the gradient rounded
  // to the half dtype, as the network's edge would have done).
  LabelSmoothingCrossEntropy loss(0.1);
  CHECK(loss.reads_half_predictions(gpu()));
  CHECK_FALSE(loss.reads_half_predictions(Device::cpu()));
  std::vector<int64_t> v(24);
  for (int i = 0; i < 24; ++i) v[i] = i % 7 == 6 ? 0 : (i * 53) % 1000;
  const Tensor labels = ids64(v, {4, 6}).to(gpu());
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const Tensor half = ops::cast(test::random_tensor({4, 6, 1000}, "ls_half", -6.0f, 6.0f).to(gpu()), dt);
    const Tensor wide = ops::cast(half, DType::f32);
    SavedState sh, sw;
    const Tensor lh = loss.forward(half, labels, 19, sh);
    const Tensor lw = loss.forward(wide, labels, 19, sw);
    CHECK(Loss::value(lh) == Loss::value(lw));
    const Tensor gh = loss.backward(sh, 1024.0);
    CHECK(gh.dtype() == dt);
    test::require_equal(gh, ops::cast(loss.backward(sw, 1024.0), dt), "gradient");
  }
}
