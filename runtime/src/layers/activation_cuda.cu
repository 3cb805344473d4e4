// The activations on CUDA.
// ReLU is our element-wise kernel rather than cudnnActivation*: the contract fixes the
// gradient at x == 0 to 0, which cuDNN does not document, and an element-wise pass is
// memory-bound either way. Softmax along any axis is cuDNN's channel-mode softmax on the
// (outer, K, inner, 1) view of the input, in its ACCURATE (max-subtracting) form. Sigmoid,
// Tanh and LeakyReLU are one element-wise kernel over a functor each, the functions of
// layers/activation_math.hpp that the CPU loops call too.
#include "layers/activation_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "layers/activation_math.hpp"
#include "layers/gelu_math.hpp"

namespace tnt::cuda {

namespace {

template <typename T>
__global__ void relu_forward_kernel(const T* __restrict__ x,  // (n)
                                    T* __restrict__ y,        // (n)
                                    int64_t n) {
  TNT_KERNEL_LOOP(i, n) {
    const float v = to_float(x[i]);
    y[i] = v > 0.0f ? x[i] : from_float<T>(0.0f);
  }
}

template <typename T>
__global__ void relu_backward_kernel(const T* __restrict__ x,   // (n)
                                     const T* __restrict__ dy,  // (n)
                                     T* __restrict__ dx,        // (n)
                                     int64_t n) {
  TNT_KERNEL_LOOP(i, n) { dx[i] = to_float(x[i]) > 0.0f ? dy[i] : from_float<T>(0.0f); }
}

template <typename T>
__global__ void gelu_forward_kernel(const T* __restrict__ x,  // (n)
                                    T* __restrict__ y,        // (n)
                                    int64_t n, bool approximate) {
  TNT_KERNEL_LOOP(i, n) { y[i] = from_float<T>(gelu::value(to_float(x[i]), approximate)); }
}

template <typename T>
__global__ void gelu_backward_kernel(const T* __restrict__ x,   // (n)
                                     const T* __restrict__ dy,  // (n)
                                     T* __restrict__ dx,        // (n)
                                     int64_t n, bool approximate) {
  TNT_KERNEL_LOOP(i, n) { dx[i] = from_float<T>(to_float(dy[i]) * gelu::derivative(to_float(x[i]), approximate)); }
}

// y = f(x) in float, stored in T.
template <typename T, typename F>
__global__ void map_kernel(const T* __restrict__ x,  // (n)
                           T* __restrict__ y,        // (n)
                           int64_t n, F f) {
  TNT_KERNEL_LOOP(i, n) { y[i] = from_float<T>(f(to_float(x[i]))); }
}

// dx = dy * g(s) in float, s the tensor forward saved.
template <typename T, typename G>
__global__ void chain_kernel(const T* __restrict__ s,   // (n)
                             const T* __restrict__ dy,  // (n)
                             T* __restrict__ dx,        // (n)
                             int64_t n, G g) {
  TNT_KERNEL_LOOP(i, n) { dx[i] = from_float<T>(to_float(dy[i]) * g(to_float(s[i]))); }
}

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

template <typename F>
Tensor map_elements(const Tensor& x, const char* what, F f) {
  int device = common_device({&x}, what);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), what, {
      map_kernel<scalar_t, F><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(x.raw()), static_cast<scalar_t*>(y.raw()), n, f);
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  return y;
}

template <typename G>
Tensor chain_rule(const Layer& layer, const char* what, const SavedState& saved, const std::vector<Tensor>& grad_outputs,
                  G g) {
  TNT_CHECK(saved.tensors.size() == 1, "{} '{}': backward without a forward", what, layer.name());
  const Tensor& s = saved.tensors[0];
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&s, &dy}, what);
  TNT_CHECK(dy.numel() == s.numel() && dy.dtype() == s.dtype(), "{} '{}': gradient {} for a tensor {}", what,
            layer.name(), dy.str(), s.str());
  Tensor dx = Tensor::empty(s.shape(), s.dtype(), s.device());
  const int64_t n = s.numel();
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(s.dtype(), what, {
      chain_kernel<scalar_t, G><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(s.raw()), static_cast<const scalar_t*>(dy.raw()),
          static_cast<scalar_t*>(dx.raw()), n, g);
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  return dx;
}

struct SoftmaxView {
  int64_t outer = 1, k = 1, inner = 1;
};

SoftmaxView softmax_view(const Softmax& layer, const Tensor& x) {
  const int nd = x.ndim();
  int64_t axis = layer.axis() < 0 ? layer.axis() + nd : layer.axis();
  TNT_CHECK(axis >= 0 && axis < nd, "Softmax '{}': axis {} out of range for input {}", layer.name(), layer.axis(),
            x.str());
  SoftmaxView v;
  for (int i = 0; i < nd; ++i) {
    if (i < axis) v.outer *= x.dim(i);
    if (i > axis) v.inner *= x.dim(i);
  }
  v.k = x.dim(static_cast<int>(axis));
  return v;
}

}  // namespace

std::vector<Tensor> relu_forward(ReLU& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                 SavedState& saved) {
  (void)layer;
  (void)rc;
  const Tensor& x = inputs.at(0);
  int device = common_device({&x}, "ReLU");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "ReLU", {
      relu_forward_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(x.raw()), static_cast<scalar_t*>(y.raw()), n);
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  saved.tensors = {x};
  return {y};
}

std::vector<Tensor> relu_backward(ReLU& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                  SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 1, "ReLU '{}': backward without a forward", layer.name());
  const Tensor& x = saved.tensors[0];
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&x, &dy}, "ReLU backward");
  TNT_CHECK(dy.numel() == x.numel() && dy.dtype() == x.dtype(), "ReLU '{}': gradient {} for input {}", layer.name(),
            dy.str(), x.str());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "ReLU", {
      relu_backward_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(x.raw()), static_cast<const scalar_t*>(dy.raw()),
          static_cast<scalar_t*>(dx.raw()), n);
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  return {dx};
}

std::vector<Tensor> gelu_forward(GELU& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                 SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);
  int device = common_device({&x}, "GELU");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "GELU", {
      gelu_forward_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(x.raw()), static_cast<scalar_t*>(y.raw()), n, layer.approximate());
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  saved.tensors = {x};
  return {y};
}

std::vector<Tensor> gelu_backward(GELU& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                  SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 1, "GELU '{}': backward without a forward", layer.name());
  const Tensor& x = saved.tensors[0];
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&x, &dy}, "GELU backward");
  TNT_CHECK(dy.numel() == x.numel() && dy.dtype() == x.dtype(), "GELU '{}': gradient {} for input {}", layer.name(),
            dy.str(), x.str());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "GELU", {
      gelu_backward_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(x.raw()), static_cast<const scalar_t*>(dy.raw()),
          static_cast<scalar_t*>(dx.raw()), n, layer.approximate());
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  return {dx};
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
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
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
  TNT_CHECK(dy.shape() == y.shape() && dy.dtype() == y.dtype(), "Softmax '{}': gradient {} for output {}",
            layer.name(), dy.str(), y.str());
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
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
