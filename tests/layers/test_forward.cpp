// Forward values against small hand-computed cases, BatchNorm statistics, Dropout.
#include "gradcheck.hpp"

#include "tarantella/layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

using namespace tnt;

namespace {
std::vector<Tensor> run(Layer& layer, const std::vector<Tensor>& inputs, const RunContext& rc = {}) {
  SavedState s;
  return layer.forward(inputs, rc, s);
}
void check_values(const Tensor& t, const std::vector<float>& expected, double margin = 1e-5) {
  std::vector<float> v = t.to_vector();
  REQUIRE(v.size() == expected.size());
  for (size_t i = 0; i < v.size(); ++i) CHECK(v[i] == Approx(expected[i]).margin(margin));
}
}  // namespace

TEST_CASE("Dense forward: y = x W^T + b", "[forward]") {
  Dense d(2, {}, "d");
  d.ensure_built({{1, 2}});
  d.weight().value.copy_from(Tensor::from_vector({1, 2, 3, 4}, {2, 2}));  // (out, in)
  d.bias()->value.copy_from(Tensor::from_vector({1, -1}, {2}));
  Tensor y = run(d, {Tensor::from_vector({1, 1, 2, 0}, {2, 2})})[0];
  CHECK(y.shape() == Shape{2, 2});
  check_values(y, {4, 6, 3, 5});
  CHECK(d.weight().value.shape() == Shape{2, 2});
  CHECK(d.named_parameters()[0].first == "d.weight");
  CHECK(d.named_parameters()[1].first == "d.bias");
  CHECK(d.parameter_count() == 6);
}

TEST_CASE("Conv2D forward with a known kernel", "[forward]") {
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  SECTION("2x2 ones, no padding") {
    Conv2D c(1, 2, {.use_bias = false}, "c");
    c.ensure_built({x.shape()});
    c.weight().value.fill_(1.0);
    Tensor y = run(c, {x})[0];
    CHECK(y.shape() == Shape{1, 1, 2, 2});
    check_values(y, {12, 16, 24, 28});
  }
  SECTION("3x3 centre-right kernel, padding 1, stride 2, bias, two filters") {
    Conv2D c(2, 3, {.stride = 2, .padding = 1}, "c2");
    c.ensure_built({x.shape()});
    // filter 0 picks the right neighbour (cross-correlation, not convolution); filter 1 sums all.
    std::vector<float> w(18, 0.0f);
    w[5] = 1;
    for (int i = 9; i < 18; ++i) w[i] = 1;
    c.weight().value.copy_from(Tensor::from_vector(w, {2, 1, 3, 3}));
    c.bias()->value.copy_from(Tensor::from_vector({0.5f, -1}, {2}));
    Tensor y = run(c, {x})[0];
    CHECK(y.shape() == Shape{1, 2, 2, 2});
    // outputs at input positions (0,0), (0,2), (2,0), (2,2)
    check_values(y, {2.5f, 0.5f, 8.5f, 0.5f, 12 - 1, 16 - 1, 24 - 1, 28 - 1});
    CHECK(c.weight().value.shape() == Shape{2, 1, 3, 3});  // PyTorch layout (out, in, kh, kw)
  }
  SECTION("bad input names the layer") {
    Conv2D c(1, 5, "small");
    CHECK_THROWS_WITH(run(c, {x}), Catch::Contains("small") && Catch::Contains("smaller than"));
    Conv2D c2(1, 2, "rank");
    CHECK_THROWS_WITH(run(c2, {Tensor::zeros({3, 3})}), Catch::Contains("(N, C, H, W)"));
  }
}

