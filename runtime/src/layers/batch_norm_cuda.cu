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
//
// Memory formats: y and dx have x's format, dy must have it too (the executor's contract).
// A contiguous input takes the calls above, unchanged. A channels_last (NHWC) input trains
// through cudnnBatchNormalizationForwardTrainingEx / BackwardEx in
// CUDNN_BATCHNORM_SPATIAL_PERSISTENT mode with CUDNN_BATCHNORM_OPS_BN (no fused add or
// activation): cuDNN's fast NHWC kernels. They need a workspace per call and a reserve
// space that forward fills and backward reads (kept with the saved state). The same
// running-statistics contract holds (factor = momentum, unbiased variance). cuDNN warns
// that the persistent mode "imposes some limits on the range of values" (it reduces with
// scaled integers), and does not document its determinism, so in deterministic mode
// (TNT_DETERMINISTIC) NHWC takes the plain spatial calls above with NHWC descriptors. So
// does an NHWC input when cuDNN refuses the Ex calls for it (its checks say not supported
// or a bad parameter, before any work: a warning, once per layer). Inference forward is
// cudnnBatchNormalizationForwardInference with NHWC descriptors; our inference backward has
// an NHWC kernel and column sums.
#include "layers/batch_norm_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/ops_cuda.hpp"
#include "backend/cuda/reduce.cuh"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <array>
#include <atomic>
#include <map>
#include <memory>

namespace tnt::cuda {

namespace {

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;
// NHWC training (see the top).
constexpr cudnnBatchNormMode_t kModeNhwc = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
constexpr cudnnBatchNormOps_t kOps = CUDNN_BATCHNORM_OPS_BN;

// One input shape's cuDNN descriptors and the Ex calls' size queries, made at its first call
// and kept (they were made at every call: a few descriptors and up to three cuDNN queries per
// BatchNorm and pass, host time only).
struct BnDescs {
  TensorDescriptor xd;        // x (and y, dy, dx, z) in x's format
  TensorDescriptor bnd;       // the (C) statistics, plain spatial mode
  TensorDescriptor bnd_nhwc;  // the same derived for the persistent NHWC mode: nhwc_bnd()
  bool nhwc_derived = false;
  ActivationDescriptor relu;  // the fused chains' activation
  // Per Ex ops (CUDNN_BATCHNORM_OPS_BN, _BN_ACTIVATION, _BN_ADD_ACTIVATION): the forward's
  // workspace and reserve queries (their status: a refusal is remembered too) and the
  // backward's workspace query.
  struct Ex {
    bool forward_queried = false, backward_queried = false;
    cudnnStatus_t forward_status = CUDNN_STATUS_SUCCESS;
    size_t forward_ws = 0, reserve = 0, backward_ws = 0;
  };
  Ex ex[3];
};

// gamma = 1, beta = 0 for a layer without affine parameters (cuDNN needs both), and the
// discarded parameter gradients.
struct BnCache {
  Tensor ones, zeros, dscale, dbias;  // (C) each, f32
  bool warned_ex = false;             // the Ex calls were refused once (see the top)
  bool act_declined = false;          // cuDNN declined the fused chain call once (see below)
  // By input shape: N, C, H, W, dtype, memory format, device.
  std::map<std::array<int64_t, 7>, std::unique_ptr<BnDescs>> descs;
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
  bool ex = false;  // trained by the Ex calls (NHWC, persistent mode)
  Tensor reserve;   // their reserve space (u8), which BackwardEx reads
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

// x's descriptor: (N, C, H, W) in x's format, or (N, C, 1, 1) for an (N, C) input.
void set_x_desc(const TensorDescriptor& xd, const Tensor& x, const Dims& d) {
  set_4d(xd, x.dtype(), x.memory_format(), d.n, d.c, d.h, d.w, "BatchNorm");
}

BnDescs& descs_for(BnCache& cache, const Tensor& x, const Dims& d) {
  const std::array<int64_t, 7> key{d.n, d.c, d.h, d.w, static_cast<int64_t>(x.dtype()),
                                   static_cast<int64_t>(x.memory_format()), static_cast<int64_t>(x.device().index)};
  std::unique_ptr<BnDescs>& slot = cache.descs[key];
  if (!slot) {
    auto made = std::make_unique<BnDescs>();
    set_x_desc(made->xd, x, d);
    TNT_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(made->bnd, made->xd, kMode));
    TNT_CUDNN_CHECK(cudnnSetActivationDescriptor(made->relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
    slot = std::move(made);
  }
  return *slot;
}

// The statistics' descriptor for the persistent NHWC mode, derived at the first Ex call (as
// before the cache: paths that never make one never derive it).
const TensorDescriptor& nhwc_bnd(BnDescs& descs) {
  if (!descs.nhwc_derived) {
    TNT_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(descs.bnd_nhwc, descs.xd, kModeNhwc));
    descs.nhwc_derived = true;
  }
  return descs.bnd_nhwc;
}

// cuDNN's checks refusing a call before any work (cuDNN 9 statuses carry their category in
// the thousands).
bool is_refusal(cudnnStatus_t st) {
  const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(st));
  return category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM;
}

BnDescs::Ex& ex_of(BnDescs& descs, cudnnBatchNormOps_t ops) {
  const int i = ops == CUDNN_BATCHNORM_OPS_BN ? 0 : ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION ? 1 : 2;
  return descs.ex[i];
}

// The Ex forward's workspace and reserve sizes for ops (with z for the add), queried once.
const BnDescs::Ex& forward_ex_sizes(BnDescs& descs, cudnnHandle_t h, cudnnBatchNormOps_t ops) {
  BnDescs::Ex& e = ex_of(descs, ops);
  if (!e.forward_queried) {
    const bool act = ops != CUDNN_BATCHNORM_OPS_BN;
    const cudnnTensorDescriptor_t zd =
        ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION ? static_cast<cudnnTensorDescriptor_t>(descs.xd) : nullptr;
    const cudnnActivationDescriptor_t ad = act ? static_cast<cudnnActivationDescriptor_t>(descs.relu) : nullptr;
    cudnnStatus_t st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        h, kModeNhwc, ops, descs.xd, zd, descs.xd, nhwc_bnd(descs), ad, &e.forward_ws);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, kModeNhwc, ops, ad, descs.xd, &e.reserve);
    e.forward_status = st;
    // An answer (the sizes, or a refusal) is kept; another error is asked again next time.
    e.forward_queried = st == CUDNN_STATUS_SUCCESS || is_refusal(st);
  }
  return e;
}

