// Embedding's output projection on CUDA with the vocabulary padded to a multiple of 8
// (layers/embedding_projection_cuda.hpp, TNT_GEMM_PAD): the padded products against the
// direct ones and against sums in double on the CPU, across chunk edges; and the auto trial
// as the layer runs it (a verdict per shape, remembered; a broken padded path caught by its
// check). Runs under TNT_GEMM_PAD=auto (the default), at INFO so that the verdict lines are
// in the log. Label gpu: needs a GPU, fails without one.
#include "gpu_test_util.hpp"

#include "layers/embedding_projection_cuda.hpp"
#include "layers/projection_pad.hpp"
#include "tarantella/config.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

using namespace tnt;
using tnt::test::dot_atol;
using tnt::test::gpu;
using tnt::test::kUlp;
using tnt::test::kUnitFp32;
using tnt::test::max_abs;
using tnt::test::require_within;

namespace {

double unit_of(DType t) { return t == DType::bf16 ? tnt::test::kUnitBf16 : tnt::test::kUnitF16; }

// A random (shape) tensor rounded to dtype on the GPU, and the same values in f32 on the CPU.
struct Operand {
  Tensor device, host;
};
Operand operand(const Shape& shape, DType dtype, const std::string& key, float lo = -1.0f, float hi = 1.0f) {
  Operand o;
  o.device = ops::cast(test::random_tensor(shape, key, lo, hi).to(gpu()), dtype);
  o.host = ops::cast(o.device.to(Device::cpu()), DType::f32);
  return o;
}

// The products in double: logits = x w^T, dx = dy w, dw = g + dy^T x.
struct Reference {
  Tensor logits, dx, dw;
};
Reference reference(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& g, int64_t rows, int64_t v,
                    int64_t d) {
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* py = dy.data<float>();
  Reference r;
  r.logits = Tensor::empty({rows, v}, DType::f32);
  r.dx = Tensor::empty({rows, d}, DType::f32);
  r.dw = g.clone();
  float* pl = r.logits.data<float>();
  float* pdx = r.dx.data<float>();
  float* pdw = r.dw.data<float>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < v; ++j) {
      double s = 0;
      for (int64_t k = 0; k < d; ++k) s += static_cast<double>(px[i * d + k]) * pw[j * d + k];
      pl[i * v + j] = static_cast<float>(s);
    }
    for (int64_t k = 0; k < d; ++k) {
      double s = 0;
      for (int64_t j = 0; j < v; ++j) s += static_cast<double>(py[i * v + j]) * pw[j * d + k];
      pdx[i * d + k] = static_cast<float>(s);
    }
  }
  for (int64_t j = 0; j < v; ++j) {
    for (int64_t k = 0; k < d; ++k) {
      double s = pdw[j * d + k];
      for (int64_t i = 0; i < rows; ++i) s += static_cast<double>(py[i * v + j]) * px[i * d + k];
      pdw[j * d + k] = static_cast<float>(s);
    }
  }
  return r;
}

struct Results {
  Tensor logits, dx, dw;
};
Results run_path(bool padded, DType t, const Operand& x, const Operand& w, const Operand& dy, const Tensor& g,
                 int64_t rows, int64_t v, int64_t d) {
  Results r;
  r.logits = Tensor::empty({rows, v}, t, gpu());
  r.dx = Tensor::empty({rows, d}, t, gpu());
  r.dw = g.to(gpu());
  const int dev = gpu().index;
  cuda::projection_forward(padded, dev, t, rows, v, d, x.device.raw(), w.device.raw(), r.logits.raw());
  cuda::projection_backward(padded, dev, t, rows, v, d, dy.device.raw(), x.device.raw(), w.device.raw(), r.dx.raw(),
                            static_cast<float*>(r.dw.raw()));
  return r;
}

// Each result against the sums in double: the GPU adds exact f32 products of the 16-bit
// operands in f32 (dot_atol's bound, both sides counted) and rounds the 16-bit outputs once
// (rtol: one unit roundoff of the dtype); dW stays f32 (one f32 ulp of the gradient it adds
// to).
void check_against(const Results& r, const Reference& ref, DType t, int64_t v, int64_t d, int64_t rows,
                   double xmax, double wmax, double ymax, const std::string& what) {
  const double u = unit_of(t);
  require_within(r.logits, ref.logits, dot_atol(d, xmax, wmax, kUnitFp32), u, Tensor(), 0, what + " logits");
  require_within(r.dx, ref.dx, dot_atol(v + 8, ymax, wmax, kUnitFp32), u, Tensor(), 0, what + " dx");
  require_within(r.dw, ref.dw, dot_atol(rows, ymax, xmax, kUnitFp32), kUlp, Tensor(), 0, what + " dW");
}