TEST_CASE("Pooling forward values", "[forward]") {
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {1, 1, 4, 4});
  MaxPool2D mp(2, "mp");
  check_values(run(mp, {x})[0], {6, 8, 14, 16});
  AvgPool2D ap(2, "ap");
  check_values(run(ap, {x})[0], {3.5f, 5.5f, 11.5f, 13.5f});
  // 3x3 stride 2 padding 1 on 4x4: the corner window sees 4 real values, averaged over 4.
  AvgPool2D ap3(3, 2, 1, "ap3");
  Tensor y = run(ap3, {x})[0];
  CHECK(y.shape() == Shape{1, 1, 2, 2});
  check_values(y, {(1 + 2 + 5 + 6) / 4.0f, (2 + 3 + 4 + 6 + 7 + 8) / 6.0f, (5 + 6 + 9 + 10 + 13 + 14) / 6.0f,
                   (6 + 7 + 8 + 10 + 11 + 12 + 14 + 15 + 16) / 9.0f});
  MaxPool2D mp3(3, 2, 1, "mp3");
  check_values(run(mp3, {Tensor::from_vector({-1, -2, -3, -4, -5, -6, -7, -8, -9}, {1, 1, 3, 3})})[0],
               {-1, -2, -4, -5});  // padding never wins, even against negatives
  GlobalAveragePool gap("gap");
  Tensor g = run(gap, {x})[0];
  CHECK(g.shape() == Shape{1, 1});
  check_values(g, {8.5f});
  CHECK_THROWS_WITH(MaxPool2D(2, 1, 2, "badpad"), Catch::Contains("badpad") && Catch::Contains("padding"));
}

TEST_CASE("MaxPool2D sends the gradient of a tie to one element", "[forward]") {
  MaxPool2D mp(2, "tie");
  Tensor x = Tensor::full({1, 1, 2, 2}, 3.0);
  SavedState s;
  mp.forward({x}, {}, s);
  Tensor dx = mp.backward({Tensor::full({1, 1, 1, 1}, 1.0)}, {}, s)[0];
  std::vector<float> v = dx.to_vector();
  CHECK(v[0] + v[1] + v[2] + v[3] == 1.0f);
  CHECK(v[0] == 1.0f);  // the first maximum in row-major order
}

TEST_CASE("MaxPool2D propagates NaN (the 2x2 fast path and the general path)", "[forward]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  MaxPool2D fast(2, "nan2");
  std::vector<float> y = run(fast, {Tensor::from_vector({1, 2, nan, 0, 5, 6, 7, 8}, {1, 1, 2, 4})})[0].to_vector();
  CHECK(y[0] == 6);  // windows (1 2 / 5 6) and (nan 0 / 7 8)
  CHECK(std::isnan(y[1]));
  MaxPool2D general(3, 1, 1, "nan3");
  std::vector<float> z = run(general, {Tensor::from_vector({nan, 1, 2, 3}, {1, 1, 2, 2})})[0].to_vector();
  for (float v : z) CHECK(std::isnan(v));
}

TEST_CASE("MaxPool2D sends the gradient of a window with several NaNs to the first one", "[forward]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Windows of the 2x2 stride-2 fast path: (nan nan / 1 2), (3 4 / nan nan), (5 nan / nan 6).
  const std::vector<float> xs = {nan, nan, 3, 4, 5, nan,  //
                                 1, 2, nan, nan, nan, 6};
  const std::vector<int> first_nan = {0, 8, 5};  // row-major index of each window's first NaN
  MaxPool2D mp(2, "nans");
  SavedState s;
  std::vector<float> y = mp.forward({Tensor::from_vector(xs, {1, 1, 2, 6})}, {}, s)[0].to_vector();
  for (float v : y) CHECK(std::isnan(v));
  std::vector<float> dx = mp.backward({Tensor::full({1, 1, 1, 3}, 1.0)}, {}, s)[0].to_vector();
  for (size_t i = 0; i < dx.size(); ++i) {
    INFO("element " << i);
    const bool gets = std::find(first_nan.begin(), first_nan.end(), static_cast<int>(i)) != first_nan.end();
    CHECK(dx[i] == (gets ? 1.0f : 0.0f));
  }
}

