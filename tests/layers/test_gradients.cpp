// Finite-difference gradient checks for every layer and loss on the CPU (gradcheck.hpp has
// the method and the reasoning behind the tolerance).
#include "gradcheck.hpp"

#include "tarantella/layers.hpp"

using namespace tnt;
using tnt::test::GradCheck;

namespace {
RunContext training() {
  RunContext rc;
  rc.training = true;
  rc.seed = 7;
  rc.step = 3;
  return rc;
}
}  // namespace

TEST_CASE("gradient: Dense on (N, D) and (B, T, D)", "[grad]") {
  Dense dense(5, {}, "fc");
  dense.ensure_built({{3, 4}});
  dense.initialize(1);
  // A zero-initialised bias would hide a bias gradient that is added to the wrong place.
  dense.bias()->value.copy_from(test::random_tensor({5}, 1, "b"));
  test::check_layer(dense, {test::random_tensor({3, 4}, 1, "x")}, training());
  test::check_layer(dense, {test::random_tensor({2, 3, 4}, 1, "x3")}, training());

  Dense nobias(3, {.use_bias = false}, "fc_nobias");
  test::check_layer(nobias, {test::random_tensor({2, 6}, 2, "x")}, training());
  CHECK(nobias.parameters().size() == 1);
}

TEST_CASE("gradient: Conv2D with stride, padding and bias", "[grad]") {
  struct Case {
    int64_t c, f, k, s, p, h, w;
    bool bias;
  };
  for (Case t : {Case{3, 4, 3, 1, 1, 5, 5, true}, Case{2, 3, 3, 2, 0, 7, 6, false}, Case{1, 2, 2, 2, 1, 5, 5, true},
                 Case{16, 16, 3, 1, 1, 4, 4, true}}) {
    DYNAMIC_SECTION("C" << t.c << " F" << t.f << " k" << t.k << " s" << t.s << " p" << t.p) {
      Conv2D conv(t.f, t.k, {.stride = t.s, .padding = t.p, .use_bias = t.bias}, "conv");
      conv.ensure_built({{2, t.c, t.h, t.w}});
      conv.initialize(3);
      if (t.bias) conv.bias()->value.copy_from(test::random_tensor({t.f}, 3, "b"));
      // Sixteen channels make oneDNN choose blocked layouts (the reorder path); there, every
      // 7th element (a stride prime to every dimension) keeps the test fast.
      GradCheck opt;
      opt.every = t.c >= 16 ? 7 : 1;
      test::check_layer(conv, {test::random_tensor({2, t.c, t.h, t.w}, 3, "x")}, training(), opt);
    }
  }
}

TEST_CASE("gradient: BatchNorm in training and inference", "[grad]") {
  SECTION("training, (N, C, H, W)") {
    BatchNorm bn("bn");
    bn.ensure_built({{3, 2, 3, 3}});
    bn.initialize(1);
    bn.weight()->value.copy_from(test::random_tensor({2}, 4, "gamma", 0.5, 1.5));
    bn.bias()->value.copy_from(test::random_tensor({2}, 4, "beta"));
    test::check_layer(bn, {test::random_tensor({3, 2, 3, 3}, 4, "x")}, training());
  }
  SECTION("training, (N, C)") {
    BatchNorm bn("bn2d");
    test::check_layer(bn, {test::random_tensor({6, 3}, 5, "x")}, training());
  }
  SECTION("inference uses the running statistics") {
    BatchNorm bn("bn_inf");
    bn.ensure_built({{2, 3, 2, 2}});
    bn.running_mean().value.copy_from(test::random_tensor({3}, 6, "rm"));
    bn.running_var().value.copy_from(test::random_tensor({3}, 6, "rv", 0.5, 2.0));
    test::check_layer(bn, {test::random_tensor({2, 3, 2, 2}, 6, "x")}, RunContext{});
  }
  SECTION("without affine parameters") {
    BatchNorm bn({.affine = false}, "bn_plain");
    test::check_layer(bn, {test::random_tensor({4, 2, 2, 2}, 7, "x")}, training());
    CHECK(bn.parameters().empty());
  }
}

TEST_CASE("gradient: ReLU away from the kink", "[grad]") {
  ReLU relu("relu");
  // |x| >= 0.05 > h = 0.01: no perturbation crosses 0.
  test::check_layer(relu, {test::away_from_zero({3, 4, 5}, 1, "x", 0.05)}, training());
}

TEST_CASE("gradient: Softmax along the last and a middle axis", "[grad]") {
  Softmax last(-1, "softmax");
  test::check_layer(last, {test::random_tensor({3, 6}, 1, "x", -2, 2)}, training());
  Softmax mid(1, "softmax_c");
  test::check_layer(mid, {test::random_tensor({2, 4, 3}, 2, "x", -2, 2)}, training());
}