// Fills 64 MiB of device memory with NaN and frees it (back to the caching allocator, whose
// next blocks may come from it).
void poison_free_memory() {
  // Freed in stream order: the fill runs before any later use of the memory.
  const Tensor nan = Tensor::full({16 << 20}, std::nan(""), DType::f32, gpu());
}

Tensor bf16_input(const Shape& shape, DType t, const std::string& key) {
  return ops::cast(test::random_tensor(shape, key).to(gpu()), t);
}

}  // namespace

TEST_CASE("Projection padding: padded products give the direct sums, across chunk edges", "[gpu][projection_pad]") {
  const int64_t rows = 700, d = 64;
  // 1001 columns: rows 2-byte aligned only (the copies' 2-byte path); 1004: 8-byte aligned,
  // as WMT's 33,708 (their 8-byte path).
  for (const int64_t v : {int64_t{1001}, int64_t{1004}})
  for (DType t : {DType::bf16, DType::f16}) {
    for (int64_t chunk : {int64_t{0}, int64_t{128}, int64_t{64}}) {  // 0: all 700 rows in one chunk
      const std::string what = std::string(dtype_name(t)) + " v " + std::to_string(v) + " chunk " +
                               std::to_string(chunk);
      INFO(what);
      cuda::projection_pad_chunk_rows_for_tests(chunk);
      const Operand x = operand({rows, d}, t, "pp_x"), w = operand({v, d}, t, "pp_w"),
                    dy = operand({rows, v}, t, "pp_dy");
      const Tensor g = test::random_tensor({v, d}, "pp_g", -0.5f, 0.5f);
      const Reference ref = reference(x.host, w.host, dy.host, g, rows, v, d);
      const Results direct = run_path(false, t, x, w, dy, g, rows, v, d);
      // Freed memory full of NaN, which the padded path's scratch may reuse: a zero row or
      // column it failed to write would then turn results into NaN.
      poison_free_memory();
      const Results padded = run_path(true, t, x, w, dy, g, rows, v, d);
      const double xmax = max_abs(x.host), wmax = max_abs(w.host), ymax = max_abs(dy.host);
      check_against(direct, ref, t, v, d, rows, xmax, wmax, ymax, what + " direct");
      check_against(padded, ref, t, v, d, rows, xmax, wmax, ymax, what + " padded");
    }
  }
  cuda::projection_pad_chunk_rows_for_tests(0);
}

TEST_CASE("Projection padding: the auto trial's verdict runs the layer, and is remembered", "[gpu][projection_pad]") {
  REQUIRE(tnt::config().gemm_pad.automatic());
  REQUIRE_FALSE(tnt::config().deterministic);
  const int64_t v = 1001, d = 64;
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(dtype_name(t));
    cuda::projection_pad_trials_reset();
    cuda::projection_pad_prefer_padded_for_tests(true);  // padded wherever the check passes
    cuda::projection_pad_chunk_rows_for_tests(128);
    auto a = std::make_shared<Embedding>(v, d, "proj");
    auto b = std::make_shared<Embedding>(v, d, "proj");
    b->to(gpu());
    a->ensure_built({{5, 140, d}});
    b->ensure_built({{5, 140, d}});
    a->initialize(13);
    b->initialize(13);
    b->weight().compute = ops::cast(b->weight().value, t);
    const Tensor xg = bf16_input({5, 140, d}, t, "pa_x");  // 700 rows
    const Tensor xc = ops::cast(xg.to(Device::cpu()), DType::f32);
    // The CPU engine on the same rounded weights: the layers differ by the GPU's rounding only.
    a->weight().value.copy_from(ops::cast(b->weight().compute.to(Device::cpu()), DType::f32));
    const RunContext rg = test::layer_context(true, gpu()), rcpu = test::layer_context(true, Device::cpu());
    SavedState sg, sc;
    const int64_t padded_before = cuda::projection_pad_padded_calls();
    const Tensor yg = b->forward({xg}, rg, sg)[0];
    const Tensor yc = a->forward({xc}, rcpu, sc)[0];
    CHECK(cuda::projection_pad_padded_calls() == padded_before + 1);  // the layer's forward, not the trial's
    const auto recs = cuda::projection_pad_trials();
    REQUIRE(recs.size() == 1);
    INFO(recs[0].str());
    CHECK_FALSE(recs[0].suspect);
    CHECK(recs[0].path.forward_padded);
    CHECK(recs[0].path.backward_padded);
    CHECK(recs[0].forward_direct_ms > 0);
    CHECK(recs[0].backward_padded_ms > 0);
    CHECK(recs[0].logits.diff <= projection_pad::kAgree * recs[0].logits.largest);
    const double xmax = max_abs(xc), wmax = max_abs(a->weight().value);
    require_within(yg, yc, dot_atol(d, xmax, wmax, kUnitFp32), unit_of(t), Tensor(), 0, "logits");
    const Tensor dyg = bf16_input({5, 140, v}, t, "pa_dy");
    const Tensor dyc = ops::cast(dyg.to(Device::cpu()), DType::f32);
    b->weight().grad.copy_from(a->weight().grad);
    const Tensor dxg = b->backward({dyg}, rg, sg)[0];
    CHECK(cuda::projection_pad_padded_calls() == padded_before + 2);
    const Tensor dxc = a->backward({dyc}, rcpu, sc)[0];
    const double ymax = max_abs(dyc);
    require_within(dxg, dxc, dot_atol(v + 8, ymax, wmax, kUnitFp32), unit_of(t), Tensor(), 0, "dx");
    require_within(b->weight().grad, a->weight().grad, dot_atol(700, ymax, xmax, kUnitFp32), kUlp, Tensor(), 0,
                   "dW");
    // The same shape class again (600 rows is also in (512, 1024]): no second trial.
    SavedState s2;
    (void)b->forward({bf16_input({5, 120, d}, t, "pa_x2")}, rg, s2);
    CHECK(cuda::projection_pad_trials().size() == 1);
    // Another class: a new trial.
    SavedState s3;
    (void)b->forward({bf16_input({5, 20, d}, t, "pa_x3")}, rg, s3);
    CHECK(cuda::projection_pad_trials().size() == 2);
    cuda::projection_pad_prefer_padded_for_tests(false);
  }
  cuda::projection_pad_chunk_rows_for_tests(0);
}