TEST_CASE("MaxPool2D 2x2: the gradient is 0 + dy, as in the general loop (no -0 comes through)", "[forward]") {
  // 40 columns: the fast path's runs of 8 windows and its tail; the general loop (3x3,
  // stride 3) zeroes dx and adds, so a -0 gradient arrives as +0 in both.
  for (int64_t k : {2, 3}) {
    MaxPool2D mp(k, "signed_zero");
    SavedState s;
    Tensor x = Tensor::from_vector(std::vector<float>(2 * 6 * 40, 1.0f), {1, 2, 6, 40});
    Tensor y = mp.forward({x}, {}, s)[0];
    Tensor dx = mp.backward({Tensor::full(y.shape(), -0.0)}, {}, s)[0];
    int negative = 0;
    for (float v : dx.to_vector()) negative += std::signbit(v) ? 1 : 0;
    INFO("pool " << k);
    CHECK(negative == 0);
  }
}

TEST_CASE("ReLU, Softmax, Flatten, Add values", "[forward]") {
  ReLU relu("r");
  check_values(run(relu, {Tensor::from_vector({-1, 0, 2}, {3})})[0], {0, 0, 2});
  Softmax sm("sm");
  float e = std::exp(1.0f);
  check_values(run(sm, {Tensor::from_vector({0, 1, 1000, 1000}, {2, 2})})[0], {1 / (1 + e), e / (1 + e), 0.5f, 0.5f});
  Flatten f("f");
  Tensor y = run(f, {Tensor::zeros({2, 3, 4, 5})})[0];
  CHECK(y.shape() == Shape{2, 60});
  Add add("add");
  check_values(run(add, {Tensor::from_vector({1, 2}, {2}), Tensor::from_vector({10, 20}, {2})})[0], {11, 22});
  CHECK_THROWS_WITH(run(add, {Tensor::zeros({2}), Tensor::zeros({3})}), Catch::Contains("add"));
}

TEST_CASE("ReLU maps a NaN to 0 (y = x > 0 ? x : 0), and its gradient too", "[forward]") {
  // The rule layers/activation_cuda.hpp states and the GPU tests hold the CUDA engine to.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  ReLU relu("r_nan");
  SavedState s;
  std::vector<float> y = relu.forward({Tensor::from_vector({nan, -nan, inf, -inf}, {4})}, {}, s)[0].to_vector();
  CHECK(y == std::vector<float>{0.0f, 0.0f, inf, 0.0f});
  std::vector<float> dx = relu.backward({Tensor::full({4}, 1.0)}, {}, s)[0].to_vector();
  CHECK(dx == std::vector<float>{0.0f, 0.0f, 1.0f, 0.0f});
}

TEST_CASE("BatchNorm: batch statistics, running averages, inference", "[forward]") {
  BatchNorm bn({.momentum = 0.1, .epsilon = 1e-5}, "bn");
  // channel 0: values 1..8, channel 1: 2 * (1..8); N = 2, H = 2, W = 2
  std::vector<float> xs(16);
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 4; ++i) xs[(n * 2 + c) * 4 + i] = static_cast<float>((c + 1) * (n * 4 + i + 1));
  Tensor x = Tensor::from_vector(xs, {2, 2, 2, 2});
  RunContext train;
  train.training = true;
  Tensor y = run(bn, {x}, train)[0];
  std::vector<float> yv = y.to_vector();
  for (int c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) mean += yv[(n * 2 + c) * 4 + i] / 8.0;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) var += std::pow(yv[(n * 2 + c) * 4 + i] - mean, 2) / 8.0;
    CHECK(mean == Approx(0).margin(1e-6));
    CHECK(var == Approx(1).epsilon(1e-4));  // biased variance 5.25 * c^2 + eps: 1 within 1e-5 / 5.25
  }
  // batch mean 4.5 c, unbiased variance 6 c^2 (8 values 1..8: 42 / 7)
  check_values(bn.running_mean().value, {0.45f, 0.9f});
  check_values(bn.running_var().value, {0.9f + 0.6f, 0.9f + 2.4f});
  CHECK(bn.named_buffers()[0].first == "bn.running_mean");
  CHECK(bn.named_buffers()[1].first == "bn.running_var");
  // PyTorch's counter of training batches: i64, a scalar, in host memory; one training
  // forward so far.
  REQUIRE(bn.named_buffers().size() == 3);
  CHECK(bn.named_buffers()[2].first == "bn.num_batches_tracked");
  CHECK(bn.num_batches_tracked().value.dtype() == DType::i64);
  CHECK(bn.num_batches_tracked().value.shape() == Shape{});
  CHECK(bn.num_batches_tracked().value.data<int64_t>()[0] == 1);

  // Inference: (x - running_mean) / sqrt(running_var + eps) * weight + bias
  bn.weight()->value.copy_from(Tensor::from_vector({2, 1}, {2}));
  bn.bias()->value.copy_from(Tensor::from_vector({1, 0}, {2}));
  Tensor yi = run(bn, {x}, RunContext{})[0];
  std::vector<float> yiv = yi.to_vector();
  CHECK(yiv[0] == Approx((1 - 0.45) / std::sqrt(1.5 + 1e-5) * 2 + 1).epsilon(1e-6));
  CHECK(yiv[4] == Approx((2 - 0.9) / std::sqrt(3.3 + 1e-5)).epsilon(1e-6));
  check_values(bn.running_mean().value, {0.45f, 0.9f});  // inference leaves them alone
  CHECK(bn.num_batches_tracked().value.data<int64_t>()[0] == 1);
  run(bn, {x}, train);
  CHECK(bn.num_batches_tracked().value.data<int64_t>()[0] == 2);

  BatchNorm one("bn_one");
  CHECK_THROWS_WITH(run(one, {Tensor::zeros({1, 3})}, train), Catch::Contains("more than one value"));
}

