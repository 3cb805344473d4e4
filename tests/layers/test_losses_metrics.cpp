// Loss values by hand, metrics, and the small tensor ops.
#include "gradcheck.hpp"

#include "tarantella/layers.hpp"

#include <cmath>
#include <functional>
#include <limits>

using namespace tnt;

namespace {
Tensor labels64(std::vector<int64_t> v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return Tensor::from_data(v.data(), shape);
}
double loss_of(Loss& loss, const Tensor& p, const Tensor& t, int64_t batch) {
  SavedState s;
  return Loss::value(loss.forward(p, t, batch, s));
}
}  // namespace

TEST_CASE("softmax cross-entropy values", "[loss]") {
  SoftmaxCrossEntropy ce;
  // Two equal logits: ln 2 per sample. Logits (0, ln 3): p = (1/4, 3/4).
  Tensor logits = Tensor::from_vector({0, 0, 0, static_cast<float>(std::log(3.0))}, {2, 2});
  Tensor labels = labels64({0, 1});
  const double l0 = std::log(2.0), l1 = -std::log(0.75);
  CHECK(loss_of(ce, logits, labels, 0) == Approx((l0 + l1) / 2).epsilon(1e-6));
  // The mean is over the batch the caller gives (the global batch): sum / 8.
  CHECK(loss_of(ce, logits, labels, 8) == Approx((l0 + l1) / 8).epsilon(1e-6));
  // Gradient: (p - onehot) / batch.
  SavedState s;
  ce.forward(logits, labels, 8, s);
  std::vector<float> g = ce.backward(s).to_vector();
  CHECK(g[0] == Approx((0.5 - 1) / 8));
  CHECK(g[1] == Approx(0.5 / 8));
  CHECK(g[2] == Approx(0.25 / 8));
  CHECK(g[3] == Approx((0.75 - 1) / 8));
  std::vector<float> g2 = ce.backward(s, 4.0).to_vector();  // loss scaling
  CHECK(g2[0] == Approx(4 * (0.5 - 1) / 8));

  // Label smoothing 0.2 over K = 2: target (0.9, 0.1) for label 0.
  SoftmaxCrossEntropy smooth(0.2);
  CHECK(loss_of(smooth, logits.slice_rows(1, 2), labels64({0}), 0) ==
        Approx(-(0.9 * std::log(0.25) + 0.1 * std::log(0.75))).epsilon(1e-6));

  // Huge logits stay finite (log-sum-exp).
  CHECK(loss_of(ce, Tensor::from_vector({1000, -1000}, {1, 2}), labels64({1}), 0) == Approx(2000).epsilon(1e-6));

  // One label a sample: an ignored one adds nothing to the sum but counts in the mean (as a
  // sample weight of 0 does), the same in a direct call as in fit (before: a direct call
  // divided by the labels not ignored, fit by the samples).
  SoftmaxCrossEntropy pad(0.0, -1);
  CHECK(loss_of(pad, logits, labels64({-1, 1}), 0) == Approx(l1 / 2).epsilon(1e-6));
  CHECK(pad.count_tokens(labels64({-1, 1})) == 2);
  CHECK(pad.one_unit_per_sample({2}));
  CHECK(pad.one_unit_per_sample({2, 1}));
  CHECK_FALSE(pad.one_unit_per_sample({2, 3}));

  // Sequences, logits (B, T, K) and labels (B, T): the mean over the labels not ignored
  // (PyTorch's CrossEntropyLoss, Keras' mean over tokens), and the gradient in the logits'
  // shape (before: (B*T, K), which fit's backward refused at step 1).
  {
    Tensor seq = Tensor::from_vector({0, 0, 0, static_cast<float>(std::log(3.0)), 0, 0, 5, 5}, {2, 2, 2});
    Tensor seq_labels = labels64({0, 1, -1, 1}).reshape({2, 2});
    CHECK(pad.count_tokens(seq_labels) == 3);
    SavedState ss;
    const double got = pad.forward(seq, seq_labels, 0, ss).to_vector()[0];
    CHECK(got == Approx((l0 + l1 + std::log(2.0)) / 3).epsilon(1e-6));
    Tensor g = pad.backward(ss);
    CHECK(g.shape() == Shape{2, 2, 2});
    const std::vector<float> gv = g.to_vector();
    CHECK(gv[4] == 0);  // the ignored label's row
    CHECK(gv[5] == 0);
    CHECK(gv[6] == Approx(0.5 / 3));
  }

  std::vector<int32_t> l32{0, 1};
  CHECK(loss_of(ce, logits, Tensor::from_data(l32.data(), {2}), 0) == Approx((l0 + l1) / 2).epsilon(1e-6));
  CHECK_THROWS_AS(loss_of(ce, logits, labels64({0, 2}), 0), InputError);
  CHECK_THROWS_WITH(loss_of(ce, logits, labels64({0, 2}), 0), Catch::Contains("label 2"));
  CHECK_THROWS_WITH(loss_of(ce, logits, labels64({0, 1, 1}), 0), Catch::Contains("3 labels"));
  CHECK_THROWS_WITH(loss_of(ce, logits, Tensor::zeros({2}), 0), Catch::Contains("i32 or i64"));
}

