// The activations on the CPU: plain loops (memory-bound; OpenMP over elements or rows).
// The element-wise ones keep their input's memory format (y, dx like x; the output gradient
// is brought to it, a no-op for the executor's): the loops run over memory in any order.
// Softmax works along a logical axis and takes contiguous tensors only (the default of
// Layer::supports_memory_format).
#include "tarantella/layers/activation.hpp"
#include "nn/layer_types.hpp"

#include "backend/dispatch.hpp"
#include "layers/activation_cuda.hpp"
#include "layers/activation_math.hpp"
#include "layers/gelu_math.hpp"

#include <cmath>

namespace tnt {

namespace {
constexpr int64_t kParallelMin = 32768;  // below this, threads cost more than they save
}

std::vector<Shape> ElementwiseLayer::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1, "{} '{}': expects one input", type(), name_);
  return {in[0]};
}

ReLU::ReLU(std::string name) : ElementwiseLayer(std::move(name)) { default_name("relu"); }

std::vector<Tensor> ReLU::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::relu_forward(*this, inputs, rc, saved));
  const Tensor& x = inputs[0];
  Tensor y = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
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
  const Tensor dy = grad_outputs[0].to_memory_format(y.memory_format());
  TNT_CHECK(dy.numel() == y.numel() && dy.dtype() == DType::f32, "ReLU '{}': gradient {} for output {}", name_,
            dy.str(), y.str());
  Tensor dx = Tensor::empty(y.shape(), DType::f32, Device::cpu(), y.memory_format());
  const float* ys = y.data<float>();
  const float* g = dy.data<float>();
  float* d = dx.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) d[i] = ys[i] > 0.0f ? g[i] : 0.0f;
  return {dx};
}

GELU::GELU(bool approximate, std::string name) : ElementwiseLayer(std::move(name)), approximate_(approximate) {
  default_name("gelu");
}

std::vector<Tensor> GELU::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::gelu_forward(*this, inputs, rc, saved));
  const Tensor& x = inputs[0];
  Tensor y = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
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
  const Tensor dy = grad_outputs[0].to_memory_format(x.memory_format());
  TNT_CHECK(dy.numel() == x.numel() && dy.dtype() == DType::f32, "GELU '{}': gradient {} for input {}", name_,
            dy.str(), x.str());
  Tensor dx = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
  const float* xs = x.data<float>();
  const float* g = dy.data<float>();
  float* d = dx.data<float>();
  const int64_t n = x.numel();
  const bool approx = approximate_;
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) d[i] = g[i] * gelu::derivative(xs[i], approx);
  return {dx};
}

namespace {

// The element-wise activations added after ReLU and GELU share these: y = f(x) forward,
// dx = dy * g(s) backward, s being the tensor forward saved (x or y, as g needs).
template <typename F>
Tensor map_elements(const Tensor& x, F f) {
  Tensor y = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) ys[i] = f(xs[i]);
  return y;
}

template <typename G>
Tensor chain_rule(const char* type, const std::string& name, const Tensor& s, const Tensor& dy_any, G g) {
  const Tensor dy = dy_any.to_memory_format(s.memory_format());
  TNT_CHECK(dy.numel() == s.numel() && dy.dtype() == DType::f32, "{} '{}': gradient {} for a tensor {}", type, name,
            dy.str(), s.str());
  Tensor dx = Tensor::empty(s.shape(), DType::f32, Device::cpu(), s.memory_format());
  const float* ss = s.data<float>();
  const float* gs = dy.data<float>();
  float* d = dx.data<float>();
  const int64_t n = s.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) d[i] = gs[i] * g(ss[i]);
  return dx;
}

void check_backward(const char* type, const std::string& name, const std::vector<Tensor>& grad_outputs,
                    const SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "{} '{}': backward needs one gradient", type, name);
  TNT_CHECK(saved.tensors.size() == 1, "{} '{}': backward without a forward", type, name);
}

}  // namespace

Sigmoid::Sigmoid(std::string name) : ElementwiseLayer(std::move(name)) { default_name("sigmoid"); }

std::vector<Tensor> Sigmoid::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::sigmoid_forward(*this, inputs, rc, saved));
  Tensor y = map_elements(inputs[0], [](float x) { return act::sigmoid(x); });
  saved.tensors = {y};
  return {y};
}

std::vector<Tensor> Sigmoid::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                      SavedState& saved) {
  check_backward("Sigmoid", name_, grad_outputs, saved);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::sigmoid_backward(*this, grad_outputs, rc, saved));
  return {chain_rule("Sigmoid", name_, saved.tensors[0], grad_outputs[0],
                     [](float y) { return act::sigmoid_derivative(y); })};
}

