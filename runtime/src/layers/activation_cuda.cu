// The activations on CUDA.
// ReLU is our element-wise kernel rather than cudnnActivation*: the contract fixes the
// gradient at x == 0 to 0, which cuDNN does not document, and an element-wise pass is
// memory-bound either way. Softmax along any axis is cuDNN's channel-mode softmax on the
// (outer, K, inner, 1) view of the input as stored (channels_last too), in its ACCURATE
// (max-subtracting) form. Sigmoid, Tanh and LeakyReLU are one element-wise kernel over a
// functor each, the functions of layers/activation_math.hpp that the CPU loops call too.
// Every output has its input's memory format.
#include "layers/activation_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/vector_io.cuh"
#include "layers/activation_math.hpp"
#include "layers/gelu_math.hpp"

namespace tnt::cuda {

namespace {

// Each activation is a functor over elements, run by launch_elementwise
// (backend/cuda/vector_io.cuh): 16-byte accesses where the pointers allow, and per element
// exactly the arithmetic of the former scalar kernels, so results are bit for bit theirs.
// Outputs take the input's memory format; element-wise math does not care which it is, as
// long as two tensors that meet (dy and x in backward) share it.

template <typename T>
struct ReluForward {
  __device__ T operator()(int64_t, T x) const { return to_float(x) > 0.0f ? x : from_float<T>(0.0f); }
};

template <typename T>
struct ReluBackward {  // (y, dy) -> dx; y > 0 exactly where x > 0
  __device__ T operator()(int64_t, T y, T dy) const { return to_float(y) > 0.0f ? dy : from_float<T>(0.0f); }
};

template <typename T>
struct GeluForward {
  bool approximate;
  __device__ T operator()(int64_t, T x) const { return from_float<T>(gelu::value(to_float(x), approximate)); }
};

template <typename T>
struct GeluBackward {  // (x, dy) -> dx
  bool approximate;
  __device__ T operator()(int64_t, T x, T dy) const {
    return from_float<T>(to_float(dy) * gelu::derivative(to_float(x), approximate));
  }
};

// y = f(x) in float, stored in T.
template <typename T, typename F>
struct MapFloat {
  F f;
  __device__ T operator()(int64_t, T x) const { return from_float<T>(f(to_float(x))); }
};

// dx = dy * g(s) in float, s the tensor forward saved.
template <typename T, typename G>
struct ChainFloat {  // (s, dy) -> dx
  G g;
  __device__ T operator()(int64_t, T s, T dy) const { return from_float<T>(to_float(dy) * g(to_float(s))); }
};

struct SigmoidOp {
  __device__ float operator()(float x) const { return act::sigmoid(x); }
};
struct SigmoidGrad {
  __device__ float operator()(float y) const { return act::sigmoid_derivative(y); }
};
struct TanhOp {
  __device__ float operator()(float x) const { return act::tanh_value(x); }
};
struct TanhGrad {
  __device__ float operator()(float y) const { return act::tanh_derivative(y); }
};
struct LeakyOp {
  float alpha;
  __device__ float operator()(float x) const { return act::leaky_relu(x, alpha); }
};
struct LeakyGrad {
  float alpha;
  __device__ float operator()(float x) const { return act::leaky_relu_derivative(x, alpha); }
};

// y (x's shape, dtype and memory format) = Op<scalar_t>(x) element-wise.
template <template <typename> class Op, typename... Args>
Tensor unary(const Tensor& x, const char* what, Args... args) {
  int device = common_device({&x}, what);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format());
  TNT_CUDA_DISPATCH_FLOAT(x.dtype(), what, {
    launch_elementwise(device, x.numel(), Op<scalar_t>{args...}, static_cast<scalar_t*>(y.raw()),
                       static_cast<const scalar_t*>(x.raw()));
  });
  return y;
}

// dx (s's shape, dtype and memory format) = Op<scalar_t>(s, dy) element-wise, s the tensor
// forward saved.
template <template <typename> class Op, typename... Args>
Tensor with_gradient(const Layer& layer, const char* what, const Tensor& s, const Tensor& dy, Args... args) {
  int device = common_device({&s, &dy}, what);
  TNT_CHECK(dy.numel() == s.numel() && dy.dtype() == s.dtype(), "{} '{}': gradient {} for a tensor {}", what,
            layer.name(), dy.str(), s.str());
  TNT_CHECK(dy.memory_format() == s.memory_format(),
            "{} '{}': gradient {} and saved tensor {} have different memory formats", what, layer.name(), dy.str(),
            s.str());
  Tensor dx = Tensor::empty(s.shape(), s.dtype(), s.device(), s.memory_format());
  TNT_CUDA_DISPATCH_FLOAT(s.dtype(), what, {
    launch_elementwise(device, s.numel(), Op<scalar_t>{args...}, static_cast<scalar_t*>(dx.raw()),
                       static_cast<const scalar_t*>(s.raw()), static_cast<const scalar_t*>(dy.raw()));
  });
  return dx;
}

template <typename F>
struct MapWith {
  template <typename T>
  using type = MapFloat<T, F>;
};

template <typename G>
struct ChainWith {
  template <typename T>
  using type = ChainFloat<T, G>;
};

template <typename F>
Tensor map_elements(const Tensor& x, const char* what, F f) {
  return unary<MapWith<F>::template type>(x, what, f);
}

template <typename G>
Tensor chain_rule(const Layer& layer, const char* what, const SavedState& saved, const std::vector<Tensor>& grad_outputs,
                  G g) {
  TNT_CHECK(saved.tensors.size() == 1, "{} '{}': backward without a forward", what, layer.name());
  return with_gradient<ChainWith<G>::template type>(layer, what, saved.tensors[0], grad_outputs.at(0), g);
}

struct SoftmaxView {
  int64_t outer = 1, k = 1, inner = 1;
};

// The softmax axis in storage order: (outer, K, inner) over the dimensions as they lie in
// memory, so that cuDNN's channel softmax on that NCHW view runs along the layer's axis.
// A channels_last tensor stores its logical (N, C, H, W) as (N, H, W, C).
SoftmaxView softmax_view(const Softmax& layer, const Tensor& x) {
  const int nd = x.ndim();
  int64_t axis = layer.axis() < 0 ? layer.axis() + nd : layer.axis();
  TNT_CHECK(axis >= 0 && axis < nd, "Softmax '{}': axis {} out of range for input {}", layer.name(), layer.axis(),
            x.str());
  Shape stored = x.shape();
  int64_t stored_axis = axis;
  if (x.is_channels_last()) {
    stored = {x.dim(0), x.dim(2), x.dim(3), x.dim(1)};
    constexpr int64_t position[4] = {0, 3, 1, 2};  // logical dimension -> its place in (N, H, W, C)
    stored_axis = position[axis];
  }
  SoftmaxView v;
  for (int64_t i = 0; i < static_cast<int64_t>(stored.size()); ++i) {
    if (i < stored_axis) v.outer *= stored[i];
    if (i > stored_axis) v.inner *= stored[i];
  }
  v.k = stored[stored_axis];
  return v;
}

}  // namespace