TEST_CASE("mean squared error values", "[loss]") {
  MeanSquaredError mse;
  Tensor p = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  Tensor t = Tensor::from_vector({0, 2, 3, 6}, {2, 2});
  CHECK(loss_of(mse, p, t, 0) == Approx((1 + 0 + 0 + 4) / 4.0));  // PyTorch's mean
  CHECK(loss_of(mse, p, t, 4) == Approx((1 + 0 + 0 + 4) / 8.0));  // global batch 4, D = 2
  SavedState s;
  mse.forward(p, t, 4, s);
  CHECK(mse.backward(s).to_vector() == std::vector<float>{2.0f / 8, 0, 0, -4.0f / 8});
}

TEST_CASE("accuracy and top-k accuracy", "[metrics]") {
  Tensor scores = Tensor::from_vector({0.1f, 0.7f, 0.2f,    // argmax 1
                                       0.5f, 0.5f, 0.0f,    // tie between 0 and 1
                                       0.3f, 0.3f, 0.4f,    // argmax 2, tie 0/1 behind
                                       0.9f, 0.05f, 0.05f},  // argmax 0
                                      {4, 3});
  Accuracy acc;
  acc.update(scores, labels64({1, 1, 1, 2}));
  // row 0 correct; row 1: label 1 ties with class 0, which comes first, so rank 1: wrong;
  // row 2 wrong; row 3 wrong.
  CHECK(acc.total() == 1);
  CHECK(acc.count() == 4);
  CHECK(acc.result() == 0.25);
  acc.update(scores, labels64({1, 0, 2, 0}));
  CHECK(acc.result() == Approx(5.0 / 8));
  CHECK(acc.name() == "accuracy");

  TopKAccuracy top2(2);
  top2.update(scores, labels64({1, 1, 1, 2}));
  // row 0: label 1 first: yes. row 1: rank 1 < 2: yes. row 2: label 1 behind class 2 and
  // tied class 0 (first): rank 2: no. row 3: label 2 behind 0 and tied 1: rank 2: no.
  CHECK(top2.total() == 2);
  CHECK(top2.name() == "top2_accuracy");

  // The training loop's allreduce path, and ignored labels.
  top2.set_totals(30, 40);
  CHECK(top2.result() == 0.75);
  top2.reset();
  CHECK(top2.result() == 0);
  Accuracy padded(-1);
  padded.update(scores, labels64({1, -1, 2, -1}));
  CHECK(padded.count() == 2);
  CHECK(padded.total() == 2);
  CHECK_THROWS_AS(acc.update(scores, labels64({3, 0, 0, 0})), InputError);
}

TEST_CASE("accuracy counts a row with a NaN or an infinity as wrong", "[metrics]") {
  // A diverged model outputs NaN everywhere; every comparison with NaN is false, so a
  // metric that only counts the classes scoring above the label would rank every label
  // first and report 100%.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Tensor scores = Tensor::from_vector({nan, nan, nan,      // all NaN
                                       0.1f, 0.9f, nan,    // the label (1) wins, a NaN elsewhere
                                       0.1f, inf, 0.2f,    // the label is an infinity
                                       -inf, 0.5f, 0.2f,   // a -infinity behind the label
                                       0.2f, 0.7f, 0.1f},  // finite: correct
                                      {5, 3});
  Tensor labels = labels64({0, 1, 1, 1, 1});
  for (int64_t k : {1, 2, 3}) {
    INFO("k " << k);
    TopKAccuracy m(k);
    m.update(scores, labels);
    CHECK(m.count() == 5);
    CHECK(m.total() == 1);  // only the finite row
  }
  Accuracy all_nan;
  all_nan.update(Tensor::full({4, 10}, nan, DType::f32), labels64({0, 3, 9, 5}));
  CHECK(all_nan.result() == 0);
}

