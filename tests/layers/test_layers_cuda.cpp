// Every layer, loss and metric: the CUDA engine against the CPU engine on the same random
// inputs and weights, forward and backward (input gradients, accumulated parameter
// gradients, BatchNorm's running statistics). Each tolerance says why it has its size.
#include "gpu_test_util.hpp"

#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
#include <limits>
#include <memory>

using namespace tnt;
using tnt::test::dot_atol;
using tnt::test::gpu;
using tnt::test::kUlp;
using tnt::test::kUnitFp32;
using tnt::test::kUnitTf32;
using tnt::test::max_abs;
using tnt::test::require_close;
using tnt::test::require_equal;

namespace {


RunContext context(bool training, Device device) { return tnt::test::layer_context(training, device); }

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
  for (size_t i = 0; i < pa.size(); ++i) {
    REQUIRE(pb[i]->value.device() == gpu());
    require_equal(pb[i]->value, pa[i]->value, "initial " + pa[i]->name);
  }
  return {a, b};
}

std::vector<Tensor> to_gpu(const std::vector<Tensor>& xs) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(x.to(gpu()));
  return out;
}

struct Run {
  std::vector<Tensor> y_cpu, y_gpu, dx_cpu, dx_gpu;
};

// Forward on both; then backward with one random dy, after setting every parameter
// gradient to the same random values on both sides (backward must ADD to them).
Run run_both(Layer& a, Layer& b, const std::vector<Tensor>& inputs, bool training, const std::string& key) {
  Run r;
  SavedState sa, sb;
  r.y_cpu = a.forward(inputs, context(training, Device::cpu()), sa);
  r.y_gpu = b.forward(to_gpu(inputs), context(training, gpu()), sb);
  REQUIRE(r.y_gpu.size() == r.y_cpu.size());
  for (size_t i = 0; i < r.y_cpu.size(); ++i) {
    REQUIRE(r.y_gpu[i].device() == gpu());
    REQUIRE(r.y_gpu[i].shape() == r.y_cpu[i].shape());
  }
  std::vector<Tensor> dy;
  for (size_t i = 0; i < r.y_cpu.size(); ++i)
    dy.push_back(test::random_tensor(r.y_cpu[i].shape(), key + "_dy" + std::to_string(i)));
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!pa[i]->grad.defined()) continue;
    Tensor g = test::random_tensor(pa[i]->grad.shape(), key + "_grad_" + pa[i]->name, -0.5f, 0.5f);
    pa[i]->grad.copy_from(g);
    pb[i]->grad.copy_from(g);
  }
  r.dx_cpu = a.backward(dy, context(training, Device::cpu()), sa);
  r.dx_gpu = b.backward(to_gpu(dy), context(training, gpu()), sb);
  REQUIRE(r.dx_gpu.size() == r.dx_cpu.size());
  return r;
}

Parameter& param(Layer& l, const std::string& name) {
  for (Parameter* p : l.parameters())
    if (p->name == name) return *p;
  for (Parameter* p : l.buffers())
    if (p->name == name) return *p;
  FAIL("no parameter " << name);
  throw Error("unreachable");
}

}  // namespace

TEST_CASE("Dense: CUDA engine matches the CPU engine", "[gpu][layers]") {
  struct Case {
    Shape x;
    int64_t units;
    bool bias;
  };
  // 600 rows: more than one 256-row stripe, so the bias gradient takes column_sum's two
  // passes (reduce.cuh).
  for (const Case& c : {Case{{4, 33}, 10, false}, Case{{5, 7, 16}, 9, true}, Case{{1, 1}, 3, true},
                        Case{{600, 33}, 10, true}}) {
    INFO("input " << shape_str(c.x) << ", units " << c.units);
    auto [a, b] = twins<Dense>({c.x}, c.units, DenseOptions{.use_bias = c.bias}, "dense");
    Tensor x = test::random_tensor(c.x, "dense_x");
    Run r = run_both(*a, *b, {x}, true, "dense");
    const int64_t in = c.x.back(), rows = x.numel() / in;
    const double xmax = max_abs(x), wmax = max_abs(a->weight().value);
    // FP32 products on both sides (cuBLAS without TF32, oneDNN), summed in different orders.
    require_close(r.y_gpu[0], r.y_cpu[0], dot_atol(in, xmax, wmax, kUnitFp32), 0, "y");
    const double dymax = 1.0;
    require_close(r.dx_gpu[0], r.dx_cpu[0], dot_atol(c.units, dymax, wmax, kUnitFp32), 0, "dx");
    // The accumulated gradient adds one more rounding of the result (kUlp relative).
    require_close(b->weight().grad, a->weight().grad, dot_atol(rows, xmax, dymax, kUnitFp32), kUlp, "dW");
    if (c.bias) require_close(b->bias()->grad, a->bias()->grad, dot_atol(rows, 1, dymax, kUnitFp32), kUlp, "db");
  }
}