std::vector<Tensor> relu_forward(ReLU& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                 SavedState& saved) {
  (void)layer;
  (void)rc;
  const Tensor& x = inputs.at(0);
  Tensor y = unary<ReluForward>(x, "ReLU");
  // y, as the CPU engine keeps: y > 0 exactly where x > 0 (a NaN gives 0 in both), and the
  // next layer (a convolution, mostly) keeps y anyway, whereas keeping x held one more
  // activation per ReLU alive until backward (in ResNet-50, the BatchNorm outputs).
  saved.tensors = {y};
  return {y};
}

std::vector<Tensor> relu_backward(ReLU& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                  SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 1, "ReLU '{}': backward without a forward", layer.name());
  return {with_gradient<ReluBackward>(layer, "ReLU backward", saved.tensors[0], grad_outputs.at(0))};
}

std::vector<Tensor> gelu_forward(GELU& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                 SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);
  Tensor y = unary<GeluForward>(x, "GELU", layer.approximate());
  saved.tensors = {x};
  return {y};
}

std::vector<Tensor> gelu_backward(GELU& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                  SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 1, "GELU '{}': backward without a forward", layer.name());
  return {with_gradient<GeluBackward>(layer, "GELU backward", saved.tensors[0], grad_outputs.at(0),
                                      layer.approximate())};
}