TEST_CASE("gradient: pooling", "[grad]") {
  // Distinct values 0.05 apart; h = 0.01 never changes a window's maximum.
  SECTION("MaxPool2D 2x2") {
    MaxPool2D pool(2, "pool");
    test::check_layer(pool, {test::distinct_values({2, 3, 6, 6}, 1, 0.05)}, training());
  }
  SECTION("MaxPool2D 3x3 stride 2 padding 1") {
    MaxPool2D pool(3, 2, 1, "pool3");
    test::check_layer(pool, {test::distinct_values({1, 2, 7, 7}, 2, 0.05)}, training());
  }
  SECTION("AvgPool2D 2x2 and 3x3 stride 2 padding 1") {
    AvgPool2D a(2, "avg");
    test::check_layer(a, {test::random_tensor({2, 2, 4, 6}, 3, "x")}, training());
    AvgPool2D b(3, 2, 1, "avg3");
    test::check_layer(b, {test::random_tensor({1, 2, 5, 5}, 4, "x")}, training());
  }
  SECTION("GlobalAveragePool") {
    GlobalAveragePool gap("gap");
    test::check_layer(gap, {test::random_tensor({2, 3, 3, 4}, 5, "x")}, training());
  }
}

TEST_CASE("gradient: Flatten, Add, Dropout", "[grad]") {
  Flatten flat("flatten");
  test::check_layer(flat, {test::random_tensor({2, 3, 2, 2}, 1, "x")}, training());
  Add add("add");
  test::check_layer(add, {test::random_tensor({2, 5}, 2, "a"), test::random_tensor({2, 5}, 2, "b"),
                          test::random_tensor({2, 5}, 2, "c")},
                    training());
  Dropout drop(0.4, "dropout");
  test::check_layer(drop, {test::random_tensor({4, 8}, 3, "x")}, training());  // fixed (seed, step): fixed mask
  test::check_layer(drop, {test::random_tensor({4, 8}, 3, "x")}, RunContext{});
}

TEST_CASE("gradient: losses", "[grad]") {
  Tensor logits = test::random_tensor({4, 5}, 1, "logits", -2, 2);
  std::vector<int64_t> labels_v{0, 3, 4, 1};
  Tensor labels = Tensor::from_data(labels_v.data(), {4});
  SECTION("cross-entropy, local mean") {
    SoftmaxCrossEntropy ce;
    test::check_loss(ce, logits, labels, 0);
  }
  SECTION("cross-entropy, global batch 16 and label smoothing 0.1, i32 labels") {
    SoftmaxCrossEntropy ce(0.1);
    std::vector<int32_t> l32{2, 2, 0, 4};
    test::check_loss(ce, logits, Tensor::from_data(l32.data(), {4}), 16);
  }
  SECTION("cross-entropy on (B, T, K) with an ignored label") {
    SoftmaxCrossEntropy ce(0.0, -1);
    std::vector<int64_t> l{1, -1, 0, 2, -1, 4};
    test::check_loss(ce, test::random_tensor({2, 3, 5}, 2, "lt", -2, 2), Tensor::from_data(l.data(), {2, 3}), 0);
  }
  SECTION("mean squared error") {
    MeanSquaredError mse;
    test::check_loss(mse, test::random_tensor({3, 4}, 3, "p"), test::random_tensor({3, 4}, 3, "t"), 8);
  }
}

TEST_CASE("backward adds parameter gradients over calls", "[grad]") {
  Conv2D conv(2, 3, {.padding = 1}, "conv_acc");
  Dense dense(3, {}, "dense_acc");
  BatchNorm bn("bn_acc");
  Tensor x = test::random_tensor({2, 1, 4, 4}, 1, "x");
  for (Layer* layer : std::vector<Layer*>{&conv, &dense, &bn}) {
    Tensor in = layer == &dense ? x.reshape({2, 16}) : x;
    RunContext rc = training();
    layer->ensure_built({in.shape()});
    layer->initialize(5);
    layer->zero_grad();
    SavedState s1, s2;
    Tensor y = layer->forward({in}, rc, s1)[0];
    Tensor dy = test::random_tensor(y.shape(), 2, "dy");
    layer->backward({dy}, rc, s1);
    std::vector<std::vector<float>> once;
    for (Parameter* p : layer->parameters()) once.push_back(p->grad.to_vector());
    layer->forward({in}, rc, s2);
    layer->backward({dy}, rc, s2);
    size_t k = 0;
    for (Parameter* p : layer->parameters()) {
      std::vector<float> twice = p->grad.to_vector();
      for (size_t i = 0; i < twice.size(); ++i) CHECK(twice[i] == Approx(2 * once[k][i]).margin(1e-6));
      ++k;
    }
  }
}

namespace {
// y = 2x whose backward claims 2 * factor * dy: a wrong factor the checker must see.
class SlightlyWrong : public Layer {
 public:
  SlightlyWrong() : Layer("wrong") {}
  std::string type() const override { return "SlightlyWrong"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return in; }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState&) override {
    Tensor y = in[0].clone();
    ops::scale(y, 2.0);
    return {y};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState&) override {
    Tensor d = g[0].clone();
    ops::scale(d, 2.0 * factor);
    return {d};
  }
  double factor = 1.0;
};
}  // namespace