// The Ex backward's workspace for ops, queried once.
size_t backward_ex_workspace(BnDescs& descs, cudnnHandle_t h, cudnnBatchNormOps_t ops) {
  BnDescs::Ex& e = ex_of(descs, ops);
  if (!e.backward_queried) {
    const bool act = ops != CUDNN_BATCHNORM_OPS_BN;
    const cudnnTensorDescriptor_t dzd =
        ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION ? static_cast<cudnnTensorDescriptor_t>(descs.xd) : nullptr;
    const cudnnActivationDescriptor_t ad = act ? static_cast<cudnnActivationDescriptor_t>(descs.relu) : nullptr;
    TNT_CUDNN_CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, kModeNhwc, ops, descs.xd, descs.xd, descs.xd,
                                                                      dzd, descs.xd, nhwc_bnd(descs), ad,
                                                                      &e.backward_ws));
    e.backward_queried = true;
  }
  return e.backward_ws;
}

// Whether an NHWC training step tries the Ex calls (see the top).
bool try_ex(const Tensor& x) { return x.is_channels_last() && !tnt::config().deterministic; }

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

// The same for NHWC, seen as (rows, C) with rows = N*H*W: block (32, 8), thread x along
// the channels (coalesced), thread y along the rows; no division per element.
constexpr int kRowsPerBlock = 8;

template <typename T>
__global__ void bn_inference_dx_nhwc_kernel(const T* __restrict__ dy,        // (N*H*W, C)
                                            const float* __restrict__ gamma,  // (C)
                                            const float* __restrict__ var,    // (C)
                                            float eps, int64_t rows, int64_t channels,
                                            T* __restrict__ dx) {  // (N*H*W, C)
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const int64_t i = r * channels + c;
      dx[i] = from_float<T>(to_float(dy[i]) * gamma[c] / sqrtf(var[c] + eps));
    }
  }
}