TEST_CASE("ops", "[ops]") {
  Tensor x = Tensor::from_vector({1, -2, 3}, {3});
  Tensor y = Tensor::from_vector({10, 20, 30}, {3});
  ops::axpy(2.0, x, y);
  CHECK(y.to_vector() == std::vector<float>{12, 16, 36});
  ops::scale(y, 0.5);
  CHECK(y.to_vector() == std::vector<float>{6, 8, 18});
  CHECK(ops::add(x, y).to_vector() == std::vector<float>{7, 6, 21});
  CHECK(ops::sum(x) == 2);
  CHECK(ops::sum_squares(x) == 14);
  CHECK_FALSE(ops::has_non_finite(x));
  Tensor bad = Tensor::from_vector({1, std::numeric_limits<float>::quiet_NaN()}, {2});
  CHECK(ops::has_non_finite(bad));
  bad = Tensor::from_vector({std::numeric_limits<float>::infinity(), 0}, {2});
  CHECK(ops::has_non_finite(bad));
  CHECK(ops::argmax_rows(Tensor::from_vector({1, 3, 3, 5, 0, -1}, {2, 3})).to_double_vector() ==
        std::vector<double>{1, 0});
  Tensor h = ops::cast(x, DType::bf16);
  CHECK(h.dtype() == DType::bf16);
  CHECK(ops::cast(h, DType::f32).to_vector() == x.to_vector());
  CHECK(ops::cast(x, DType::f16).to_vector() == x.to_vector());
  CHECK(ops::item(Tensor::full({1}, 4.5)) == 4.5);
  CHECK_THROWS_WITH(ops::item(x), Catch::Contains("1-element"));
  CHECK_THROWS_WITH(ops::axpy(1.0, x, Tensor::zeros({4})), Catch::Contains("element count"));
  // A large sum in double: 2^20 ones, exactly.
  CHECK(ops::sum(Tensor::full({1 << 20}, 1.0)) == 1048576.0);
}

// ---------------------------------------------------------------------------------------
// Binary cross-entropy, mean absolute error, Huber, and sample weights. The references
// below are written out in double from the textbook definitions (not from the stable
// forms the engines use), per element: l(p, t) and dl/dp.

