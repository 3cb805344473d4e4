// ReLU, GELU and Softmax on the CPU: plain loops (memory-bound; OpenMP over elements or rows).
#include "tarantella/layers/activation.hpp"

#include "backend/dispatch.hpp"
#include "layers/activation_cuda.hpp"
#include "layers/gelu_math.hpp"

#include <cmath>

namespace tnt {

namespace {
constexpr int64_t kParallelMin = 32768;  // below this, threads cost more than they save
}

ReLU::ReLU(std::string name) : Layer(std::move(name)) { default_name("relu"); }

std::vector<Shape> ReLU::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1, "ReLU '{}': expects one input", name_);
  return {in[0]};
}

std::vector<Tensor> ReLU::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::relu_forward(*this, inputs, rc, saved));
  const Tensor& x = inputs[0];
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) ys[i] = xs[i] > 0.0f ? xs[i] : 0.0f;
  saved.tensors = {y};  // y > 0 exactly where x > 0
  return {y};
}

std::vector<Tensor> ReLU::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc, SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "ReLU '{}': backward needs one gradient", name_);
  TNT_CHECK(saved.tensors.size() == 1, "ReLU '{}': backward without a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::relu_backward(*this, grad_outputs, rc, saved));
  const Tensor& y = saved.tensors[0];
  const Tensor& dy = grad_outputs[0];
  TNT_CHECK(dy.numel() == y.numel() && dy.dtype() == DType::f32, "ReLU '{}': gradient {} for output {}", name_,
            dy.str(), y.str());
  Tensor dx = Tensor::empty(y.shape(), DType::f32);
  const float* ys = y.data<float>();
  const float* g = dy.data<float>();
  float* d = dx.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) d[i] = ys[i] > 0.0f ? g[i] : 0.0f;
  return {dx};
}

GELU::GELU(bool approximate, std::string name) : Layer(std::move(name)), approximate_(approximate) {
  default_name("gelu");
}

std::vector<Shape> GELU::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1, "GELU '{}': expects one input", name_);
  return {in[0]};
}

std::vector<Tensor> GELU::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::gelu_forward(*this, inputs, rc, saved));
  const Tensor& x = inputs[0];
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t n = x.numel();
  const bool approx = approximate_;
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) ys[i] = gelu::value(xs[i], approx);
  saved.tensors = {x};
  return {y};
}

std::vector<Tensor> GELU::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc, SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "GELU '{}': backward needs one gradient", name_);
  TNT_CHECK(saved.tensors.size() == 1, "GELU '{}': backward without a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::gelu_backward(*this, grad_outputs, rc, saved));
  const Tensor& x = saved.tensors[0];
  const Tensor& dy = grad_outputs[0];
  TNT_CHECK(dy.numel() == x.numel() && dy.dtype() == DType::f32, "GELU '{}': gradient {} for input {}", name_,
            dy.str(), x.str());
  Tensor dx = Tensor::empty(x.shape(), DType::f32);
  const float* xs = x.data<float>();
  const float* g = dy.data<float>();
  float* d = dx.data<float>();
  const int64_t n = x.numel();
  const bool approx = approximate_;
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) d[i] = g[i] * gelu::derivative(xs[i], approx);
  return {dx};
}

Softmax::Softmax(int64_t axis, std::string name) : Layer(std::move(name)), axis_(axis) { default_name("softmax"); }

std::vector<Shape> Softmax::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1, "Softmax '{}': expects one input", name_);
  const int64_t nd = static_cast<int64_t>(in[0].size());
  TNT_CHECK(axis_ >= -nd && axis_ < nd, "Softmax '{}': axis {} out of range for input {}", name_, axis_,
            shape_str(in[0]));
  return {in[0]};
}

namespace {
// (outer, K, inner) view of a shape around the axis.
void split_axis(const Shape& s, int64_t axis, int64_t& outer, int64_t& k, int64_t& inner) {
  const int64_t nd = static_cast<int64_t>(s.size());
  const int64_t a = axis < 0 ? axis + nd : axis;
  outer = 1;
  inner = 1;
  for (int64_t i = 0; i < a; ++i) outer *= s[i];
  for (int64_t i = a + 1; i < nd; ++i) inner *= s[i];
  k = s[a];
}
}  // namespace

std::vector<Tensor> Softmax::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  output_shapes({inputs[0].shape()});
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::softmax_forward(*this, inputs, rc, saved));
  const Tensor& x = inputs[0];
  int64_t outer, k, inner;
  split_axis(x.shape(), axis_, outer, k, inner);
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  const float* xs = x.data<float>();  // (outer, K, inner)
  float* ys = y.data<float>();        // (outer, K, inner)
  const int64_t lines = outer * inner;
#pragma omp parallel for schedule(static) if (lines * k > kParallelMin)
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t o = l / inner, i = l % inner;
    const float* xl = xs + o * k * inner + i;
    float* yl = ys + o * k * inner + i;
    float mx = -INFINITY;
    for (int64_t j = 0; j < k; ++j) mx = std::max(mx, xl[j * inner]);
    double total = 0;
    for (int64_t j = 0; j < k; ++j) {
      float e = std::exp(xl[j * inner] - mx);
      yl[j * inner] = e;
      total += e;
    }
    const float inv = static_cast<float>(1.0 / total);
    for (int64_t j = 0; j < k; ++j) yl[j * inner] *= inv;
  }
  saved.tensors = {y};
  return {y};
}

std::vector<Tensor> Softmax::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                      SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "Softmax '{}': backward needs one gradient", name_);
  TNT_CHECK(saved.tensors.size() == 1, "Softmax '{}': backward without a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::softmax_backward(*this, grad_outputs, rc, saved));
  const Tensor& y = saved.tensors[0];
  const Tensor& dy = grad_outputs[0];
  TNT_CHECK(dy.shape() == y.shape() && dy.dtype() == DType::f32, "Softmax '{}': gradient {} for output {}", name_,
            dy.str(), y.str());
  int64_t outer, k, inner;
  split_axis(y.shape(), axis_, outer, k, inner);
  Tensor dx = Tensor::empty(y.shape(), DType::f32);
  const float* ys = y.data<float>();
  const float* gs = dy.data<float>();
  float* ds = dx.data<float>();
  const int64_t lines = outer * inner;
#pragma omp parallel for schedule(static) if (lines * k > kParallelMin)
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t base = (l / inner) * k * inner + l % inner;
    double dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(gs[base + j * inner]) * ys[base + j * inner];
    const float d = static_cast<float>(dot);
    for (int64_t j = 0; j < k; ++j) ds[base + j * inner] = ys[base + j * inner] * (gs[base + j * inner] - d);
  }
  return {dx};
}

}  // namespace tnt