TEST_CASE("Conv2D: CUDA engine matches the CPU engine", "[gpu][layers]") {
  struct Case {
    Shape x;
    int64_t filters, kernel, stride, padding;
    bool bias;
  };
  for (const Case& c : {Case{{2, 3, 9, 9}, 8, 3, 1, 1, true}, Case{{2, 4, 10, 11}, 5, 3, 2, 1, false},
                        Case{{1, 2, 7, 7}, 3, 1, 1, 0, true}, Case{{3, 8, 8, 8}, 4, 5, 2, 2, true}}) {
    INFO("input " << shape_str(c.x) << ", filters " << c.filters << ", kernel " << c.kernel << ", stride "
                  << c.stride << ", padding " << c.padding);
    auto [a, b] = twins<Conv2D>({c.x}, c.filters, c.kernel,
                                Conv2DOptions{.stride = c.stride, .padding = c.padding, .use_bias = c.bias}, "conv");
    Tensor x = test::random_tensor(c.x, "conv_x");
    Run r = run_both(*a, *b, {x}, true, "conv");
    const Shape& ys = r.y_cpu[0].shape();
    const double xmax = max_abs(x), wmax = max_abs(a->weight().value), dymax = 1.0;
    // cuDNN may use TF32 tensor cores for f32 (conv2d_cuda.cu): products err by 2^-10.
    const int64_t k_fwd = c.x[1] * c.kernel * c.kernel;
    require_close(r.y_gpu[0], r.y_cpu[0], dot_atol(k_fwd, xmax, wmax, kUnitTf32), 0, "y");
    const int64_t k_data = c.filters * c.kernel * c.kernel;
    require_close(r.dx_gpu[0], r.dx_cpu[0], dot_atol(k_data, dymax, wmax, kUnitTf32), 0, "dx");
    const int64_t k_filter = ys[0] * ys[2] * ys[3];
    require_close(b->weight().grad, a->weight().grad, dot_atol(k_filter, xmax, dymax, kUnitTf32), kUlp, "dW");
    // Bias gradients are our FP32 channel sums.
    if (c.bias)
      require_close(b->bias()->grad, a->bias()->grad, dot_atol(k_filter, 1, dymax, kUnitFp32), kUlp, "db");
  }
}

