// The Transformer's layers: each CUDA engine against its CPU engine on the same random
// inputs and weights, forward and backward (input gradients and ACCUMULATED parameter
// gradients). Every tolerance says why it has its size. Label gpu: needs a GPU, fails
// without one.
#include "gpu_test_util.hpp"

#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
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
using tnt::test::require_within;

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

namespace {

// Uniform multiples of 2^-8 in [-1, 1]: exact in f32, bf16 and f16, and every sum of fewer
// than 2^14 of them is exact in float, so the bias gradient (a column sum of dy) has one
// right answer whatever the order of summation.
Tensor verifiable_dy(const Shape& shape, const std::string& key) {
  std::vector<float> v = test::random_tensor(shape, key).to_vector();
  for (float& e : v) e = std::round(e * 256.0f) / 256.0f;
  return Tensor::from_vector(v, shape);
}

}  // namespace

// The CUDA backward adds dy * xhat and dy into the weight and bias gradients in the same
// pass that computes dx (rows of D <= 1024 in registers, one stripe of rows a block), or in
// two column sums after it (D > 1024). Shapes: D = 5 and 37 (most lanes of a warp idle),
// each register bucket (D = 200: 8 values a lane, 500: 16, 1000 and 1024: 32), 3 rows (a
// block with idle warps), 9973 x 1024 (a prime number of rows, more than any GPU's blocks x
// warps, so every warp walks several rows and the last stripe is short), and D = 1025 and
// 1500 (the column sums, one and two passes). The layer runs at two call sites of one step
// (different row counts): both backward calls ADD to the gradients.
TEST_CASE("LayerNorm: CUDA backward sums every row into the weight and bias gradients", "[gpu][transformer]") {
  const std::vector<Shape> shapes = {Shape{21, 5},   Shape{3, 37, 37},  Shape{50, 200},     Shape{2, 33, 500},
                                     Shape{3, 100},  Shape{2, 1, 1000}, Shape{9973, 1024}, Shape{5, 1025},
                                     Shape{300, 1500}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape& shape : shapes) {
      INFO(dtype_name(dtype) << " input " << shape_str(shape));
      const int64_t d = shape.back();
      const int64_t rows1 = shape_numel(shape) / d, rows2 = rows1 / 2 + 1;
      const std::vector<Shape> site_shapes = {shape, Shape{rows2, d}};
      auto [a, b] = twins<LayerNorm>({shape}, 1e-6, std::string("ln_sites"));
      Tensor g = test::random_tensor({d}, "ln_sites_g", 0.5f, 1.5f), bias = test::random_tensor({d}, "ln_sites_b");
      a->weight().value.copy_from(g);
      b->weight().value.copy_from(g);
      a->bias().value.copy_from(bias);
      b->bias().value.copy_from(bias);
      const Tensor g0 = test::random_tensor({d}, "ln_sites_dw0", -0.5f, 0.5f);
      const Tensor b0 = test::random_tensor({d}, "ln_sites_db0", -0.5f, 0.5f);
      a->weight().grad.copy_from(g0);
      b->weight().grad.copy_from(g0);
      a->bias().grad.copy_from(b0);
      b->bias().grad.copy_from(b0);

      // The CPU engine takes f32: it gets the values the GPU sees, x rounded to `dtype`.
      std::vector<Tensor> xs, dys, y_cpu, y_gpu;
      std::vector<SavedState> sa(2), sb(2);
      for (size_t s = 0; s < 2; ++s) {
        const std::string key = "ln_sites_" + std::to_string(s);
        const Tensor x = test::random_tensor(site_shapes[s], key + "_x", -2.0f, 3.0f);
        xs.push_back(ops::cast(ops::cast(x, dtype), DType::f32));
        dys.push_back(verifiable_dy(site_shapes[s], key + "_dy"));
        y_cpu.push_back(a->forward({xs[s]}, context(true, Device::cpu()), sa[s])[0]);
        y_gpu.push_back(b->forward({ops::cast(xs[s].to(gpu()), dtype)}, context(true, gpu()), sb[s])[0]);
        CHECK(y_gpu[s].dtype() == dtype);
      }
      // Each call site's saved statistics (mean, 1/std per row) as the GPU computed them.
      std::vector<std::vector<double>> stats;
      for (size_t s = 0; s < 2; ++s) stats.push_back(sb[s].tensors.at(1).to_double_vector());
      // Backward in reverse order of the forward calls, as a network's backward runs.
      std::vector<Tensor> dx_cpu(2), dx_gpu(2);
      for (size_t s : {size_t{1}, size_t{0}}) {
        dx_cpu[s] = a->backward({dys[s]}, context(true, Device::cpu()), sa[s])[0];
        dx_gpu[s] = b->backward({ops::cast(dys[s].to(gpu()), dtype)}, context(true, gpu()), sb[s])[0];
        CHECK(dx_gpu[s].dtype() == dtype);
      }

      // y and dx: the tolerances of "LayerNorm: CUDA engine matches the CPU engine" (float
      // statistics against double ones), plus, in bf16 and f16, the one rounding of the
      // output to `dtype` (relative unit roundoff; twice it, because the GPU rounds its own
      // value, which may sit across a rounding boundary from the CPU's).
      const double unit = dtype == DType::bf16 ? test::kUnitBf16 : dtype == DType::f16 ? test::kUnitF16 : 0.0;
      for (size_t s = 0; s < 2; ++s) {
        require_close(y_gpu[s], y_cpu[s], 2e-4, 1e-4 + 2 * unit, "y at call site " + std::to_string(s));
        require_close(dx_gpu[s], dx_cpu[s], 2e-4, 1e-4 + 2 * unit, "dx at call site " + std::to_string(s));
      }

      // Bias gradient: b0 + (sum of dy at site 1) + (sum at site 0). The sums are exact on
      // both engines (verifiable_dy) and each is added to the gradient with one rounding, in
      // the same order: bit for bit equal. A row or column missed or counted twice fails.
      require_equal(b->bias().grad, a->bias().grad, "dbeta");

      // Weight gradient against a double reference built from the GPU's own statistics, so
      // that only the GPU's summation is measured: each term dy * (x - mean) * rstd errs by
      // at most 3 roundings (the subtraction, the product with rstd, the product with dy)
      // and a float sum errs by at most (additions on the longest path) * 2^-24 times the
      // sum of the magnitudes. The longest path on any GPU: the rows of one warp's stripe
      // (at most rows / 4, a grid of one block), 4 warps, the partials of at most 1,024
      // blocks in 8 stripes (128 + 8), and the two adds to the gradient; the column sums of
      // D > 1024 are shallower (stripes of >= 256 rows walked 8 at a time, <= 512 chunks).
      const std::vector<double> w0 = g0.to_double_vector();
      std::vector<double> ref(w0), magnitude(static_cast<size_t>(d), 0.0);
      int64_t deepest = 0;
      for (size_t s = 0; s < 2; ++s) {
        const std::vector<double> x = xs[s].to_double_vector(), dy = dys[s].to_double_vector();
        const int64_t rows = s == 0 ? rows1 : rows2;
        deepest = std::max(deepest, (rows + 3) / 4);
        for (int64_t r = 0; r < rows; ++r) {
          const double mean = stats[s][static_cast<size_t>(2 * r)], rstd = stats[s][static_cast<size_t>(2 * r + 1)];
          for (int64_t j = 0; j < d; ++j) {
            const size_t i = static_cast<size_t>(r * d + j);
            const double t = dy[i] * (x[i] - mean) * rstd;
            ref[static_cast<size_t>(j)] += t;
            magnitude[static_cast<size_t>(j)] += std::fabs(t);
          }
        }
      }
      for (int64_t j = 0; j < d; ++j) magnitude[static_cast<size_t>(j)] += std::fabs(w0[static_cast<size_t>(j)]);
      const double depth = static_cast<double>(deepest + 4 + 128 + 8 + 2 + 3);
      require_within(b->weight().grad, Tensor::from_vector(std::vector<float>(ref.begin(), ref.end()), {d}), 0.0, kUlp,
                     Tensor::from_vector(std::vector<float>(magnitude.begin(), magnitude.end()), {d}),
                     depth * kUnitFp32, "dgamma against the double reference");
    }
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
  // V = 300: 4 logits an access; 301: one (the rows are not 4-element aligned).
  for (int64_t vocab : {300, 301}) {
    INFO("V = " << vocab);
    LabelSmoothingCrossEntropy loss(0.1);
    const Tensor logits = test::random_tensor({3, 4, vocab}, "ls_logits", -5.0f, 5.0f);
    std::vector<int64_t> v(12);
    for (int i = 0; i < 12; ++i) v[i] = i % 5 == 4 ? 0 : (i * 37) % vocab;
    const Tensor labels = ids64(v, {3, 4});
    SavedState sc, sg;
    const double l_cpu = Loss::value(loss.forward(logits, labels, 17, sc));
    const double l_gpu = Loss::value(loss.forward(logits.to(gpu()), labels.to(gpu()), 17, sg));
    // Per-row sums in double on both sides, in different orders, of exp terms computed in
    // float on the GPU (expf, a few ulps, and once more when a thread's running max moves:
    // ~3e-7 relative on each row's sum, so ~3e-7 absolute on a log-sum-exp) and in double on
    // the CPU; the loss per token is ~8 here, so 1e-6 relative holds that with room, and a
    // wrong constant (0.1 / (V - 1) vs 0.1 / V) moves it by ~1e-3.
    CHECK(l_gpu == Approx(l_cpu).epsilon(1e-6));
    // (p - q) * 2 / 17 with p = expf(x - lse) on the device against std::exp on the host.
    require_close(loss.backward(sg, 2.0), loss.backward(sc, 2.0), 1e-8, 1e-5, "grad");
    v[5] = vocab;
    SavedState bad;
    CHECK_THROWS_AS(loss.forward(logits.to(gpu()), ids64(v, {3, 4}).to(gpu()), 0, bad), InputError);
  }
}