// Indexed by (flat index, channel): the same functor serves NCHW and NHWC.
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
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format());
  auto info = std::make_shared<BnSavedCuda>();
  info->training = rc.training;
  saved.extra = info;
  if (x.numel() == 0) {
    saved.tensors = {x, Tensor(), Tensor()};
    return {y};
  }
  BnCache& cache = cache_for(layer, d.c, x.device());
  BnDescs& descs = descs_for(cache, x, d);
  const TensorDescriptor& xd = descs.xd;
  const TensorDescriptor& bnd = descs.bnd;
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
    if (try_ex(x)) {
      // z, its descriptor and the activation are unused with CUDNN_BATCHNORM_OPS_BN: null.
      const TensorDescriptor& bnd_ex = nhwc_bnd(descs);
      const BnDescs::Ex& sizes = forward_ex_sizes(descs, h, kOps);
      const size_t ws_bytes = sizes.forward_ws, reserve_bytes = sizes.reserve;
      cudnnStatus_t st = sizes.forward_status;
      Tensor reserve = Tensor::empty({static_cast<int64_t>(reserve_bytes)}, DType::u8, x.device());
      if (st == CUDNN_STATUS_SUCCESS) {
        Workspace ws(ws_bytes, device);
        st = cudnnBatchNormalizationForwardTrainingEx(
            h, kModeNhwc, kOps, CudnnScalars::one(), CudnnScalars::zero(), xd, x.raw(), nullptr, nullptr, xd, y.raw(),
            bnd_ex, gamma.raw(), beta.raw(), layer.momentum(), running_mean.raw(), running_var.raw(),
            layer.epsilon(), save_mean.raw(), save_inv_std.raw(), nullptr, ws.data(), ws.bytes(),
            reserve_bytes > 0 ? reserve.raw() : nullptr, reserve_bytes);
      }
      if (st == CUDNN_STATUS_SUCCESS) {
        info->ex = true;
        info->reserve = reserve;
        saved.tensors = {x, save_mean, save_inv_std};
        return {y};
      }
      // Refused by cuDNN's checks, before any work (cuDNN 9 statuses carry their category
      // in the thousands): the plain call below does the step. Anything else is an error.
      const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(st));
      TNT_CHECK(category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM,
                "BatchNorm '{}': cudnnBatchNormalizationForwardTrainingEx for {}: {}", layer.name(), x.str(),
                cudnnGetErrorString(st));
      if (!cache.warned_ex) {
        cache.warned_ex = true;
        log_warning("BatchNorm '{}': cuDNN refuses its persistent NHWC mode for {} ({}); using the plain mode",
                    layer.name(), x.str(), cudnnGetErrorString(st));
      }
    }
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
  TNT_CHECK(dy.memory_format() == x.memory_format(),
            "BatchNorm '{}': gradient {} is not {} like the layer's output (the executor gives every output gradient "
            "its output's memory format)",
            layer.name(), dy.str(), memory_format_name(x.memory_format()));
  Dims d = dims_of(layer, x);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format());
  if (x.numel() == 0) return {dx};
  BnCache& cache = cache_for(layer, d.c, x.device());
  const bool affine = layer.affine();
  const Tensor& gamma = affine ? layer.weight()->value : cache.ones;  // (C)
  const Tensor& beta = affine ? layer.bias()->value : cache.zeros;    // (C), BackwardEx only
  const bool weight_grad = affine && layer.weight()->grad.defined();
  const bool bias_grad = affine && layer.bias()->grad.defined();

  if (training) {
    const auto& info = *static_cast<const BnSavedCuda*>(saved.extra.get());
    const Tensor& save_mean = saved.tensors[1];     // (C)
    const Tensor& save_inv_std = saved.tensors[2];  // (C)
    BnDescs& descs = descs_for(cache, x, d);
    const TensorDescriptor& xd = descs.xd;
    const TensorDescriptor& bnd = info.ex ? nhwc_bnd(descs) : descs.bnd;
    // cuDNN writes both parameter gradients with one beta: accumulate (beta 1) into the
    // layer's when both exist, else write both into scratch and add what is needed.
    const bool direct = weight_grad && bias_grad;
    void* dscale = direct ? layer.weight()->grad.raw() : cache.dscale.raw();
    void* dbias = direct ? layer.bias()->grad.raw() : cache.dbias.raw();
    const float* beta_param = direct ? CudnnScalars::one() : CudnnScalars::zero();
    cudnnHandle_t h = cudnn_handle(device);
    if (info.ex) {
      // y, z, dz and the activation are unused with CUDNN_BATCHNORM_OPS_BN: null. The bias
      // is documented as used only with an activation too, but it exists, and a null one is
      // a BAD_PARAM risk with no fallback here (forward already took the Ex path): passed.
      Workspace ws(backward_ex_workspace(descs, h, kOps), device);
      const size_t reserve_bytes = static_cast<size_t>(info.reserve.numel());
      TNT_CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
          h, kModeNhwc, kOps, CudnnScalars::one(), CudnnScalars::zero(), CudnnScalars::one(), beta_param, xd, x.raw(),
          nullptr, nullptr, xd, dy.raw(), nullptr, nullptr, xd, dx.raw(), bnd, gamma.raw(), beta.raw(), dscale, dbias,
          layer.epsilon(), save_mean.raw(), save_inv_std.raw(), nullptr, ws.data(), ws.bytes(),
          reserve_bytes > 0 ? info.reserve.raw() : nullptr, reserve_bytes));
    } else {
      TNT_CUDNN_CHECK(cudnnBatchNormalizationBackward(h, kMode, CudnnScalars::one(), CudnnScalars::zero(),
                                                      CudnnScalars::one(), beta_param, xd, x.raw(), xd, dy.raw(), xd,
                                                      dx.raw(), bnd, gamma.raw(), dscale, dbias, layer.epsilon(),
                                                      save_mean.raw(), save_inv_std.raw()));
    }
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
  const bool nhwc = x.is_channels_last();
  const int64_t rows = d.n * inner;  // NHWC: (N*H*W, C)
  TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "BatchNorm", {
    const scalar_t* dyp = static_cast<const scalar_t*>(dy.raw());
    const float* gp = static_cast<const float*>(gamma.raw());
    const float* vp = static_cast<const float*>(var.raw());
    if (nhwc) {
      bn_inference_dx_nhwc_kernel<scalar_t>
          <<<grid_for(rows, kRowsPerBlock, device), dim3(kWarp, kRowsPerBlock), 0, compute_stream(device)>>>(
              dyp, gp, vp, eps, rows, d.c, static_cast<scalar_t*>(dx.raw()));
    } else {
      bn_inference_dx_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          dyp, gp, vp, eps, n, d.c, inner, static_cast<scalar_t*>(dx.raw()));
    }
    TNT_CUDA_CHECK_LAUNCH();
    // Per-channel sums: over (N, C, HW) planes, or down the columns of (N*H*W, C).
    auto per_channel = [&](auto f, float* out) {
      if (nhwc) {
        column_sum(rows, d.c, f, 1.0f, out, device);
      } else {
        channel_sum(d.n, d.c, inner, f, 1.0f, out, device);
      }
    };
    if (weight_grad) {
      per_channel(DyTimesXhat<scalar_t>{dyp, static_cast<const scalar_t*>(x.raw()),
                                        static_cast<const float*>(mean.raw()), vp, eps},
                  static_cast<float*>(layer.weight()->grad.raw()));
    }
    if (bias_grad) per_channel(LoadAsFloat<scalar_t>{dyp}, static_cast<float*>(layer.bias()->grad.raw()));
  });
  return {dx};
}