TEST_CASE("BatchNorm: CUDA engine matches the CPU engine", "[gpu][layers]") {
  struct Case {
    Shape x;
    bool training, affine;
  };
  for (const Case& c : {Case{{16, 6}, true, true}, Case{{4, 5, 6, 7}, true, true}, Case{{4, 3, 5, 5}, true, false},
                        Case{{16, 6}, false, true}, Case{{4, 5, 6, 7}, false, true}}) {
    INFO("input " << shape_str(c.x) << (c.training ? ", training" : ", inference")
                  << (c.affine ? "" : ", no affine"));
    auto [a, b] = twins<BatchNorm>({c.x}, BatchNormOptions{.affine = c.affine}, "bn");
    const int64_t ch = c.x[1];
    // Non-trivial weights and running statistics (the same on both sides).
    for (const char* name : {"weight", "bias", "running_mean", "running_var"}) {
      if (!c.affine && (std::string(name) == "weight" || std::string(name) == "bias")) continue;
      const bool var = std::string(name) == "running_var";
      Tensor v = test::random_tensor({ch}, std::string("bn_") + name, var ? 0.5f : -0.5f, var ? 2.0f : 0.5f);
      param(*a, name).value.copy_from(v);
      param(*b, name).value.copy_from(v);
    }
    Tensor x = test::random_tensor(c.x, "bn_x", -2.0f, 3.0f);
    Run r = run_both(*a, *b, {x}, c.training, "bn");
    const int64_t m = x.numel() / ch;  // values per channel
    // Mean and variance are float sums of m values (m <= 168 here) computed differently on
    // the two sides: relative error <= m * 2^-24 ~ 1e-5, which moves a normalised value
    // (|xhat| <= 4 here, |gamma| <= 0.5) by well under 1e-4.
    require_close(r.y_gpu[0], r.y_cpu[0], 1e-4, 1e-4, "y");
    require_close(r.dx_gpu[0], r.dx_cpu[0], 1e-4, 1e-4, "dx");
    if (c.affine) {
      // Sums over m of dy * xhat (|dy| <= 1, |xhat| <= 4) with xhat off by ~1e-4 at worst.
      const double atol = static_cast<double>(m) * 4e-5 + dot_atol(m, 1, 4, kUnitFp32);
      require_close(param(*b, "weight").grad, param(*a, "weight").grad, atol, kUlp, "dgamma");
      require_close(param(*b, "bias").grad, param(*a, "bias").grad, dot_atol(m, 1, 1, kUnitFp32), kUlp, "dbeta");
    }
    // Running statistics: 0.9 * old + 0.1 * batch (unbiased variance), same 1e-5 argument.
    require_close(param(*b, "running_mean").value, param(*a, "running_mean").value, 1e-5, 1e-5, "running_mean");
    require_close(param(*b, "running_var").value, param(*a, "running_var").value, 1e-5, 1e-5, "running_var");
  }
}

TEST_CASE("ReLU: CUDA engine equals the CPU engine, gradient 0 at 0", "[gpu][layers]") {
  auto [a, b] = twins<ReLU>({{3, 100}}, "relu");
  Tensor x = test::random_tensor({3, 100}, "relu_x");
  for (int i = 0; i < 300; i += 7) x.data<float>()[i] = 0.0f;  // exact zeros: the kink
  Run r = run_both(*a, *b, {x}, true, "relu");
  require_equal(r.y_gpu[0], r.y_cpu[0], "y");  // a comparison and a copy: exact
  require_equal(r.dx_gpu[0], r.dx_cpu[0], "dx");
  std::vector<float> dx = r.dx_gpu[0].to_vector();
  for (int i = 0; i < 300; i += 7) CHECK(dx[i] == 0.0f);
}

TEST_CASE("ReLU on CUDA keeps its output for backward, as the CPU engine does", "[gpu][layers]") {
  // Keeping x instead held one more activation per ReLU until backward (the BatchNorm
  // outputs of ResNet-50), while y is kept by the next layer anyway.
  for (bool on_gpu : {false, true}) {
    INFO((on_gpu ? "cuda" : "cpu"));
    const Device device = on_gpu ? gpu() : Device::cpu();
    ReLU relu("relu_saved");
    relu.to(device);
    SavedState s;
    const Tensor x = test::random_tensor({4, 9}, "relu_saved_x").to(device);
    const Tensor y = relu.forward({x}, context(true, device), s)[0];
    REQUIRE(s.tensors.size() == 1);
    CHECK(s.tensors[0].raw() == y.raw());
    CHECK(s.tensors[0].raw() != x.raw());
  }
}