std::vector<Tensor> sigmoid_forward(Sigmoid& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                    SavedState& saved) {
  (void)layer;
  (void)rc;
  Tensor y = map_elements(inputs.at(0), "Sigmoid", SigmoidOp{});
  saved.tensors = {y};
  return {y};
}

std::vector<Tensor> sigmoid_backward(Sigmoid& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                     SavedState& saved) {
  (void)rc;
  return {chain_rule(layer, "Sigmoid", saved, grad_outputs, SigmoidGrad{})};
}

std::vector<Tensor> tanh_forward(Tanh& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                 SavedState& saved) {
  (void)layer;
  (void)rc;
  Tensor y = map_elements(inputs.at(0), "Tanh", TanhOp{});
  saved.tensors = {y};
  return {y};
}

std::vector<Tensor> tanh_backward(Tanh& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                  SavedState& saved) {
  (void)rc;
  return {chain_rule(layer, "Tanh", saved, grad_outputs, TanhGrad{})};
}

std::vector<Tensor> leaky_relu_forward(LeakyReLU& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved) {
  (void)rc;
  Tensor y = map_elements(inputs.at(0), "LeakyReLU", LeakyOp{static_cast<float>(layer.alpha())});
  saved.tensors = {inputs.at(0)};
  return {y};
}

std::vector<Tensor> leaky_relu_backward(LeakyReLU& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved) {
  (void)rc;
  return {chain_rule(layer, "LeakyReLU", saved, grad_outputs, LeakyGrad{static_cast<float>(layer.alpha())})};
}

std::vector<Tensor> softmax_forward(Softmax& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                    SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);
  int device = common_device({&x}, "Softmax");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format());
  if (x.numel() > 0) {
    SoftmaxView v = softmax_view(layer, x);
    TensorDescriptor desc;
    set_nchw(desc, x.dtype(), v.outer, v.k, v.inner, 1, "Softmax");
    TNT_CUDNN_CHECK(cudnnSoftmaxForward(cudnn_handle(device), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL,
                                        CudnnScalars::one(), desc, x.raw(), CudnnScalars::zero(), desc, y.raw()));
  }
  saved.tensors = {y};
  return {y};
}

std::vector<Tensor> softmax_backward(Softmax& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                     SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 1, "Softmax '{}': backward without a forward", layer.name());
  const Tensor& y = saved.tensors[0];
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&y, &dy}, "Softmax backward");
  TNT_CHECK(dy.shape() == y.shape() && dy.dtype() == y.dtype() && dy.memory_format() == y.memory_format(),
            "Softmax '{}': gradient {} for output {} (shape, dtype and memory format must match)", layer.name(),
            dy.str(), y.str());
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device(), y.memory_format());
  if (y.numel() > 0) {
    SoftmaxView v = softmax_view(layer, y);
    TensorDescriptor desc;
    set_nchw(desc, y.dtype(), v.outer, v.k, v.inner, 1, "Softmax");
    TNT_CUDNN_CHECK(cudnnSoftmaxBackward(cudnn_handle(device), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL,
                                         CudnnScalars::one(), desc, y.raw(), desc, dy.raw(), CudnnScalars::zero(),
                                         desc, dx.raw()));
  }
  return {dx};
}

}  // namespace tnt::cuda