// The fused chains (batch_norm_cuda.hpp; the pattern in layers/batch_norm_fusion.cpp).
// SavedState: {x, batch mean, batch 1/std, y}; extra: the reserve space (which holds the
// ReLU's mask for BackwardEx) and whether z was added.
namespace {

struct BnActSaved {
  Tensor reserve;  // u8
  bool add = false;
};


}  // namespace

bool batch_norm_act_forward(BatchNorm& layer, const Tensor& x, const Tensor& z, const RunContext& rc,
                            const std::function<void()>& begin, SavedState& saved, Tensor& y) {
  if (!rc.training || x.ndim() != 4 || !x.is_channels_last() || tnt::config().deterministic || x.numel() == 0 ||
      layer.num_features() != x.dim(1)) {
    return false;
  }
  if (z.defined() && (z.shape() != x.shape() || z.dtype() != x.dtype() || z.memory_format() != x.memory_format() ||
                      z.device() != x.device())) {
    return false;
  }
  int device = common_device({&x}, "BatchNorm");
  BnCache& cache = cache_for(layer, x.dim(1), x.device());
  if (cache.act_declined) return false;
  const cudnnBatchNormOps_t ops =
      z.defined() ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  Dims d = dims_of(layer, x);
  BnDescs& descs = descs_for(cache, x, d);
  const TensorDescriptor& xd = descs.xd;
  const TensorDescriptor& bnd = nhwc_bnd(descs);
  const ActivationDescriptor& ad = descs.relu;
  cudnnHandle_t h = cudnn_handle(device);
  const cudnnTensorDescriptor_t zd = z.defined() ? static_cast<cudnnTensorDescriptor_t>(xd) : nullptr;
  const BnDescs::Ex& sizes = forward_ex_sizes(descs, h, ops);
  const size_t ws_bytes = sizes.forward_ws, reserve_bytes = sizes.reserve;
  const cudnnStatus_t st = sizes.forward_status;
  if (st != CUDNN_STATUS_SUCCESS) {
    TNT_CHECK(is_refusal(st), "BatchNorm '{}': cuDNN's fused batch norm queries for {}: {}", layer.name(), x.str(),
              cudnnGetErrorString(st));
    cache.act_declined = true;
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      log_info("BatchNorm '{}': cuDNN declines its fused batch norm + ReLU for {} ({}); such chains run layer by layer",
               layer.name(), x.str(), cudnnGetErrorString(st));
    }
    return false;
  }
  begin();
  const Tensor& gamma = layer.affine() ? layer.weight()->value : cache.ones;  // (C)
  const Tensor& beta = layer.affine() ? layer.bias()->value : cache.zeros;    // (C)
  y = Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format());
  Tensor save_mean = Tensor::empty({d.c}, DType::f32, x.device());     // (C)
  Tensor save_inv_std = Tensor::empty({d.c}, DType::f32, x.device());  // (C)
  auto info = std::make_shared<BnActSaved>();
  info->reserve = Tensor::empty({static_cast<int64_t>(reserve_bytes)}, DType::u8, x.device());
  info->add = z.defined();
  Workspace ws(ws_bytes, device);
  // Past the queries a refusal is an error: begin() has counted the pass.
  TNT_CUDNN_CHECK(cudnnBatchNormalizationForwardTrainingEx(
      h, kModeNhwc, ops, CudnnScalars::one(), CudnnScalars::zero(), xd, x.raw(), zd, z.defined() ? z.raw() : nullptr,
      xd, y.raw(), bnd, gamma.raw(), beta.raw(), layer.momentum(), layer.running_mean().value.raw(),
      layer.running_var().value.raw(), layer.epsilon(), save_mean.raw(), save_inv_std.raw(), ad, ws.data(), ws.bytes(),
      reserve_bytes > 0 ? info->reserve.raw() : nullptr, reserve_bytes));
  saved.tensors = {x, save_mean, save_inv_std, y};
  saved.extra = info;
  return true;
}