namespace {

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Reference {
  std::function<double(double, double)> value;
  std::function<double(double, double)> slope;
};

Reference bce_reference() {
  return {[](double x, double t) {
            const double s = sigmoid_ref(x);
            return -(t * std::log(s) + (1 - t) * std::log(1 - s));
          },
          [](double x, double t) { return sigmoid_ref(x) - t; }};
}
Reference mae_reference() {
  return {[](double p, double t) { return std::fabs(p - t); },
          [](double p, double t) { return p > t ? 1.0 : (p < t ? -1.0 : 0.0); }};
}
Reference mse_reference() {
  return {[](double p, double t) { return (p - t) * (p - t); }, [](double p, double t) { return 2 * (p - t); }};
}
Reference huber_reference(double delta) {
  return {[delta](double p, double t) {
            const double d = std::fabs(p - t);
            return d <= delta ? 0.5 * d * d : delta * d - 0.5 * delta * delta;
          },
          [delta](double p, double t) {
            const double d = p - t;
            return std::fabs(d) <= delta ? d : (d > 0 ? delta : -delta);
          }};
}

// sum_n w_n sum_d l(p, t) / (global_batch * D) and its gradient times scale, in double.
// weights empty: all 1.
std::pair<double, std::vector<double>> reference_loss(const Reference& ref, const Tensor& p, const Tensor& t,
                                                      const std::vector<double>& weights, int64_t global_batch,
                                                      double scale = 1.0) {
  std::vector<double> pv = p.to_double_vector(), tv = t.to_double_vector();
  const int64_t n = p.dim(0), d = p.numel() / n;
  const double denom = static_cast<double>(global_batch * d);
  double total = 0;
  std::vector<double> grad(pv.size());
  for (size_t i = 0; i < pv.size(); ++i) {
    const double w = weights.empty() ? 1.0 : weights[i / static_cast<size_t>(d)];
    total += w * ref.value(pv[i], tv[i]);
    grad[i] = w * ref.slope(pv[i], tv[i]) * scale / denom;
  }
  return {total / denom, grad};
}

Tensor weights_tensor(const std::vector<double>& w) {
  std::vector<float> f(w.begin(), w.end());
  return Tensor::from_vector(f, {static_cast<int64_t>(f.size())});
}

// The loss returned in f32 from a sum taken in double: one rounding to float (2^-24
// relative) and the per-element values' own rounding (a few 1e-8 relative, since the
// element-wise rule works on the float difference p - t or on the float logit): 1e-6
// relative has an order of magnitude of room and still fails on any wrong term.
constexpr double kLossRtol = 1e-6;
// A gradient element is the rule's slope, rounded to float, times float(scale / denom),
// and the weight in float: three or four roundings of 2^-24 each; 1e-6 relative is room
// for them (plus an absolute 1e-9 for slopes that cancel to ~0, such as sigmoid(x) - t).
constexpr double kGradRtol = 1e-6, kGradAtol = 1e-9;

void check_against_reference(Loss& loss, const Reference& ref, const Tensor& p, const Tensor& t,
                             const std::vector<double>& weights, int64_t global_batch, double scale) {
  SavedState s;
  Tensor w = weights.empty() ? Tensor() : weights_tensor(weights);
  const double value = Loss::value(loss.forward_weighted(p, t, w, global_batch, s));
  std::vector<float> grad = loss.backward(s, scale).to_vector();
  auto [expected, expected_grad] = reference_loss(ref, p, t, weights, global_batch, scale);
  CHECK(value == Approx(expected).epsilon(kLossRtol));
  REQUIRE(grad.size() == expected_grad.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    INFO(loss.name() << " gradient element " << i);
    CHECK(std::fabs(grad[i] - expected_grad[i]) <= kGradAtol + kGradRtol * std::fabs(expected_grad[i]));
  }
}

// A loss whose forward is another loss's forward_weighted with fixed weights: what the
// gradient checker (which calls forward) needs to check weighted gradients.
class WithWeights : public Loss {
 public:
  WithWeights(Loss& inner, Tensor weights) : inner_(inner), weights_(std::move(weights)) {}
  std::string name() const override { return inner_.name() + " weighted"; }
  Tensor forward(const Tensor& p, const Tensor& t, int64_t global_batch, SavedState& saved) override {
    return inner_.forward_weighted(p, t, weights_, global_batch, saved);
  }
  Tensor backward(SavedState& saved, double scale = 1.0) override { return inner_.backward(saved, scale); }

 private:
  Loss& inner_;
  Tensor weights_;
};

Tensor probabilities(const Shape& shape, const std::string& name) {
  Tensor t = test::random_tensor(shape, 17, name, 0.0, 1.0);
  t.data<float>()[0] = 0.0f;  // the ends of [0, 1] are valid targets
  t.data<float>()[1] = 1.0f;
  return t;
}

}  // namespace

TEST_CASE("binary cross-entropy, mean absolute error and Huber against double references", "[loss]") {
  const Tensor p = test::random_tensor({5, 3}, 11, "pw_p", -4, 4);
  const Tensor t = test::random_tensor({5, 3}, 11, "pw_t", -4, 4);
  const std::vector<double> w{0.5, 0.0, 2.0, 1.25, 3.0};
  for (const auto& weights : {std::vector<double>{}, w}) {
    INFO("weights " << (weights.empty() ? "none" : "0.5, 0, 2, 1.25, 3"));
    BinaryCrossEntropy bce;
    check_against_reference(bce, bce_reference(), p, probabilities({5, 3}, "bce_t"), weights, 8, 1.0);
    MeanAbsoluteError mae;
    check_against_reference(mae, mae_reference(), p, t, weights, 8, 2.0);
    MeanSquaredError mse;
    check_against_reference(mse, mse_reference(), p, t, weights, 5, 1.0);
    for (double delta : {1.0, 0.3, 10.0}) {
      INFO("delta " << delta);
      Huber huber(delta);
      CHECK(huber.delta() == delta);
      check_against_reference(huber, huber_reference(delta), p, t, weights, 6, 4.0);
    }
  }
  // global_batch 0: this call's own samples (5), PyTorch's reduction='mean'.
  MeanAbsoluteError mae;
  CHECK(loss_of(mae, p, t, 0) == Approx(reference_loss(mae_reference(), p, t, {}, 5).first).epsilon(kLossRtol));
  // (N, 1) predictions take (N) targets.
  CHECK(loss_of(mae, p.reshape({15, 1}), t.reshape({15}), 15) == Approx(loss_of(mae, p, t, 5)).epsilon(kLossRtol));
  CHECK(BinaryCrossEntropy().name() == "binary_cross_entropy");
  CHECK(MeanAbsoluteError().name() == "mean_absolute_error");
  CHECK(Huber().name() == "huber");
  CHECK(Huber().delta() == 1.0);  // Keras' and PyTorch's default
}

