// The CUDA engine of ScaledTanh. Kernels run on libtarantella's compute stream of the
// tensor's device (tnt::cuda_stream), so they are ordered with every other layer's work and
// with the gradient allreduce that follows backward; nothing here synchronises.
#include "scaled_tanh.hpp"

#include <cuda_runtime.h>

namespace {

__global__ void forward_kernel(const float* x, const float* alpha, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = alpha[0] * tanhf(x[i]);
}

// dx = dy * alpha * (1 - tanh^2 x); d alpha += sum(dy * tanh x): a block sum, then one
// atomicAdd per block.
__global__ void backward_kernel(const float* x, const float* dy, const float* alpha, float* dx, float* dalpha,
                                int64_t n) {
  __shared__ float partial[256];
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  float contribution = 0.0f;
  if (i < n) {
    const float t = tanhf(x[i]);
    dx[i] = dy[i] * alpha[0] * (1.0f - t * t);
    contribution = dy[i] * t;
  }
  partial[threadIdx.x] = contribution;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(dalpha, partial[0]);
}

void check(cudaError_t err, const char* what) {
  TNT_CHECK(err == cudaSuccess, "ScaledTanh CUDA engine: {}: {}", what, cudaGetErrorString(err));
}

int blocks(int64_t n) { return static_cast<int>((n + 255) / 256); }

}  // namespace

tnt::Tensor scaled_tanh_forward_cuda(const tnt::Tensor& x, const tnt::Tensor& alpha) {
  tnt::Tensor y = tnt::Tensor::empty(x.shape(), tnt::DType::f32, x.device());
  auto stream = static_cast<cudaStream_t>(tnt::cuda_stream(x.device()));
  if (x.numel() > 0)
    forward_kernel<<<blocks(x.numel()), 256, 0, stream>>>(x.data<float>(), alpha.data<float>(), y.data<float>(),
                                                          x.numel());
  check(cudaGetLastError(), "forward launch");
  return y;
}

tnt::Tensor scaled_tanh_backward_cuda(const tnt::Tensor& x, const tnt::Tensor& dy, const tnt::Tensor& alpha,
                                      tnt::Tensor& alpha_grad) {
  tnt::Tensor dx = tnt::Tensor::empty(x.shape(), tnt::DType::f32, x.device());
  auto stream = static_cast<cudaStream_t>(tnt::cuda_stream(x.device()));
  if (x.numel() > 0)
    backward_kernel<<<blocks(x.numel()), 256, 0, stream>>>(x.data<float>(), dy.data<float>(), alpha.data<float>(),
                                                           dx.data<float>(), alpha_grad.data<float>(), x.numel());
  check(cudaGetLastError(), "backward launch");
  return dx;
}