TEST_CASE("Softmax: CUDA engine matches the CPU engine along any axis", "[gpu][layers]") {
  struct Case {
    Shape x;
    int64_t axis;
  };
  for (const Case& c : {Case{{6, 10}, -1}, Case{{3, 5, 4}, 1}, Case{{2, 3, 4, 5}, 0}, Case{{4, 300}, -1}}) {
    INFO("input " << shape_str(c.x) << ", axis " << c.axis);
    auto [a, b] = twins<Softmax>({c.x}, c.axis, "softmax");
    Tensor x = test::random_tensor(c.x, "softmax_x", -4.0f, 4.0f);
    Run r = run_both(*a, *b, {x}, true, "softmax");
    // Each exp(x - max) has |x - max| <= 8: the float argument carries 8 * 2^-24 and exp a
    // few ulps of its own (cuDNN's exp is not documented), about 1e-6 relative; the sum of K
    // terms adds K * 2^-24. Ten times that margin for the unknown exp.
    const int64_t k = c.x[static_cast<size_t>(c.axis < 0 ? c.axis + static_cast<int64_t>(c.x.size()) : c.axis)];
    const double rel = 1e-5 + static_cast<double>(k) * kUnitFp32;
    require_close(r.y_gpu[0], r.y_cpu[0], 1e-9, rel, "y");
    // dx = y * (dy - sum(dy * y)): y's error, times |dy - sum| <= 2, plus the sum's K * 2^-24.
    require_close(r.dx_gpu[0], r.dx_cpu[0], 4.0 * rel, 4.0 * rel, "dx");
  }
}

TEST_CASE("MaxPool2D: CUDA engine matches the CPU engine", "[gpu][layers]") {
  struct Case {
    Shape x;
    int64_t pool, stride, padding;
  };
  for (const Case& c : {Case{{2, 3, 8, 8}, 2, 0, 0}, Case{{2, 3, 9, 9}, 3, 2, 1}, Case{{1, 2, 7, 6}, 3, 1, 1}}) {
    INFO("input " << shape_str(c.x) << ", pool " << c.pool << ", stride " << c.stride << ", padding " << c.padding);
    auto [a, b] = twins<MaxPool2D>({c.x}, c.pool, c.stride, c.padding, "maxpool");
    Tensor x = test::random_tensor(c.x, "maxpool_x");  // no ties: the argmax is unique
    Run r = run_both(*a, *b, {x}, true, "maxpool");
    require_equal(r.y_gpu[0], r.y_cpu[0], "y");  // a selection: exact
    // Overlapping windows add up to ceil(pool / stride)^2 <= 9 values of |dy| <= 1 in some
    // order: 8 roundings of at most 2^-24 * 9.
    require_close(r.dx_gpu[0], r.dx_cpu[0], 8 * 9 * kUnitFp32, 0, "dx");
  }
}

TEST_CASE("MaxPool2D on CUDA: the first maximum wins, padding never does", "[gpu][layers]") {
  MaxPool2D pool(2, 2, 0, "ties");
  pool.to(gpu());
  SavedState s;
  RunContext rc = context(true, gpu());
  // Window of four equal values (as after a ReLU): the gradient goes to the first.
  Tensor x = Tensor::zeros({1, 1, 2, 2}, DType::f32, gpu());
  Tensor y = pool.forward({x}, rc, s)[0];
  CHECK(y.to_vector() == std::vector<float>{0.0f});
  Tensor dx = pool.backward({Tensor::full({1, 1, 1, 1}, 3.0, DType::f32, gpu())}, rc, s)[0];
  CHECK(dx.to_vector() == std::vector<float>{3.0f, 0.0f, 0.0f, 0.0f});

  // All inputs negative with padding 1: zero padding must not win.
  MaxPool2D padded(3, 1, 1, "padded");
  padded.to(gpu());
  SavedState s2;
  Tensor neg = Tensor::full({1, 1, 3, 3}, -2.0, DType::f32, gpu());
  std::vector<float> out = padded.forward({neg}, rc, s2)[0].to_vector();
  for (float v : out) CHECK(v == -2.0f);
}