TEST_CASE("binary cross-entropy stays finite for large logits", "[loss]") {
  BinaryCrossEntropy bce;
  // Per element: max(x, 0) - x t + log(1 + exp(-|x|)); the exp term is below 1e-43 here.
  //   x = 1000, t = 0: 1000;  x = -1000, t = 1: 1000;  x = 1000, t = 1: 0;  x = -1000, t = 0: 0;
  //   x = 100, t = 0.5: 50;   x = 1e30, t = 0.25: 0.75e30 (a float logit near its range's end).
  Tensor x = Tensor::from_vector({1000, -1000, 1000, -1000, 100, 1e30f}, {6});
  Tensor t = Tensor::from_vector({0, 1, 1, 0, 0.5f, 0.25f}, {6});
  const double expected = (1000 + 1000 + 0 + 0 + 50 + 0.75 * static_cast<double>(1e30f)) / 6;
  SavedState s;
  const double value = Loss::value(bce.forward(x, t, 6, s));
  CHECK(std::isfinite(value));
  CHECK(value == Approx(expected).epsilon(kLossRtol));
  // sigmoid(x) - t: 1, -1, 0, 0, 0.5, 0.75, each / 6; no NaN from exp overflowing.
  std::vector<float> g = bce.backward(s).to_vector();
  const std::vector<double> expected_grad{1, -1, 0, 0, 0.5, 0.75};
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i);
    CHECK(g[i] == Approx(expected_grad[i] / 6).margin(1e-9));
  }
  // Small logits: the textbook form, 6 digits.
  Tensor xs = Tensor::from_vector({0, 0}, {2});
  CHECK(loss_of(bce, xs, Tensor::from_vector({0, 1}, {2}), 0) == Approx(std::log(2.0)).epsilon(kLossRtol));
}

TEST_CASE("mean absolute error and Huber at their kinks", "[loss]") {
  // MAE at d = 0: value 0 and slope 0 (sign(0), as PyTorch's L1Loss).
  MeanAbsoluteError mae;
  Tensor p = Tensor::from_vector({0.5f, 2, -1}, {3});
  Tensor t = Tensor::from_vector({0.5f, 1, -1}, {3});
  SavedState s;
  CHECK(Loss::value(mae.forward(p, t, 3, s)) == Approx(1.0 / 3));
  CHECK(mae.backward(s).to_vector() == std::vector<float>{0, 1.0f / 3, 0});

  // Huber at |d| = delta exactly (values exact in binary): both pieces give delta^2 / 2, slope +-delta.
  for (double delta : {1.0, 0.5}) {
    INFO("delta " << delta);
    Huber huber(delta);
    const float dd = static_cast<float>(delta);
    Tensor hp = Tensor::from_vector({1.5f, 0.25f - dd, 3}, {3});
    Tensor ht = Tensor::from_vector({1.5f - dd, 0.25f, 3}, {3});
    SavedState hs;
    CHECK(Loss::value(huber.forward(hp, ht, 3, hs)) == Approx((delta * delta / 2 * 2) / 3));
    std::vector<float> g = huber.backward(hs).to_vector();
    CHECK(g[0] == Approx(delta / 3));
    CHECK(g[1] == Approx(-delta / 3));
    CHECK(g[2] == 0.0f);
    // Just past delta on either side the two pieces agree to first order (C1 at the seam).
    Tensor above = Tensor::from_vector({dd + 1e-3f}, {1}), below = Tensor::from_vector({dd - 1e-3f}, {1});
    Tensor zero = Tensor::from_vector({0}, {1});
    const double slope = (loss_of(huber, above, zero, 1) - loss_of(huber, below, zero, 1)) / 2e-3;
    CHECK(slope == Approx(delta).epsilon(1e-3));  // f32 loss values: ~1e-7 / 2e-3 of noise
  }
}