Tanh::Tanh(std::string name) : ElementwiseLayer(std::move(name)) { default_name("tanh"); }

std::vector<Tensor> Tanh::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::tanh_forward(*this, inputs, rc, saved));
  Tensor y = map_elements(inputs[0], [](float x) { return act::tanh_value(x); });
  saved.tensors = {y};
  return {y};
}

std::vector<Tensor> Tanh::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc, SavedState& saved) {
  check_backward("Tanh", name_, grad_outputs, saved);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::tanh_backward(*this, grad_outputs, rc, saved));
  return {chain_rule("Tanh", name_, saved.tensors[0], grad_outputs[0],
                     [](float y) { return act::tanh_derivative(y); })};
}

LeakyReLU::LeakyReLU(double alpha, std::string name) : ElementwiseLayer(std::move(name)), alpha_(alpha) {
  default_name("leaky_relu");
  TNT_INPUT_CHECK(std::isfinite(alpha) && alpha >= 0.0, "LeakyReLU '{}': alpha must be finite and >= 0, got {}",
                  name_, alpha);
}

std::vector<Tensor> LeakyReLU::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::leaky_relu_forward(*this, inputs, rc, saved));
  const float alpha = static_cast<float>(alpha_);
  Tensor y = map_elements(inputs[0], [alpha](float x) { return act::leaky_relu(x, alpha); });
  saved.tensors = {inputs[0]};  // the branch needs x: y > 0 does not tell x == 0 from x < 0 when alpha is 0
  return {y};
}

std::vector<Tensor> LeakyReLU::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  check_backward("LeakyReLU", name_, grad_outputs, saved);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::leaky_relu_backward(*this, grad_outputs, rc, saved));
  const float alpha = static_cast<float>(alpha_);
  return {chain_rule("LeakyReLU", name_, saved.tensors[0], grad_outputs[0],
                     [alpha](float x) { return act::leaky_relu_derivative(x, alpha); })};
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

std::shared_ptr<Layer> make_activation(const std::string& activation, std::string name) {
  if (activation == "relu") return std::make_shared<ReLU>(std::move(name));
  if (activation == "gelu") return std::make_shared<GELU>(true, std::move(name));
  if (activation == "gelu_exact") return std::make_shared<GELU>(false, std::move(name));
  if (activation == "sigmoid") return std::make_shared<Sigmoid>(std::move(name));
  if (activation == "tanh") return std::make_shared<Tanh>(std::move(name));
  if (activation == "leaky_relu") return std::make_shared<LeakyReLU>(std::move(name));
  if (activation == "softmax") return std::make_shared<Softmax>(std::move(name));
  TNT_INPUT_ERROR("activation '{}' is unknown: expected one of relu, gelu, gelu_exact, sigmoid, tanh, leaky_relu, "
                  "softmax",
                  activation);
}

// Model files (nn/layer_types.hpp).
namespace {
using detail::layer_as;
const auto kReLU = detail::LayerTypeRegistration::plain<ReLU>("ReLU");
const auto kSigmoid = detail::LayerTypeRegistration::plain<Sigmoid>("Sigmoid");
const auto kTanh = detail::LayerTypeRegistration::plain<Tanh>("Tanh");
const detail::LayerTypeRegistration kLeakyReLU(
    "LeakyReLU",
    [](const Layer& l) {
      LayerConfig c;
      c.set_double("alpha", layer_as<LeakyReLU>(l).alpha());
      return c;
    },
    [](const std::string& name, const LayerConfig& c) -> LayerPtr {
      return std::make_shared<LeakyReLU>(c.get_double("alpha"), name);
    });
const detail::LayerTypeRegistration kGELU(
    "GELU",
    [](const Layer& l) {
      LayerConfig c;
      c.set_bool("approximate", layer_as<GELU>(l).approximate());
      return c;
    },
    [](const std::string& name, const LayerConfig& c) -> LayerPtr {
      return std::make_shared<GELU>(c.get_bool("approximate"), name);
    });
const detail::LayerTypeRegistration kSoftmax(
    "Softmax",
    [](const Layer& l) {
      LayerConfig c;
      c.set_int("axis", layer_as<Softmax>(l).axis());
      return c;
    },
    [](const std::string& name, const LayerConfig& c) -> LayerPtr {
      return std::make_shared<Softmax>(c.get_int("axis"), name);
    });
}  // namespace

}  // namespace tnt