TEST_CASE("MaxPool2D on CUDA: a NaN anywhere in a window is the output, as on the CPU", "[gpu][layers]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  {
    // One window, the NaN third (the review's case: a kernel that lets only a leading NaN
    // win outputs 3 here). The gradient goes to the NaN.
    MaxPool2D pool(2, 2, 0, "nan_last");
    pool.to(gpu());
    SavedState s;
    RunContext rc = context(true, gpu());
    Tensor x = Tensor::from_vector({1.0f, 2.0f, nan, 3.0f}, {1, 1, 2, 2}).to(gpu());
    std::vector<float> y = pool.forward({x}, rc, s)[0].to_vector();
    REQUIRE(y.size() == 1);
    CHECK(std::isnan(y[0]));
    Tensor dx = pool.backward({Tensor::full({1, 1, 1, 1}, 3.0, DType::f32, gpu())}, rc, s)[0];
    CHECK(dx.to_vector() == std::vector<float>{0.0f, 0.0f, 3.0f, 0.0f});
  }
  struct Case {
    Shape x;
    int64_t pool, stride, padding;
    int64_t nan_every;  // a NaN at every nan_every-th element
  };
  // 2x2 stride 2 (the CPU's branch-free loop): windows of 4 on 8 x 8, a NaN every 5th
  // element, so at most one per window and at every position within one. 3x3 windows with
  // overlap and padding (the CPU's general loop): several NaNs in some windows. All NaN on
  // the 2x2 loop: every window's gradient goes to its first element on both engines.
  for (const Case& c : {Case{{2, 3, 8, 8}, 2, 0, 0, 5}, Case{{2, 3, 9, 9}, 3, 2, 1, 7},
                        Case{{1, 2, 7, 6}, 3, 1, 1, 11}, Case{{1, 1, 4, 4}, 2, 0, 0, 1}}) {
    INFO("input " << shape_str(c.x) << ", pool " << c.pool << ", stride " << c.stride << ", padding " << c.padding);
    auto [a, b] = twins<MaxPool2D>({c.x}, c.pool, c.stride, c.padding, "maxpool_nan");
    Tensor x = test::random_tensor(c.x, "maxpool_nan_x");
    float* xs = x.data<float>();
    for (int64_t i = c.nan_every / 2; i < x.numel(); i += c.nan_every) xs[i] = nan;
    Run r = run_both(*a, *b, {x}, true, "maxpool_nan");
    int64_t nans = 0;
    for (float v : r.y_cpu[0].to_vector()) nans += std::isnan(v);
    REQUIRE(nans > 0);  // the case tests something
    // A selection: NaN exactly where the CPU has NaN (require_equal takes NaN == NaN),
    // every other value equal.
    require_equal(r.y_gpu[0], r.y_cpu[0], "y");
    // The gradient goes to the same element on both sides (the window's first NaN); sums
    // over overlapping windows as in the case without NaNs above.
    require_close(r.dx_gpu[0], r.dx_cpu[0], 8 * 9 * kUnitFp32, 0, "dx");
  }
}

TEST_CASE("ReLU on CUDA: NaN, infinities and signed zeros as on the CPU", "[gpu][layers]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {nan, -nan, inf, -inf, 0.0f, -0.0f, 0.5f, -0.5f, 2.0f, -2.0f};
  auto [a, b] = twins<ReLU>({{2, 10}}, "relu_special");
  std::vector<float> v = special;
  v.insert(v.end(), special.rbegin(), special.rend());
  Run r = run_both(*a, *b, {Tensor::from_vector(v, {2, 10})}, true, "relu_special");
  // The CPU engine's rule, y = x > 0 ? x : 0: a NaN gives 0, and so does its gradient.
  require_equal(r.y_gpu[0], r.y_cpu[0], "y");
  require_equal(r.dx_gpu[0], r.dx_cpu[0], "dx");
  std::vector<float> y = r.y_gpu[0].to_vector(), dx = r.dx_gpu[0].to_vector();
  for (size_t i : {size_t{0}, size_t{1}, size_t{18}, size_t{19}}) {
    INFO("element " << i << " (NaN)");
    CHECK(y[i] == 0.0f);  // also fails for a NaN, which require_equal lets pass on both sides
    CHECK(dx[i] == 0.0f);
  }
  CHECK(y[2] == inf);
  CHECK(y[3] == 0.0f);
}

