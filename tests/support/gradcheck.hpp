// Finite-difference gradient checks (in the manner of Caffe's GradientChecker). The layer's
// outputs are projected onto fixed random weights w, L = sum_i w_i y_i, accumulated in
// double; the analytic gradient of L is backward(w). Each input and parameter element x is
// moved by +-h and the central difference (L+ - L-) / (x+ - x-) compared with it, where x+-
// are the f32 values actually stored (so the step's own rounding is no error) and the
// quotient is formed in double. The layers' and losses' CPU engines compute in f32 only, so
// L itself is where double precision ends.
//
// Error budget of one numeric derivative, with u = 2^-24 (f32's unit roundoff):
//   rounding:   each L is off by about c * u * M, M = sum |w_i y_i| (for a loss, M = |L|),
//               c a few units; over the step 2h: c * u * M / h.
//   truncation: h^2 / 6 * |L'''| (central differences are second order).
// h = 1e-2 balances the two for inputs of order 1 (the optimum (3 c u M / |L'''|)^(1/3) is
// 5e-3 to 1e-2 here). Measured over every check of the suite (2026-11-28): the worst
// |numeric - analytic| / max|gradient| was 8e-5 at h = 1e-2 (attention's projections, about
// 0.4 u M / h: rounding), 3e-4 at h = 3e-3 (rounding grows as 1/h) and 8e-4 at h = 3e-2
// (layer norm's input: truncation grows as h^2).
//
// Tolerance, for every element i of one tensor:
//   |numeric_i - analytic_i| <= rtol * G + noise * u * M / h,   G = max_j max(|analytic_j|, |numeric_j|)
// rtol = 5e-4 is six times the worst error seen and covers truncation; the second term is
// the rounding bound with c = noise = 4 (the worst seen was c = 1). Measuring against the
// tensor's largest gradient G, not each element's own value, keeps small elements (whose
// relative error is all rounding) from needing a loose rtol, and does not depend on the
// loss's scale: a loss over a global batch of 16 has gradients 16 times smaller, which a
// fixed atol would check 16 times less precisely. The numeric side in G makes a gradient
// that is missing altogether (analytic 0) fail too.
// What this catches: a wrong factor of 0.1% in the largest elements; a label-smoothing term
// of s/K where the loss has s/(K-1) (0.6% of G for K = 5), which the earlier
// |diff| <= 2e-3 + 2e-2 |analytic| passed. A layer that needs more states its own tolerance
// beside its test.
// Kinks (ReLU at 0, a tie in a max-pool window) must stay further than h from every input:
// the tests build their inputs with that margin.
#pragma once

#include "tarantella/initializers.hpp"
#include "tarantella/layer.hpp"
#include "tarantella/loss.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace tnt::test {

struct GradCheck {
  double h = 1e-2;
  double rtol = 5e-4;  // of the tensor's largest gradient (see above)
  double noise = 4;    // the objective's rounding, in units of u * M / h
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
// magnitude: the size the objective's rounding scales with (see the top of the file); by
// default |objective()| at the unperturbed point.
inline int compare(const std::string& what, Tensor value, const Tensor& analytic, const std::function<double()>& objective,
                   const GradCheck& opt, bool report = true, double magnitude = -1) {
  REQUIRE(analytic.defined());
  REQUIRE(analytic.numel() == value.numel());
  if (magnitude < 0) magnitude = std::fabs(objective());
  std::vector<double> ana = analytic.to_double_vector();
  float* v = value.data<float>();
  std::vector<double> num(ana.size(), 0.0);
  double step_min = opt.h;
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
    step_min = std::min(step_min, step / 2);
    num[i] = (lp - lm) / step;
  }
  double norm = 0;  // max(|analytic|_inf, |numeric|_inf): a gradient that is missing altogether still counts
  for (int64_t i = 0; i < value.numel(); i += opt.every) norm = std::max({norm, std::fabs(ana[i]), std::fabs(num[i])});
  const double floor = opt.noise * 0x1p-24 * std::max(magnitude, 1e-30) / step_min;
  const double tol = opt.rtol * norm + floor;
  int failures = 0;
  for (int64_t i = 0; i < value.numel(); i += opt.every) {
    const double err = std::fabs(num[i] - ana[i]);
    if (err > tol) {
      if (++failures <= 5 && report) {
        FAIL_CHECK(what << "[" << i << "]: numeric " << num[i] << " analytic " << ana[i] << " (|diff| " << err
                        << " > " << tol << " = rtol " << opt.rtol << " x max|gradient| " << norm << " + rounding floor "
                        << floor << ")");
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
  double magnitude = 0;  // sum |w_i y_i|: the objective's rounding scales with it
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::vector<double> y = outputs[i].to_double_vector(), w = weights[i].to_double_vector();
    for (size_t j = 0; j < y.size(); ++j) magnitude += std::fabs(y[j] * w[j]);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!check_input[i]) continue;
    // Flatten may return a view; compare against an independent copy of the input.
    compare(layer.name() + " input " + std::to_string(i), inputs[i], grads[i], objective, opt, true, magnitude);
  }
  for (auto& [name, p] : layer.named_parameters()) {
    if (!p->trainable) continue;
    Tensor analytic = p->grad.clone();
    compare(name, p->value, analytic, objective, opt, true, magnitude);
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