TEST_CASE("LabelSmoothingCrossEntropy on CUDA writes the gradient over logits nobody else holds, same bits",
          "[gpu][transformer][losses]") {
  // Model's step lets its predictions go before the loss's backward, which then needs no
  // second (R, V) buffer: 2.2 GB at Transformer-big's 128 x 256 tokens.
  LabelSmoothingCrossEntropy loss(0.1);
  std::vector<int64_t> v(24);
  for (int i = 0; i < 24; ++i) v[i] = i % 7 == 6 ? 0 : (i * 53) % 1001;
  const Tensor labels = ids64(v, {4, 6}).to(gpu());
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t vocab : {1000, 1001}) {  // 4 logits an access, and 1
      INFO(dtype_name(dt) << ", V = " << vocab);
      const Tensor held = ops::cast(test::random_tensor({4, 6, vocab}, "ls_in_place", -6.0f, 6.0f).to(gpu()), dt);
      SavedState kept, handed;
      const Tensor l_kept = loss.forward(held, labels, 19, kept);
      const Tensor g_kept = loss.backward(kept, 8.0);
      CHECK(g_kept.raw() != held.raw());  // the caller still holds its logits
      Tensor given = held.clone();
      const void* where = given.raw();
      const Tensor l_given = loss.forward(given, labels, 19, handed);
      given = Tensor();
      const Tensor g_given = loss.backward(handed, 8.0);
      CHECK(g_given.raw() == where);
      CHECK(Loss::value(l_given) == Loss::value(l_kept));
      test::require_equal(g_given, g_kept, "gradient written in place");
      CHECK(handed.tensors.empty());
      CHECK_THROWS(loss.backward(handed, 8.0));  // spent: the logits are gone
    }
  }
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