TEST_CASE("AvgPool2D and GlobalAveragePool: CUDA engines match the CPU engines", "[gpu][layers]") {
  struct Case {
    Shape x;
    int64_t pool, stride, padding;
  };
  for (const Case& c : {Case{{2, 3, 8, 8}, 2, 0, 0}, Case{{2, 2, 7, 7}, 3, 2, 1}, Case{{1, 3, 5, 6}, 2, 1, 1}}) {
    INFO("input " << shape_str(c.x) << ", pool " << c.pool << ", stride " << c.stride << ", padding " << c.padding);
    auto [a, b] = twins<AvgPool2D>({c.x}, c.pool, c.stride, c.padding, "avgpool");
    Tensor x = test::random_tensor(c.x, "avgpool_x");
    Run r = run_both(*a, *b, {x}, true, "avgpool");
    // A mean of at most 9 values in [-1, 1] (padding excluded from the count): 9 roundings.
    require_close(r.y_gpu[0], r.y_cpu[0], 10 * kUnitFp32, kUlp, "y");
    // dx adds dy / count over at most 9 overlapping windows.
    require_close(r.dx_gpu[0], r.dx_cpu[0], 10 * kUnitFp32, kUlp, "dx");
  }
  {
    auto [a, b] = twins<GlobalAveragePool>({{2, 3, 7, 5}}, "gap");
    Tensor x = test::random_tensor({2, 3, 7, 5}, "gap_x");
    Run r = run_both(*a, *b, {x}, true, "gap");
    // A sum of 35 values in [-1, 1], then a division: 36 roundings at most.
    require_close(r.y_gpu[0], r.y_cpu[0], 36 * kUnitFp32, kUlp, "y");
    // dy / 35 (or dy * (1/35)): one or two roundings.
    require_close(r.dx_gpu[0], r.dx_cpu[0], 0, 2 * kUlp, "dx");
  }
}

TEST_CASE("Dropout: the CUDA mask equals the CPU mask bit for bit", "[gpu][layers]") {
  for (double rate : {0.3, 0.5, 0.9}) {
    INFO("rate " << rate);
    auto [a, b] = twins<Dropout>({{4, 50}}, rate, "dropout");
    Tensor x = test::random_tensor({4, 50}, "dropout_x");
    Run r = run_both(*a, *b, {x}, true, "dropout");
    require_equal(r.y_gpu[0], r.y_cpu[0], "y");  // same Philox bits, same float scale
    require_equal(r.dx_gpu[0], r.dx_cpu[0], "dx");
    int kept = 0;
    for (float v : r.y_gpu[0].to_vector()) kept += v != 0.0f;
    CHECK(kept > 0);
    CHECK(kept < 200);
  }
}

TEST_CASE("Flatten and Add work on CUDA tensors", "[gpu][layers]") {
  auto [fa, fb] = twins<Flatten>({{2, 3, 4, 5}}, "flatten");
  Run rf = run_both(*fa, *fb, {test::random_tensor({2, 3, 4, 5}, "flatten_x")}, true, "flatten");
  CHECK(rf.y_gpu[0].shape() == Shape{2, 60});
  require_equal(rf.y_gpu[0], rf.y_cpu[0], "flatten y");
  require_equal(rf.dx_gpu[0], rf.dx_cpu[0], "flatten dx");

  auto [aa, ab] = twins<Add>({{3, 7}, {3, 7}, {3, 7}}, "add");
  Run ra = run_both(*aa, *ab,
                    {test::random_tensor({3, 7}, "add_a"), test::random_tensor({3, 7}, "add_b"),
                     test::random_tensor({3, 7}, "add_c")},
                    true, "add");
  // Sums of three floats in the same order on both sides: exact.
  require_equal(ra.y_gpu[0], ra.y_cpu[0], "add y");
  for (size_t i = 0; i < ra.dx_cpu.size(); ++i) require_equal(ra.dx_gpu[i], ra.dx_cpu[i], "add dx");
}

