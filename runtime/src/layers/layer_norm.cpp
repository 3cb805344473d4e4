// LayerNorm on the CPU: one pass per row (OpenMP over rows) for the statistics, in double
// so that a row with a large mean loses nothing; backward keeps mean and 1/std per row.
// The weight and bias gradients are column sums, done by threads that each own a block of
// columns and walk the rows in order (deterministic).
//
// Backward of y = xhat * w + b, xhat = (x - mean) * rstd, with g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw += sum_rows dy * xhat,  db += sum_rows dy.
#include "tarantella/layers/layer_norm.hpp"
#include "nn/layer_types.hpp"

#include "backend/dispatch.hpp"
#include "layers/layer_norm_cuda.hpp"

#include <cmath>

namespace tnt {

LayerNorm::LayerNorm(double eps, std::string name) : Layer(std::move(name)), eps_(eps) {
  default_name("layer_norm");
  TNT_INPUT_CHECK(eps > 0, "LayerNorm '{}': eps must be positive, got {}", name_, eps);
}

std::vector<Shape> LayerNorm::output_shapes(const std::vector<Shape>& in) const {
  TNT_INPUT_CHECK(in.size() == 1 && !in[0].empty(), "LayerNorm '{}': expects one input of shape (..., D)", name_);
  return {in[0]};
}

void LayerNorm::build(const std::vector<Shape>& in) {
  TNT_CHECK(in.size() == 1 && !in[0].empty() && in[0].back() > 0, "LayerNorm '{}': expects one input (..., D), D > 0",
            name_);
  features_ = in[0].back();
  weight_ = &add_parameter("weight", {features_}, Initializer::ones());
  bias_ = &add_parameter("bias", {features_}, Initializer::zeros());
}

std::vector<Tensor> LayerNorm::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  const Tensor& x = inputs[0];
  ensure_built({x.shape()});
  TNT_CHECK(x.ndim() >= 1 && x.dim(-1) == features_, "LayerNorm '{}': input {} does not end in {} features", name_,
            x.str(), features_);
  TNT_CUDA_DISPATCH(x.device(), cuda::layer_norm_forward(*this, inputs, rc, saved));
  const int64_t d = features_, rows = x.numel() / d;
  Tensor y = Tensor::empty(x.shape(), DType::f32);  // (R, D)
  Tensor stats = Tensor::empty({rows, 2}, DType::f32);  // (R, 2): mean, 1/std
  const float* xs = x.data<float>();
  const float* w = weight_->value.data<float>();
  const float* b = bias_->value.data<float>();
  float* ys = y.data<float>();
  float* st = stats.data<float>();
  const double eps = eps_;
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xs + r * d;
    double sum = 0;
    for (int64_t j = 0; j < d; ++j) sum += xr[j];
    const double mean = sum / static_cast<double>(d);
    double sq = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double c = xr[j] - mean;
      sq += c * c;
    }
    const float rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(d) + eps));
    const float m = static_cast<float>(mean);
    float* yr = ys + r * d;
    for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - m) * rstd * w[j] + b[j];
    st[2 * r] = m;
    st[2 * r + 1] = rstd;
  }
  saved.tensors = {x, stats};
  return {y};
}

std::vector<Tensor> LayerNorm::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "LayerNorm '{}': backward needs one gradient",
            name_);
  TNT_CHECK(saved.tensors.size() == 2, "LayerNorm '{}': backward without a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::layer_norm_backward(*this, grad_outputs, rc, saved));
  const Tensor& x = saved.tensors[0];
  const Tensor& stats = saved.tensors[1];
  const Tensor& dy = grad_outputs[0];
  TNT_CHECK(dy.numel() == x.numel() && dy.dtype() == DType::f32, "LayerNorm '{}': gradient {} for output {}", name_,
            dy.str(), x.str());
  const int64_t d = features_, rows = x.numel() / d;
  const float* xs = x.data<float>();
  const float* st = stats.data<float>();
  const float* g = dy.data<float>();
  const float* w = weight_->value.data<float>();
  Tensor dx = Tensor::empty(x.shape(), DType::f32);
  float* dxs = dx.data<float>();
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xs + r * d;
    const float* gr = g + r * d;
    const float m = st[2 * r], rstd = st[2 * r + 1];
    float sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < d; ++j) {
      const float gw = gr[j] * w[j];
      sum_g += gw;
      sum_gx += gw * (xr[j] - m) * rstd;
    }
    const float mg = sum_g / static_cast<float>(d), mgx = sum_gx / static_cast<float>(d);
    float* dr = dxs + r * d;
    for (int64_t j = 0; j < d; ++j) dr[j] = rstd * (gr[j] * w[j] - mg - (xr[j] - m) * rstd * mgx);
  }
  float* dw = weight_->grad.data<float>();
  float* db = bias_->grad.data<float>();
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t j0 = 0; j0 < d; j0 += 64) {
    const int64_t j1 = std::min(d, j0 + 64);
    float aw[64] = {}, ab[64] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xs + r * d;
      const float* gr = g + r * d;
      const float m = st[2 * r], rstd = st[2 * r + 1];
      for (int64_t j = j0; j < j1; ++j) {
        aw[j - j0] += gr[j] * (xr[j] - m) * rstd;
        ab[j - j0] += gr[j];
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      dw[j] += aw[j - j0];
      db[j] += ab[j - j0];
    }
  }
  return {dx};
}

// Model files (nn/layer_types.hpp).
namespace {
const detail::LayerTypeRegistration kLayerNorm(
    "LayerNorm",
    [](const Layer& l) {
      LayerConfig c;
      c.set_double("epsilon", detail::layer_as<LayerNorm>(l).eps());
      return c;
    },
    [](const std::string& name, const LayerConfig& c) -> LayerPtr {
      return std::make_shared<LayerNorm>(c.get_double("epsilon"), name);
    });
}  // namespace

}  // namespace tnt