TEST_CASE("finite-difference gradients of the new losses, with and without weights", "[loss][grad]") {
  // Inputs away from the kinks (MAE's d = 0; Huber's |d| = delta is C1, but kept clear
  // anyway) by more than the checker's step h = 1e-2: p in [0.5, 1.5), t in [-1.5, -0.5)
  // for MAE, Huber with delta 10 (quadratic) and 0.1 (linear).
  const Tensor p = test::random_tensor({4, 3}, 21, "fd_p", 0.5, 1.5);
  const Tensor t = test::random_tensor({4, 3}, 21, "fd_t", -1.5, -0.5);
  const Tensor logits = test::random_tensor({4, 3}, 21, "fd_x", -3, 3);
  const Tensor probs = probabilities({4, 3}, "fd_probs");
  const Tensor w = weights_tensor({0.5, 2.0, 0.0, 1.5});
  BinaryCrossEntropy bce;
  MeanAbsoluteError mae;
  Huber quadratic(10.0), linear(0.1);
  MeanSquaredError mse;
  for (bool weighted : {false, true}) {
    INFO("weighted " << weighted);
    auto check = [&](Loss& loss, const Tensor& pred, const Tensor& target) {
      WithWeights with(loss, weighted ? w : Tensor());
      test::check_loss(with, pred.clone(), target, 6);
    };
    check(bce, logits, probs);
    check(mae, p, t);
    check(quadratic, p, t);
    check(linear, p, t);
    check(mse, p, t);
  }
  SoftmaxCrossEntropy ce;
  std::vector<int64_t> l{0, 2, 1, 2};
  WithWeights with(ce, w);
  test::check_loss(with, logits.clone(), labels64(l), 6);
}

TEST_CASE("bad targets of the new losses are input errors naming the problem", "[loss]") {
  BinaryCrossEntropy bce;
  MeanAbsoluteError mae;
  Huber huber;
  Tensor x = Tensor::zeros({2, 3});
  // Shapes: another element count, another sample count, another dtype.
  for (Loss* loss : std::vector<Loss*>{&bce, &mae, &huber}) {
    INFO(loss->name());
    CHECK_THROWS_AS(loss_of(*loss, x, Tensor::zeros({2, 2}), 0), InputError);
    CHECK_THROWS_WITH(loss_of(*loss, x, Tensor::zeros({2, 2}), 0),
                      Catch::Contains("(2, 2)") && Catch::Contains("do not match"));
    CHECK_THROWS_AS(loss_of(*loss, x, Tensor::zeros({3, 2}), 0), InputError);
    CHECK_THROWS_AS(loss_of(*loss, x, Tensor::zeros({2, 3}, DType::i64), 0), InputError);
  }
  // Targets outside [0, 1] (and NaN) for binary cross-entropy: the value and where it is.
  Tensor t = Tensor::from_vector({0, 1, 0.5f, 1.5f, 0, 0}, {2, 3});
  CHECK_THROWS_AS(loss_of(bce, x, t, 0), InputError);
  CHECK_THROWS_WITH(loss_of(bce, x, t, 0), Catch::Contains("target 1.5 of sample 1") && Catch::Contains("[0, 1]"));
  t.data<float>()[3] = -0.25f;
  CHECK_THROWS_WITH(loss_of(bce, x, t, 0), Catch::Contains("target -0.25"));
  t.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(loss_of(bce, x, t, 0), Catch::Contains("target nan"));
  // MAE and Huber take any real target.
  t.data<float>()[3] = 7.0f;
  CHECK(loss_of(mae, x, t, 0) == Approx((1 + 0.5 + 7) / 6));
  // A Huber threshold must be positive.
  CHECK_THROWS_AS(Huber(0.0), InputError);
  CHECK_THROWS_WITH(Huber(-1.0), Catch::Contains("delta -1"));
  // Sample weights: one f32 per sample.
  SavedState s;
  CHECK_THROWS_WITH(mae.forward_weighted(x, t, weights_tensor({1, 1, 1}), 2, s),
                    Catch::Contains("one weight per sample"));
}