TEST_CASE("SoftmaxCrossEntropy: CUDA engine matches the CPU engine", "[gpu][losses]") {
  struct Case {
    int64_t rows, classes;
    double smoothing;
    DType label_type;
    int64_t global_batch;
  };
  for (const Case& c : {Case{12, 10, 0.1, DType::i64, 20}, Case{7, 1000, 0.0, DType::i32, 7},
                        Case{5, 3, 0.5, DType::i64, 5}}) {
    INFO("rows " << c.rows << ", classes " << c.classes << ", smoothing " << c.smoothing);
    SoftmaxCrossEntropy loss(c.smoothing, -100);
    Tensor logits = test::random_tensor({c.rows, c.classes}, "xent_logits", -5.0f, 5.0f);
    Tensor labels = test::random_labels(c.rows, c.classes, "xent_labels", c.label_type);
    // Two ignored rows (padding).
    if (c.label_type == DType::i64) {
      labels.data<int64_t>()[1] = -100;
      labels.data<int64_t>()[3] = -100;
    } else {
      labels.data<int32_t>()[1] = -100;
      labels.data<int32_t>()[3] = -100;
    }
    SavedState sa, sb;
    Tensor la = loss.forward(logits, labels, c.global_batch, sa);
    Tensor lb = loss.forward(logits.to(gpu()), labels.to(gpu()), c.global_batch, sb);
    REQUIRE(lb.device() == gpu());
    REQUIRE(lb.numel() == 1);
    // The same double arithmetic per row (losses_cuda.cu); only the order of the double
    // sums differs. The result is rounded to float once: 2^-24 relative, with margin.
    require_close(lb, la, 1e-7, 4 * kUnitFp32, "loss");
    Tensor ga = loss.backward(sa, 2.0);
    Tensor gb = loss.backward(sb, 2.0);
    // (softmax - target) * scale / batch with the CPU's float operations; a probability
    // may differ in its last bit (double rounding of a sum taken in another order).
    const double f = 2.0 / static_cast<double>(c.global_batch);
    require_close(gb, ga, 4 * kUnitFp32 * f, 4 * kUnitFp32, "grad");
    std::vector<float> g = gb.to_vector();
    for (int64_t j = 0; j < c.classes; ++j) {
      CHECK(g[static_cast<size_t>(1 * c.classes + j)] == 0.0f);  // ignored row
    }
  }
}

TEST_CASE("SoftmaxCrossEntropy on CUDA rejects a label outside [0, K) like the CPU", "[gpu][losses]") {
  SoftmaxCrossEntropy loss;
  Tensor logits = test::random_tensor({4, 5}, "bad_logits").to(gpu());
  Tensor labels = Tensor::from_data<int64_t>(std::vector<int64_t>{0, 4, 5, 1}.data(), {4}).to(gpu());
  SavedState s;
  try {
    loss.forward(logits, labels, 4, s);
    FAIL("label 5 of 5 classes was accepted");
  } catch (const InputError& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("label 5") != std::string::npos);
    CHECK(msg.find("sample 2") != std::string::npos);
  }
}

TEST_CASE("MeanSquaredError: CUDA engine matches the CPU engine", "[gpu][losses]") {
  MeanSquaredError loss;
  Tensor p = test::random_tensor({8, 5}, "mse_p");
  Tensor t = test::random_tensor({8, 5}, "mse_t");
  SavedState sa, sb;
  Tensor la = loss.forward(p, t, 10, sa);
  Tensor lb = loss.forward(p.to(gpu()), t.to(gpu()), 10, sb);
  // The same float differences, squared and summed in double in another order.
  require_close(lb, la, 0, 1e-6, "loss");
  // 2 (p - t) * scale / (batch * D): the same float operations on both sides.
  require_equal(loss.backward(sb, 3.0), loss.backward(sa, 3.0), "grad");
}

TEST_CASE("Accuracy and top-k accuracy: CUDA counts equal the CPU counts", "[gpu][metrics]") {
  // Ties decide by index (stable order): row 0 ties the label with an earlier class.
  Tensor scores = test::random_tensor({40, 12}, "acc_scores");
  Tensor labels = test::random_labels(40, 12, "acc_labels");
  scores.data<float>()[0 * 12 + 2] = 5.0f;
  scores.data<float>()[0 * 12 + 7] = 5.0f;
  labels.data<int64_t>()[0] = 7;  // tied with class 2, which ranks first
  scores.data<float>()[1 * 12 + 4] = 5.0f;
  labels.data<int64_t>()[1] = 4;  // a clear hit
  labels.data<int64_t>()[2] = -1; // ignored (ignore_index -1 below)
  for (int64_t k : {1, 3, 12}) {
    INFO("k " << k);
    TopKAccuracy ma(k, -1), mb(k, -1);
    ma.update(scores, labels);
    mb.update(scores.to(gpu()), labels.to(gpu()));
    CHECK(mb.total() == ma.total());
    CHECK(mb.count() == ma.count());
    CHECK(mb.count() == 39);
    if (k == 12) CHECK(mb.total() == 39);
  }
  Accuracy top1(-1);
  top1.update(scores.slice_rows(0, 2).to(gpu()), labels.slice_rows(0, 2).to(gpu()));
  CHECK(top1.total() == 1);  // row 0 loses the tie, row 1 hits
  CHECK(top1.count() == 2);
}

