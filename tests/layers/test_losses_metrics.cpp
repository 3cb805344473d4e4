// Loss values by hand, metrics, and the small tensor ops.
#include "gradcheck.hpp"

#include "tarantella/layers.hpp"

#include <cmath>
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

  // Ignored labels count neither in the sum nor in the local mean.
  SoftmaxCrossEntropy pad(0.0, -1);
  CHECK(loss_of(pad, logits, labels64({-1, 1}), 0) == Approx(l1).epsilon(1e-6));

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