TEST_CASE("the gradient checker catches a wrong gradient", "[grad]") {
  SlightlyWrong layer;
  Tensor x = test::random_tensor({4, 5}, 1, "x");
  Tensor w = test::random_tensor({4, 5}, 2, "w");
  auto objective = [&] {
    SavedState s;
    return test::dot(layer.forward({x}, {}, s)[0], w);
  };
  SavedState s;
  layer.forward({x}, {}, s);
  CHECK(test::compare("right", x, layer.backward({w}, {}, s)[0], objective, {}, false) == 0);
  layer.factor = 1.002;  // 0.2%: the largest elements are off by 4 times rtol = 5e-4
  int wrong = test::compare("wrong", x, layer.backward({w}, {}, s)[0], objective, {}, false);
  CHECK(wrong > 0);
}

namespace {
// LabelSmoothingCrossEntropy's forward (targets 1 - s and s / (K - 1)) with the backward
// of a loss that spreads s / K over the other classes: the forward/backward mismatch an
// audit once slipped past the checker (its tolerance was 2e-3 + 2e-2 |analytic|).
class SmoothingOverK : public Loss {
 public:
  explicit SmoothingOverK(double s) : s_(s), inner_(s) {}
  std::string name() const override { return "smoothing_over_k"; }
  Tensor forward(const Tensor& logits, const Tensor& labels, int64_t global_batch, SavedState& saved) override {
    labels_ = labels;
    global_batch_ = global_batch;
    return inner_.forward(logits, labels, global_batch, saved);
  }
  Tensor backward(SavedState& saved, double scale = 1.0) override {
    Tensor g = inner_.backward(saved, scale);  // (R, K)
    const int64_t k = g.dim(-1), rows = g.numel() / k;
    const double shift = (s_ / static_cast<double>(k - 1) - s_ / static_cast<double>(k)) * scale /
                         static_cast<double>(global_batch_);
    float* d = g.data<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j)
        if (j != labels_.data<int64_t>()[r]) d[r * k + j] += static_cast<float>(shift);
    return g;
  }

 private:
  double s_;
  LabelSmoothingCrossEntropy inner_;
  Tensor labels_;
  int64_t global_batch_ = 1;
};
}  // namespace

TEST_CASE("the gradient checker catches a label-smoothing forward/backward mismatch", "[grad]") {
  // K = 5, s = 0.1: the mismatch is 0.1/4 - 0.1/5 = 0.005 per token over the 9 tokens, 0.6%
  // of the largest gradient (about 0.1): 12 times rtol.
  std::vector<int64_t> l{2, 0, 4, 1, 3, 0};
  const Tensor labels = Tensor::from_data(l.data(), {2, 3});
  Tensor logits = test::random_tensor({2, 3, 5}, 7, "logits", -2.0, 2.0);
  for (bool mismatched : {false, true}) {
    INFO("mismatched " << mismatched);
    LabelSmoothingCrossEntropy right(0.1);
    SmoothingOverK wrong(0.1);
    Loss& loss = mismatched ? static_cast<Loss&>(wrong) : static_cast<Loss&>(right);
    SavedState saved;
    loss.forward(logits, labels, 9, saved);
    Tensor grad = loss.backward(saved);
    auto objective = [&] {
      SavedState s;
      return Loss::value(loss.forward(logits, labels, 9, s));
    };
    const int failures = test::compare(loss.name(), logits, grad, objective, {}, false);
    if (mismatched) {
      CHECK(failures > 0);
    } else {
      CHECK(failures == 0);
    }
  }
}

TEST_CASE("need_input_grads = false skips input gradients, keeps parameter gradients", "[grad]") {
  Conv2D conv(3, 3, {.padding = 1}, "conv_first");
  Dense dense(4, {}, "dense_first");
  Tensor x = test::random_tensor({2, 1, 5, 5}, 1, "x");
  for (Layer* layer : std::vector<Layer*>{&conv, &dense}) {
    Tensor in = layer == &dense ? x.reshape({2, 25}) : x;
    RunContext rc;
    rc.training = true;
    SavedState full, skip;
    Tensor y = layer->forward({in}, rc, full)[0];
    Tensor dy = test::random_tensor(y.shape(), 3, "dy");
    layer->zero_grad();
    CHECK(layer->backward({dy}, rc, full)[0].defined());
    std::vector<std::vector<float>> expected;
    for (Parameter* p : layer->parameters()) expected.push_back(p->grad.to_vector());
    layer->zero_grad();
    layer->forward({in}, rc, skip);
    skip.need_input_grads = false;
    CHECK_FALSE(layer->backward({dy}, rc, skip)[0].defined());
    size_t k = 0;
    for (Parameter* p : layer->parameters()) CHECK(p->grad.to_vector() == expected[k++]);
  }
}