TEST_CASE("Dropout: scaling, determinism, rank independence", "[forward][dropout]") {
  Dropout drop(0.3, "drop");
  const int64_t n = 1000, d = 100;
  Tensor x = Tensor::full({n, d}, 2.0);
  RunContext rc;
  rc.training = true;
  rc.seed = 11;
  rc.step = 5;
  Tensor y1 = run(drop, {x}, rc)[0];
  Tensor y2 = run(drop, {x}, rc)[0];
  CHECK(y1.to_vector() == y2.to_vector());  // same (seed, name, step): same mask
  std::vector<float> v = y1.to_vector();
  int64_t kept = 0, neither = 0;
  const float scaled = static_cast<float>(2.0 * (1.0 / 0.7));
  for (float f : v) {
    kept += f == scaled;
    neither += f != scaled && f != 0.0f;
  }
  CHECK(neither == 0);  // every element is dropped or scaled by 1 / (1 - rate)
  // Kept fraction: binomial(1e5, 0.7) has stddev 0.0014; 0.01 is seven of them.
  CHECK(static_cast<double>(kept) / (n * d) == Approx(0.7).margin(0.01));

  RunContext other = rc;
  other.step = 6;
  CHECK(run(drop, {x}, other)[0].to_vector() != v);  // a new step draws a new mask

  // Rank r with samples [400, 1000) draws what a single rank drew for those samples.
  RunContext part = rc;
  part.sample_offset = 400;
  std::vector<float> tail = run(drop, {x.slice_rows(400, 1000)}, part)[0].to_vector();
  CHECK(std::equal(tail.begin(), tail.end(), v.begin() + 400 * d));

  CHECK(run(drop, {x}, RunContext{})[0].to_vector() == x.to_vector());  // inference: identity
  // Empty inputs (a batch of 0 rows, or 0 features), anywhere in the counter stream.
  for (const Shape& shape : {Shape{0, d}, Shape{5, 0}}) {
    SavedState s;
    Tensor empty = Tensor::zeros(shape);
    CHECK(drop.forward({empty}, part, s)[0].shape() == shape);
    CHECK(drop.backward({empty}, part, s)[0].numel() == 0);
  }
  CHECK_THROWS_WITH(Dropout(1.0, "bad"), Catch::Contains("bad") && Catch::Contains("rate"));
}

TEST_CASE("a layer's bad configuration is the user's error (InputError: exit 2, no source location)", "[forward]") {
  CHECK_THROWS_AS(Dense(0, "d0"), InputError);
  CHECK_THROWS_AS(Conv2D(0, 3, "c0"), InputError);
  CHECK_THROWS_AS(Dropout(1.0, "bad"), InputError);
  CHECK_THROWS_AS(MaxPool2D(0, 1, 0, "p0"), InputError);
  Add add("add_shapes");
  CHECK_THROWS_AS(add.output_shapes({{2, 3}, {2, 4}}), InputError);
}