TEST_CASE("sample weights: ones equal none, a zero drops the sample, global_batch stays", "[loss][weights]") {
  const Tensor logits = test::random_tensor({4, 5}, 31, "sw_logits", -3, 3);
  const Tensor labels = labels64({4, 0, 2, 1});
  const Tensor p = test::random_tensor({4, 2}, 31, "sw_p", -2, 2);
  const Tensor t = test::random_tensor({4, 2}, 31, "sw_t", -2, 2);
  SoftmaxCrossEntropy ce;
  MeanSquaredError mse;
  MeanAbsoluteError mae;
  Huber huber(0.5);
  BinaryCrossEntropy bce;
  const Tensor probs = probabilities({4, 2}, "sw_probs");
  struct Case {
    Loss* loss;
    Tensor pred, target;
  };
  const std::vector<Case> cases{{&ce, logits, labels}, {&mse, p, t}, {&mae, p, t}, {&huber, p, t}, {&bce, p, probs}};
  // Rows 0, 2, 3 of a (4, ...) tensor.
  auto without_row_1 = [](const Tensor& x) {
    Shape shape = x.shape();
    shape[0] = 3;
    Tensor out = Tensor::empty(shape, x.dtype());
    Tensor head = out.slice_rows(0, 1), tail = out.slice_rows(1, 3);
    head.copy_from(x.slice_rows(0, 1));
    tail.copy_from(x.slice_rows(2, 4));
    return out;
  };
  for (const Case& c : cases) {
    INFO(c.loss->name());
    // Weights of 1: the same numbers, bit for bit (1 * x is exact).
    SavedState a, b;
    const double plain = Loss::value(c.loss->forward(c.pred, c.target, 9, a));
    const double ones = Loss::value(c.loss->forward_weighted(c.pred, c.target, weights_tensor({1, 1, 1, 1}), 9, b));
    CHECK(ones == plain);
    CHECK(c.loss->backward(b, 2.0).to_vector() == c.loss->backward(a, 2.0).to_vector());

    // Weight 0 for sample 1: the loss and gradients of the other three alone, divided by the
    // same global batch (9); sample 1's gradient is 0. The sum skips a term that is exactly
    // 0, so the values agree bit for bit.
    SavedState z, d;
    const double zeroed =
        Loss::value(c.loss->forward_weighted(c.pred, c.target, weights_tensor({1, 0, 1, 1}), 9, z));
    const double dropped = Loss::value(c.loss->forward(without_row_1(c.pred), without_row_1(c.target), 9, d));
    CHECK(zeroed == dropped);
    Tensor gz = c.loss->backward(z).reshape(c.pred.shape());
    Tensor gd = c.loss->backward(d).reshape(without_row_1(c.pred).shape());
    CHECK(without_row_1(gz).to_vector() == gd.to_vector());
    for (float v : gz.slice_rows(1, 2).to_vector()) CHECK(v == 0.0f);
  }
  // A zero weight takes out even an infinite loss (0 * inf would be NaN).
  Tensor inf_p = p.clone();
  inf_p.data<float>()[2] = std::numeric_limits<float>::infinity();
  SavedState si, sd;
  const double with_inf = Loss::value(mse.forward_weighted(inf_p, t, weights_tensor({1, 0, 1, 1}), 9, si));
  CHECK(with_inf == Loss::value(mse.forward(without_row_1(p), without_row_1(t), 9, sd)));
  CHECK_FALSE(ops::has_non_finite(mse.backward(si)));
}

TEST_CASE("softmax cross-entropy with sample weights against a double reference", "[loss][weights]") {
  const int64_t n = 4, k = 5;
  const Tensor logits = test::random_tensor({n, k}, 41, "swx_logits", -4, 4);
  const std::vector<int64_t> l{3, 0, 4, 1};
  const std::vector<double> w{0.25, 3.0, 0.0, 1.5};
  const int64_t global_batch = 7;
  std::vector<double> x = logits.to_double_vector();
  double expected = 0;
  std::vector<double> expected_grad(n * k);
  for (int64_t r = 0; r < n; ++r) {
    double z = 0;
    for (int64_t j = 0; j < k; ++j) z += std::exp(x[r * k + j]);
    expected += w[r] * -std::log(std::exp(x[r * k + l[r]]) / z);
    for (int64_t j = 0; j < k; ++j) {
      expected_grad[r * k + j] = w[r] * (std::exp(x[r * k + j]) / z - (j == l[r] ? 1.0 : 0.0)) * 3.0 / global_batch;
    }
  }
  expected /= global_batch;
  SoftmaxCrossEntropy ce;
  SavedState s;
  CHECK(Loss::value(ce.forward_weighted(logits, labels64(l), weights_tensor(w), global_batch, s)) ==
        Approx(expected).epsilon(kLossRtol));
  std::vector<float> g = ce.backward(s, 3.0).to_vector();
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(g[i] - expected_grad[i]) <= kGradAtol + kGradRtol * std::fabs(expected_grad[i]));
  }
  // (N, T, K) logits: a sample's weight applies to each of its T rows.
  Tensor seq = test::random_tensor({2, 3, k}, 41, "swx_seq", -2, 2);
  std::vector<int64_t> sl{0, 1, 2, 3, 4, 0};
  SavedState a, b;
  const double weighted = Loss::value(ce.forward_weighted(seq, labels64(sl, {2, 3}), weights_tensor({2, 0}), 2, a));
  const double first_only =
      Loss::value(ce.forward(seq.slice_rows(0, 1), labels64({0, 1, 2}, {1, 3}), 2, b));
  CHECK(weighted == Approx(2 * first_only).epsilon(kLossRtol));
}