TEST_CASE("Projection padding: a padded path that reads the wrong columns is caught by the trial",
          "[gpu][projection_pad]") {
  const int64_t v = 1001, d = 64;
  for (int fault : {1, 2}) {  // 1: the forward's copy out one column late; 2: the backward's copy in
    INFO("fault " << fault);
    cuda::projection_pad_trials_reset();
    cuda::projection_pad_prefer_padded_for_tests(true);
    cuda::projection_pad_corrupt_for_tests(fault);
    auto b = std::make_shared<Embedding>(v, d, "proj_bad");
    b->to(gpu());
    b->ensure_built({{700, d}});
    b->initialize(17);
    b->weight().compute = ops::cast(b->weight().value, DType::bf16);
    SavedState s;
    const Tensor x = bf16_input({700, d}, DType::bf16, "pb_x");
    const int64_t padded_before = cuda::projection_pad_padded_calls();
    const Tensor y = b->forward({x}, test::layer_context(true, gpu()), s)[0];
    cuda::projection_pad_corrupt_for_tests(0);
    cuda::projection_pad_prefer_padded_for_tests(false);
    const auto recs = cuda::projection_pad_trials();
    REQUIRE(recs.size() == 1);
    INFO(recs[0].str());
    CHECK(recs[0].suspect);
    CHECK_FALSE(recs[0].path.forward_padded);
    CHECK_FALSE(recs[0].path.backward_padded);
    if (fault == 1) {
      CHECK_FALSE(projection_pad::agrees(recs[0].logits.diff, recs[0].logits.largest));
    } else {
      CHECK(projection_pad::agrees(recs[0].logits.diff, recs[0].logits.largest));
      CHECK_FALSE((projection_pad::agrees(recs[0].dx.diff, recs[0].dx.largest) &&
                   projection_pad::agrees(recs[0].dw.diff, recs[0].dw.largest)));
    }
    // The layer ran the direct path: its logits are the direct product's.
    CHECK(cuda::projection_pad_padded_calls() == padded_before);
    Tensor direct = Tensor::empty({700, v}, DType::bf16, gpu());
    cuda::projection_forward(false, gpu().index, DType::bf16, 700, v, d, x.raw(), b->weight().compute.raw(),
                             direct.raw());
    test::require_equal(y, direct, "logits");
  }
}

TEST_CASE("Projection padding: no trial where nothing is misaligned", "[gpu][projection_pad]") {
  cuda::projection_pad_trials_reset();
  const int64_t d = 64;
  for (auto [v, t] : {std::pair{int64_t{1008}, DType::bf16}, std::pair{int64_t{1001}, DType::f32}}) {
    auto b = std::make_shared<Embedding>(v, d, "proj_aligned");
    b->to(gpu());
    b->ensure_built({{300, d}});
    b->initialize(19);
    if (t != DType::f32) b->weight().compute = ops::cast(b->weight().value, t);
    SavedState s;
    (void)b->forward({ops::cast(test::random_tensor({300, d}, "pn_x").to(gpu()), t)}, test::layer_context(true, gpu()),
                     s);
  }
  CHECK(cuda::projection_pad_trials().empty());
}