TEST_CASE("layers check their inputs", "[forward]") {
  Dense d(2, "dense_check");
  CHECK_THROWS_WITH(run(d, {}), Catch::Contains("dense_check") && Catch::Contains("expects 1 input"));
  std::vector<int32_t> ints{1, 2};
  CHECK_THROWS_WITH(run(d, {Tensor::from_data(ints.data(), {1, 2})}), Catch::Contains("floating"));
  run(d, {Tensor::zeros({1, 3})});
  CHECK_THROWS_WITH(run(d, {Tensor::zeros({1, 4})}), Catch::Contains("3 features"));
  ReLU unnamed;
  CHECK(unnamed.name().rfind("relu", 0) == 0);
  CHECK(unnamed.has_default_name());
  unnamed.set_name("r1");
  CHECK_FALSE(unnamed.has_default_name());
}

namespace {
// A composite layer, as the Transformer's blocks will be: two Dense children.
class Block : public Layer {
 public:
  explicit Block(std::string name) : Layer(std::move(name)) {
    a_ = std::make_shared<Dense>(3, DenseOptions{}, "a");
    b_ = std::make_shared<Dense>(2, DenseOptions{.use_bias = false}, "b");
    add_child(a_);
    add_child(b_);
  }
  std::string type() const override { return "Block"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override {
    return b_->output_shapes(a_->output_shapes(in));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext& rc, SavedState& saved) override {
    auto states = std::make_shared<std::pair<SavedState, SavedState>>();
    auto h = a_->forward(in, rc, states->first);
    auto y = b_->forward(h, rc, states->second);
    saved.extra = states;
    return y;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext& rc, SavedState& saved) override {
    auto states = std::static_pointer_cast<std::pair<SavedState, SavedState>>(saved.extra);
    return a_->backward(b_->backward(g, rc, states->second), rc, states->first);
  }
  std::shared_ptr<Dense> a_, b_;
};
}  // namespace

TEST_CASE("a composite layer nests its children's names", "[forward]") {
  Block block("block");
  block.a_->ensure_built({{1, 4}});
  block.b_->ensure_built({{1, 3}});
  std::vector<std::string> names;
  for (auto& [n, p] : block.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"block.a.weight", "block.a.bias", "block.b.weight"});
  CHECK(block.parameter_count() == 4 * 3 + 3 + 3 * 2);
  // Initialised under the full names: a standalone Dense called "block.a" draws the same.
  block.initialize(5);
  Dense alone(3, {}, "block.a");
  alone.ensure_built({{1, 4}});
  alone.initialize(5);
  CHECK(alone.weight().value.to_vector() == block.a_->weight().value.to_vector());
  RunContext rc;
  rc.training = true;
  test::check_layer(block, {test::random_tensor({2, 4}, 1, "x")}, rc);
}

TEST_CASE("CPU engines are bitwise reproducible", "[forward]") {
  auto once = [] {
    Conv2D conv(16, 3, {.padding = 1}, "det_conv");
    BatchNorm bn("det_bn");
    conv.ensure_built({{4, 8, 6, 6}});
    conv.initialize(3);
    RunContext rc;
    rc.training = true;
    SavedState s1, s2;
    Tensor x = test::random_tensor({4, 8, 6, 6}, 1, "x");
    Tensor h = conv.forward({x}, rc, s1)[0];
    Tensor y = bn.forward({h}, rc, s2)[0];
    Tensor dx = conv.backward(bn.backward({test::random_tensor(y.shape(), 2, "dy")}, rc, s2), rc, s1)[0];
    std::vector<float> all = y.to_vector();
    for (float v : dx.to_vector()) all.push_back(v);
    for (float v : conv.weight().grad.to_vector()) all.push_back(v);
    for (float v : bn.running_var().value.to_vector()) all.push_back(v);
    return all;
  };
  CHECK(once() == once());
}
