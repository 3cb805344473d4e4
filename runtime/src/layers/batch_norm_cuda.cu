// BatchNorm on CUDA. Training forward and backward are cuDNN's spatial batch norm, which
// follows PyTorch's convention exactly: biased batch variance to normalise, the UNBIASED
// one into running_var, running = (1 - factor) * running + factor * batch with
// factor = momentum. (N, C) inputs are the (N, C, 1, 1) case of the same mode.
// Inference backward (the running statistics make the layer a per-channel affine map) is
// ours: dx = dy * gamma / sqrt(var + eps), dgamma += sum dy * xhat, dbeta += sum dy.
//
// Mixed precision: an f16/bf16 input uses cuDNN's mixed mode. x, y, dy and dx are half
// (their descriptors say so); the statistics, gamma, beta and their gradients stay f32,
// because cudnnDeriveBNTensorDescriptor gives FLOAT for half data (our (C) tensors are f32
// in every mode), and cuDNN computes in float. So dgamma/dbeta are accumulated (beta 1)
// straight into the f32 master gradients, as for f32 inputs. bf16 needs cuDNN >= 8.1.
#include "layers/batch_norm_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/ops_cuda.hpp"
#include "backend/cuda/reduce.cuh"

#include <memory>

namespace tnt::cuda {

namespace {

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

// gamma = 1, beta = 0 for a layer without affine parameters (cuDNN needs both), and the
// discarded parameter gradients.
struct BnCache {
  Tensor ones, zeros, dscale, dbias;  // (C) each, f32
};

BnCache& cache_for(BatchNorm& layer, int64_t channels, Device device) {
  std::shared_ptr<void>& slot = layer.engine_cache(Device::Kind::cuda);
  if (!slot) slot = std::make_shared<BnCache>();
  auto& c = *static_cast<BnCache*>(slot.get());
  if (!c.ones.defined() || c.ones.numel() != channels || c.ones.device() != device) {
    c.ones = Tensor::empty({channels}, DType::f32, device);
    c.zeros = Tensor::empty({channels}, DType::f32, device);
    c.dscale = Tensor::empty({channels}, DType::f32, device);
    c.dbias = Tensor::empty({channels}, DType::f32, device);
    fill(c.ones, 1.0);
    fill(c.zeros, 0.0);
  }
  return c;
}

// SavedState: {x, batch mean, batch 1/std} in training, {x, -, -} in inference (three
// entries and an extra, as BatchNorm::backward checks before it dispatches).
struct BnSavedCuda {
  bool training = false;
};

struct Dims {
  int64_t n = 0, c = 0, h = 1, w = 1;
};

Dims dims_of(const BatchNorm& layer, const Tensor& x) {
  TNT_CHECK((x.ndim() == 2 || x.ndim() == 4) && x.dim(1) == layer.num_features(),
            "BatchNorm '{}': input {} is not (N, {}) or (N, {}, H, W)", layer.name(), x.str(), layer.num_features(),
            layer.num_features());
  Dims d;
  d.n = x.dim(0);
  d.c = x.dim(1);
  if (x.ndim() == 4) {
    d.h = x.dim(2);
    d.w = x.dim(3);
  }
  return d;
}

template <typename T>
__global__ void bn_inference_dx_kernel(const T* __restrict__ dy,        // (N, C, HW)
                                       const float* __restrict__ gamma,  // (C)
                                       const float* __restrict__ var,    // (C)
                                       float eps, int64_t n, int64_t channels, int64_t inner,
                                       T* __restrict__ dx) {  // (N, C, HW)
  TNT_KERNEL_LOOP(i, n) {
    const int64_t c = (i / inner) % channels;
    dx[i] = from_float<T>(to_float(dy[i]) * gamma[c] / sqrtf(var[c] + eps));
  }
}

template <typename T>
struct DyTimesXhat {
  const T* dy;       // (N, C, HW)
  const T* x;        // (N, C, HW)
  const float* mean;  // (C)
  const float* var;   // (C)
  float eps;
  __device__ float operator()(int64_t idx, int64_t c) const {
    return to_float(dy[idx]) * (to_float(x[idx]) - mean[c]) / sqrtf(var[c] + eps);
  }
};

}  // namespace

std::vector<Tensor> batch_norm_forward(BatchNorm& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved) {
  const Tensor& x = inputs.at(0);  // (N, C) or (N, C, H, W)
  int device = common_device({&x}, "BatchNorm");
  Dims d = dims_of(layer, x);
  const char* what = "BatchNorm";
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  auto info = std::make_shared<BnSavedCuda>();
  info->training = rc.training;
  saved.extra = info;
  if (x.numel() == 0) {
    saved.tensors = {x, Tensor(), Tensor()};
    return {y};
  }
  TensorDescriptor xd, bnd;
  set_nchw(xd, x.dtype(), d.n, d.c, d.h, d.w, what);
  TNT_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bnd, xd, kMode));
  BnCache& cache = cache_for(layer, d.c, x.device());
  const Tensor& gamma = layer.affine() ? layer.weight()->value : cache.ones;  // (C)
  const Tensor& beta = layer.affine() ? layer.bias()->value : cache.zeros;    // (C)
  Tensor& running_mean = layer.running_mean().value;                          // (C)
  Tensor& running_var = layer.running_var().value;                            // (C)
  cudnnHandle_t h = cudnn_handle(device);
  if (rc.training) {
    TNT_CHECK(d.n * d.h * d.w > 1, "BatchNorm '{}': training needs more than one value per channel, got input {}",
              layer.name(), x.str());
    Tensor save_mean = Tensor::empty({d.c}, DType::f32, x.device());     // (C)
    Tensor save_inv_std = Tensor::empty({d.c}, DType::f32, x.device());  // (C)
    TNT_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        h, kMode, CudnnScalars::one(), CudnnScalars::zero(), xd, x.raw(), xd, y.raw(), bnd, gamma.raw(), beta.raw(),
        layer.momentum(), running_mean.raw(), running_var.raw(), layer.epsilon(), save_mean.raw(),
        save_inv_std.raw()));
    saved.tensors = {x, save_mean, save_inv_std};
  } else {
    TNT_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, kMode, CudnnScalars::one(), CudnnScalars::zero(), xd,
                                                            x.raw(), xd, y.raw(), bnd, gamma.raw(), beta.raw(),
                                                            running_mean.raw(), running_var.raw(), layer.epsilon()));
    saved.tensors = {x, Tensor(), Tensor()};
  }
  return {y};
}