TEST_CASE("Accuracy on CUDA counts a row with a NaN or an infinity as wrong, as on the CPU", "[gpu][metrics]") {
  // 300 classes: more than one warp per row, so the non-finite score sits in another
  // thread than the label in most rows, and the block's reduction must carry it.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t rows = 64, classes = 300;
  Tensor scores = test::random_tensor({rows, classes}, "acc_nan_scores");
  Tensor labels = test::random_labels(rows, classes, "acc_nan_labels");
  float* s = scores.data<float>();
  int64_t* l = labels.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) s[r * classes + l[r]] = 10.0f;  // every label first
  const float specials[] = {nan, -nan, inf, -inf};
  for (int64_t r = 0; r < rows / 2; ++r) {  // the first half: one non-finite score each
    const int64_t at = r % 4 == 0 ? l[r] : (l[r] + 1 + 37 * r) % classes;
    s[r * classes + at] = specials[r % 4];
  }
  for (int64_t k : {1, 5}) {
    INFO("k " << k);
    TopKAccuracy cpu(k), cuda(k);
    cpu.update(scores, labels);
    cuda.update(scores.to(gpu()), labels.to(gpu()));
    CHECK(cpu.total() == rows / 2);  // the finite half
    CHECK(cuda.total() == cpu.total());
    CHECK(cuda.count() == rows);
  }
  for (DType dt : {DType::f16, DType::bf16}) {  // the half types' NaN and infinity too
    INFO(dtype_name(dt));
    Accuracy cuda;
    cuda.update(ops::cast(Tensor::full({8, classes}, nan, DType::f32).to(gpu()), dt),
                Tensor::zeros({8}, DType::i64, gpu()));
    CHECK(cuda.total() == 0);
    CHECK(cuda.count() == 8);
  }
}

// Run by the CTest entry layers_cuda_deterministic with TNT_DETERMINISTIC=1: two identical
// backward passes give bitwise-equal gradients.
TEST_CASE("deterministic mode: repeated backward passes are bitwise equal", "[.deterministic]") {
  REQUIRE(tnt::config().deterministic);
  const Shape xs{8, 16, 14, 14};
  Tensor x = test::random_tensor(xs, "det_x");
  auto grads = [&] {
    Conv2D conv(32, 3, Conv2DOptions{.stride = 1, .padding = 1}, "det_conv");
    BatchNorm bn("det_bn");
    MaxPool2D pool(3, 2, 1, "det_pool");
    Dense dense(10, DenseOptions{}, "det_dense");
    for (Layer* l : std::initializer_list<Layer*>{&conv, &bn, &pool, &dense}) l->to(gpu());
    RunContext rc = context(true, gpu());
    SavedState s1, s2, s3, s4;
    Tensor h = conv.forward({x.to(gpu())}, rc, s1)[0];
    h = bn.forward({h}, rc, s2)[0];
    h = pool.forward({h}, rc, s3)[0];
    h = h.reshape({xs[0], -1});
    dense.ensure_built({h.shape()});
    dense.initialize(3);
    Tensor y = dense.forward({h}, rc, s4)[0];
    Tensor dh = dense.backward({y}, rc, s4)[0].reshape({xs[0], 32, 7, 7});
    dh = pool.backward({dh}, rc, s3)[0];
    dh = bn.backward({dh}, rc, s2)[0];
    Tensor dx = conv.backward({dh}, rc, s1)[0];
    return std::vector<Tensor>{dx, conv.weight().grad.clone(), conv.bias()->grad.clone(), bn.weight()->grad.clone(),
                               dense.weight().grad.clone()};
  };
  std::vector<Tensor> first = grads(), second = grads();
  for (size_t i = 0; i < first.size(); ++i) require_equal(second[i], first[i], "gradient " + std::to_string(i));
}
