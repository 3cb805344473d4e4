// Finite-difference gradient checks (in the manner of Caffe's GradientChecker). The layer's
// outputs are projected onto fixed random weights w, L = sum_i w_i y_i, accumulated in
// double; the analytic gradient of L is backward(w). Each input and parameter element is
// moved by +-h and (L+ - L-) / 2h compared with it.
//
// Tolerance |numeric - analytic| <= atol + rtol * |analytic|, by default atol = 2e-3,
// rtol = 2e-2. Why that size: the layers compute in f32, so each L carries a rounding error
// of about 1e-7 * sum |w_i y_i| (~1e-5 for the sizes used here); divided by 2h = 0.02 that
// is ~5e-4 in the quotient. The central difference's truncation error, h^2/6 * f''' with
// h = 1e-2, is ~1e-5 for these smooth functions. A wrong gradient (a missing factor, a
// transposed index, a dropped term) is off by O(1) relative, far outside.
// Kinks (ReLU at 0, a tie in a max-pool window) must stay further than h from every input:
// the tests build their inputs with that margin.
#pragma once

#include "tarantella/initializers.hpp"
#include "tarantella/layer.hpp"
#include "tarantella/loss.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace tnt::test {

struct GradCheck {
  double h = 1e-2;
  double atol = 2e-3;
  double rtol = 2e-2;
  int64_t every = 1;  // check elements i with i % every == 0 (large tensors)
};

// Random f32 values in [lo, hi) keyed by (seed, name).
inline Tensor random_tensor(const Shape& shape, uint64_t seed, const std::string& name, double lo = -1.0,
                            double hi = 1.0) {
  Tensor t = Tensor::empty(shape);
  CounterRng rng(seed, name);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(lo + (hi - lo) * rng.uniform(i));
  return t;
}

// Values in [-1, 1] with |x| >= margin (away from the kink of ReLU at 0).
inline Tensor away_from_zero(const Shape& shape, uint64_t seed, const std::string& name, double margin) {
  Tensor t = random_tensor(shape, seed, name);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (std::fabs(p[i]) < margin) p[i] = p[i] < 0 ? p[i] - static_cast<float>(margin) : p[i] + static_cast<float>(margin);
  }
  return t;
}

// All values distinct, spaced `gap` apart, in a random order: no ties in max pooling.
inline Tensor distinct_values(const Shape& shape, uint64_t seed, double gap) {
  Tensor t = Tensor::empty(shape);
  const int64_t n = t.numel();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  CounterRng rng(seed, "distinct");
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.bits(i) % (i + 1)]);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((order[i] - n / 2) * gap);
  return t;
}

inline double dot(const Tensor& a, const Tensor& w) {
  std::vector<double> x = a.to_double_vector(), y = w.to_double_vector();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

// Compares one tensor's analytic gradient with central differences of objective() and
// returns the number of elements outside the tolerance (reported as failures when report).
inline int compare(const std::string& what, Tensor value, const Tensor& analytic, const std::function<double()>& objective,
                   const GradCheck& opt, bool report = true) {
  REQUIRE(analytic.defined());
  REQUIRE(analytic.numel() == value.numel());
  std::vector<double> ana = analytic.to_double_vector();
  float* v = value.data<float>();
  int failures = 0;
  for (int64_t i = 0; i < value.numel(); i += opt.every) {
    const float saved = v[i];
    v[i] = static_cast<float>(saved + opt.h);
    const double lp = objective();
    v[i] = static_cast<float>(saved - opt.h);
    const double lm = objective();
    v[i] = saved;
    // The step actually taken in f32 (saved +- h rounds):
    const double step = static_cast<double>(static_cast<float>(saved + opt.h)) -
                        static_cast<double>(static_cast<float>(saved - opt.h));
    const double numeric = (lp - lm) / step;
    const double err = std::fabs(numeric - ana[i]);
    if (err > opt.atol + opt.rtol * std::fabs(ana[i])) {
      if (++failures <= 5 && report) {
        FAIL_CHECK(what << "[" << i << "]: numeric " << numeric << " analytic " << ana[i] << " (|diff| " << err << ")");
      }
    }
  }
  if (report) CHECK(failures == 0);
  return failures;
}

// Checks d(w . layer(inputs))/d(inputs) and /d(parameters). check_input[i] false skips input i.
inline void check_layer(Layer& layer, std::vector<Tensor> inputs, const RunContext& rc, const GradCheck& opt = {},
                        std::vector<bool> check_input = {}) {
  if (check_input.empty()) check_input.assign(inputs.size(), true);
  SavedState saved;
  std::vector<Tensor> outputs = layer.forward(inputs, rc, saved);
  std::vector<Tensor> weights;
  for (size_t i = 0; i < outputs.size(); ++i)
    weights.push_back(random_tensor(outputs[i].shape(), 99, layer.name() + "/w" + std::to_string(i)));
  layer.zero_grad();
  std::vector<Tensor> grads = layer.backward(weights, rc, saved);
  REQUIRE(grads.size() == inputs.size());

  auto objective = [&] {
    SavedState s;
    std::vector<Tensor> y = layer.forward(inputs, rc, s);
    double total = 0;
    for (size_t i = 0; i < y.size(); ++i) total += dot(y[i], weights[i]);
    return total;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!check_input[i]) continue;
    // Flatten may return a view; compare against an independent copy of the input.
    compare(layer.name() + " input " + std::to_string(i), inputs[i], grads[i], objective, opt);
  }
  for (auto& [name, p] : layer.named_parameters()) {
    if (!p->trainable) continue;
    Tensor analytic = p->grad.clone();
    compare(name, p->value, analytic, objective, opt);
  }
}

// Checks d loss(predictions, targets) / d predictions.
inline void check_loss(Loss& loss, Tensor predictions, const Tensor& targets, int64_t global_batch,
                       const GradCheck& opt = {}) {
  SavedState saved;
  loss.forward(predictions, targets, global_batch, saved);
  Tensor grad = loss.backward(saved);
  auto objective = [&] {
    SavedState s;
    return Loss::value(loss.forward(predictions, targets, global_batch, s));
  };
  compare(loss.name(), predictions, grad, objective, opt);
}

}  // namespace tnt::test