std::vector<Tensor> batch_norm_backward(BatchNorm& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved) {
  (void)rc;  // the mode is the forward's
  TNT_CHECK(saved.tensors.size() == 3 && saved.extra, "BatchNorm '{}': backward without a forward", layer.name());
  const bool training = static_cast<const BnSavedCuda*>(saved.extra.get())->training;
  const Tensor& x = saved.tensors[0];     // (N, C, [H, W])
  const Tensor& dy = grad_outputs.at(0);  // like x
  int device = common_device({&x, &dy}, "BatchNorm backward");
  TNT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), "BatchNorm '{}': gradient {} for input {}",
            layer.name(), dy.str(), x.str());
  Dims d = dims_of(layer, x);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return {dx};
  BnCache& cache = cache_for(layer, d.c, x.device());
  const bool affine = layer.affine();
  const Tensor& gamma = affine ? layer.weight()->value : cache.ones;  // (C)
  const bool weight_grad = affine && layer.weight()->grad.defined();
  const bool bias_grad = affine && layer.bias()->grad.defined();

  if (training) {
    const Tensor& save_mean = saved.tensors[1];     // (C)
    const Tensor& save_inv_std = saved.tensors[2];  // (C)
    TensorDescriptor xd, bnd;
    set_nchw(xd, x.dtype(), d.n, d.c, d.h, d.w, "BatchNorm");
    TNT_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bnd, xd, kMode));
    // cuDNN writes both parameter gradients with one beta: accumulate (beta 1) into the
    // layer's when both exist, else write both into scratch and add what is needed.
    const bool direct = weight_grad && bias_grad;
    void* dscale = direct ? layer.weight()->grad.raw() : cache.dscale.raw();
    void* dbias = direct ? layer.bias()->grad.raw() : cache.dbias.raw();
    TNT_CUDNN_CHECK(cudnnBatchNormalizationBackward(
        cudnn_handle(device), kMode, CudnnScalars::one(), CudnnScalars::zero(), CudnnScalars::one(),
        direct ? CudnnScalars::one() : CudnnScalars::zero(), xd, x.raw(), xd, dy.raw(), xd, dx.raw(), bnd, gamma.raw(),
        dscale, dbias, layer.epsilon(), save_mean.raw(), save_inv_std.raw()));
    if (!direct) {
      if (weight_grad) axpy(1.0, cache.dscale, layer.weight()->grad);
      if (bias_grad) axpy(1.0, cache.dbias, layer.bias()->grad);
    }
    return {dx};
  }

  // Inference mode: the running statistics are constants.
  const Tensor& mean = layer.running_mean().value;  // (C)
  const Tensor& var = layer.running_var().value;    // (C)
  const float eps = static_cast<float>(layer.epsilon());
  const int64_t inner = d.h * d.w, n = x.numel();
  TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "BatchNorm", {
    const scalar_t* dyp = static_cast<const scalar_t*>(dy.raw());
    bn_inference_dx_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
        dyp, static_cast<const float*>(gamma.raw()), static_cast<const float*>(var.raw()), eps, n, d.c, inner,
        static_cast<scalar_t*>(dx.raw()));
    TNT_CUDA_CHECK_LAUNCH();
    if (weight_grad) {
      channel_sum(d.n, d.c, inner,
                  DyTimesXhat<scalar_t>{dyp, static_cast<const scalar_t*>(x.raw()),
                                        static_cast<const float*>(mean.raw()), static_cast<const float*>(var.raw()),
                                        eps},
                  1.0f, static_cast<float*>(layer.weight()->grad.raw()), device);
    }
    if (bias_grad) {
      channel_sum(d.n, d.c, inner, LoadAsFloat<scalar_t>{dyp}, 1.0f, static_cast<float*>(layer.bias()->grad.raw()),
                  device);
    }
  });
  return {dx};
}

}  // namespace tnt::cuda