std::vector<Tensor> batch_norm_act_backward(BatchNorm& layer, const Tensor& dy, SavedState& saved) {
  TNT_CHECK(saved.tensors.size() == 4 && saved.extra, "BatchNorm '{}': fused backward without its forward",
            layer.name());
  const auto& info = *static_cast<const BnActSaved*>(saved.extra.get());
  const Tensor& x = saved.tensors[0];
  const Tensor& y = saved.tensors[3];
  int device = common_device({&x, &dy}, "BatchNorm backward");
  TNT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype() && dy.memory_format() == x.memory_format(),
            "BatchNorm '{}': gradient {} for the fused chain's output {}", layer.name(), dy.str(), y.str());
  Dims d = dims_of(layer, x);
  BnCache& cache = cache_for(layer, d.c, x.device());
  const bool affine = layer.affine();
  const Tensor& gamma = affine ? layer.weight()->value : cache.ones;
  const Tensor& beta = affine ? layer.bias()->value : cache.zeros;
  const bool weight_grad = affine && layer.weight()->grad.defined();
  const bool bias_grad = affine && layer.bias()->grad.defined();
  const bool direct = weight_grad && bias_grad;  // as batch_norm_backward
  void* dscale = direct ? layer.weight()->grad.raw() : cache.dscale.raw();
  void* dbias = direct ? layer.bias()->grad.raw() : cache.dbias.raw();
  const float* beta_param = direct ? CudnnScalars::one() : CudnnScalars::zero();
  const cudnnBatchNormOps_t ops = info.add ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  BnDescs& descs = descs_for(cache, x, d);
  const TensorDescriptor& xd = descs.xd;
  const TensorDescriptor& bnd = nhwc_bnd(descs);
  const ActivationDescriptor& ad = descs.relu;
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format());
  Tensor dz = info.add ? Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format()) : Tensor();
  const cudnnTensorDescriptor_t dzd = info.add ? static_cast<cudnnTensorDescriptor_t>(xd) : nullptr;
  cudnnHandle_t h = cudnn_handle(device);
  Workspace ws(backward_ex_workspace(descs, h, ops), device);
  const size_t reserve_bytes = static_cast<size_t>(info.reserve.numel());
  TNT_CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
      h, kModeNhwc, ops, CudnnScalars::one(), CudnnScalars::zero(), CudnnScalars::one(), beta_param, xd, x.raw(), xd,
      y.raw(), xd, dy.raw(), dzd, info.add ? dz.raw() : nullptr, xd, dx.raw(), bnd, gamma.raw(), beta.raw(), dscale,
      dbias, layer.epsilon(), saved.tensors[1].raw(), saved.tensors[2].raw(), ad, ws.data(), ws.bytes(),
      reserve_bytes > 0 ? info.reserve.raw() : nullptr, reserve_bytes));
  if (!direct) {
    if (weight_grad) axpy(1.0, cache.dscale, layer.weight()->grad);
    if (bias_grad) axpy(1.0, cache.dbias, layer.bias()->grad);
  }
  return {dx, dz};
}

}  // namespace tnt::cuda