// Dense with units off 8 takes the same padded products (dense_cuda.cu), its bias and
// activation after them: against its CPU twin on the same rounded weights.
TEST_CASE("Projection padding: Dense with units off 8, bias and ReLU after the padded product",
          "[gpu][projection_pad]") {
  const int64_t in = 64, units = 1001, rows = 700;
  for (bool relu : {false, true}) {
    INFO((relu ? "relu" : "bias only"));
    cuda::projection_pad_trials_reset();
    cuda::projection_pad_prefer_padded_for_tests(true);
    cuda::projection_pad_chunk_rows_for_tests(128);
    DenseOptions o;
    if (relu) o.activation = DenseActivation::relu;
    auto a = std::make_shared<Dense>(units, o, "dense_pad");
    auto b = std::make_shared<Dense>(units, o, "dense_pad");
    b->to(gpu());
    a->ensure_built({{rows, in}});
    b->ensure_built({{rows, in}});
    a->initialize(23);
    b->initialize(23);
    b->weight().compute = ops::cast(b->weight().value, DType::bf16);
    a->weight().value.copy_from(ops::cast(b->weight().compute.to(Device::cpu()), DType::f32));
    const Tensor bias = test::random_tensor({units}, "dp_bias", -0.5f, 0.5f);
    a->bias()->value.copy_from(bias);
    b->bias()->value.copy_from(bias);
    const Tensor xg = bf16_input({rows, in}, DType::bf16, "dp_x");
    const Tensor xc = ops::cast(xg.to(Device::cpu()), DType::f32);
    const RunContext rg = test::layer_context(true, gpu()), rcpu = test::layer_context(true, Device::cpu());
    SavedState sg, sc;
    const int64_t padded_before = cuda::projection_pad_padded_calls();
    const Tensor yg = b->forward({xg}, rg, sg)[0];
    const Tensor yc = a->forward({xc}, rcpu, sc)[0];
    const auto recs = cuda::projection_pad_trials();
    REQUIRE(recs.size() == 1);
    INFO(recs[0].str());
    CHECK_FALSE(recs[0].suspect);
    CHECK(recs[0].layer == "Dense 'dense_pad'");
    CHECK(cuda::projection_pad_padded_calls() == padded_before + 1);
    const double u = tnt::test::kUnitBf16, xmax = max_abs(xc), wmax = max_abs(a->weight().value);
    // The product rounded to bf16 (u of |x w|, at most u of |y| + |bias|), the bias added in
    // float and rounded again (u of |y|); ReLU moves nothing further.
    require_within(yg, yc, dot_atol(in, xmax, wmax, kUnitFp32) + u * 0.5, 2 * u, Tensor(), 0, "y");
    const Tensor dyg = bf16_input({rows, units}, DType::bf16, "dp_dy");
    const Tensor dyc = ops::cast(dyg.to(Device::cpu()), DType::f32);
    b->weight().grad.copy_from(a->weight().grad);
    b->bias()->grad.copy_from(a->bias()->grad);
    const Tensor dxg = b->backward({dyg}, rg, sg)[0];
    const Tensor dxc = a->backward({dyc}, rcpu, sc)[0];
    CHECK(cuda::projection_pad_padded_calls() == padded_before + 2);
    if (!relu) {  // with ReLU, outputs within rounding of 0 may take the other branch on each side
      const double ymax = max_abs(dyc);
      require_within(dxg, dxc, dot_atol(units + 8, ymax, wmax, kUnitFp32), u, Tensor(), 0, "dx");
      require_within(b->weight().grad, a->weight().grad, dot_atol(rows, ymax, xmax, kUnitFp32), kUlp, Tensor(), 0,
                     "dW");
      require_within(b->bias()->grad, a->bias()->grad, dot_atol(rows, ymax, 1, kUnitFp32), kUlp, Tensor(), 0, "db");
      // A first layer's backward without an input gradient: the padded path's dW alone.
      SavedState ng, nc;
      ng.need_input_grads = false;
      nc.need_input_grads = false;
      (void)b->forward({xg}, rg, ng);
      (void)a->forward({xc}, rcpu, nc);
      const Tensor none_g = b->backward({dyg}, rg, ng)[0];
      (void)a->backward({dyc}, rcpu, nc);
      CHECK_FALSE(none_g.defined());
      CHECK(cuda::projection_pad_padded_calls() == padded_before + 4);
      require_within(b->weight().grad, a->weight().grad, dot_atol(2 * rows, ymax, xmax, kUnitFp32), 2 * kUlp,
                     Tensor(), 0, "dW, twice, the second without dx");
    }
    cuda::projection_pad_prefer_padded_for_tests(false);
  }
  cuda::projection_pad_chunk_rows_for_tests(0);
}