TEST_CASE("class weights give each sample the weight of its class", "[loss][weights]") {
  SoftmaxCrossEntropy ce;
  const ClassWeight cw{{0, 2.0}, {2, 0.5}};
  // Class 1 is absent from the map: weight 1.
  CHECK(sample_weights_for_classes(ce, labels64({0, 1, 2, 2, 0}), cw) == std::vector<double>{2, 1, 0.5, 0.5, 2});
  std::vector<int32_t> l32{2, 1};
  CHECK(sample_weights_for_classes(ce, Tensor::from_data(l32.data(), {2}), cw) == std::vector<double>{0.5, 1});
  CHECK(sample_weights_for_classes(ce, labels64({1, 0}, {2, 1}), cw) == std::vector<double>{1, 2});
  // With them, the loss equals the loss with the matching sample weights.
  const Tensor logits = test::random_tensor({5, 3}, 51, "cw_logits", -2, 2);
  SavedState a, b;
  const Tensor labels = labels64({0, 1, 2, 2, 0});
  std::vector<double> from_classes = sample_weights_for_classes(ce, labels, cw);
  CHECK(Loss::value(ce.forward_weighted(logits, labels, weights_tensor(from_classes), 5, a)) ==
        Loss::value(ce.forward_weighted(logits, labels, weights_tensor({2, 1, 0.5, 0.5, 2}), 5, b)));

  // Binary cross-entropy: one 0/1 target per sample.
  BinaryCrossEntropy bce;
  CHECK(sample_weights_for_classes(bce, Tensor::from_vector({1, 0, 1}, {3, 1}), {{1, 4.0}}) ==
        std::vector<double>{4, 1, 4});
  CHECK_THROWS_AS(sample_weights_for_classes(bce, Tensor::from_vector({1, 0.5f}, {2}), {{1, 4.0}}), InputError);
  CHECK_THROWS_WITH(sample_weights_for_classes(bce, Tensor::from_vector({1, 0.5f}, {2}), {{1, 4.0}}),
                    Catch::Contains("sample 1 has target 0.5"));
  CHECK_THROWS_WITH(sample_weights_for_classes(bce, Tensor::zeros({2, 2}), {{1, 4.0}}),
                    Catch::Contains("one 0/1 target per sample"));
  // Sequences of labels, and losses without classes, are refused.
  CHECK_THROWS_WITH(sample_weights_for_classes(ce, labels64({0, 1, 2, 0}, {2, 2}), cw),
                    Catch::Contains("one integer label per sample"));
  MeanSquaredError mse;
  CHECK_THROWS_AS(sample_weights_for_classes(mse, Tensor::zeros({2}), cw), InputError);
  CHECK_THROWS_WITH(sample_weights_for_classes(mse, Tensor::zeros({2}), cw), Catch::Contains("mean_squared_error"));
  // Bad class weights name the class.
  CHECK_THROWS_WITH(check_class_weight({{3, -1.0}}), Catch::Contains("class 3"));
  CHECK_THROWS_WITH(check_class_weight({{1, std::numeric_limits<double>::infinity()}}), Catch::Contains("class 1"));
  CHECK_THROWS_WITH(check_class_weight({{-2, 1.0}}), Catch::Contains("class -2 is negative"));
  // A loss without weight support refuses them.
  LabelSmoothingCrossEntropy smooth;
  SavedState s;
  CHECK_THROWS_AS(smooth.forward_weighted(logits, labels, weights_tensor({1, 1, 1, 1, 1}), 5, s), InputError);
  CHECK_FALSE(smooth.supports_sample_weights());
  CHECK(ce.supports_sample_weights());
}
