// Conv2D on CUDA with cuDNN. For each input shape a plan (descriptors and the three
// algorithms: forward, backward data, backward filter) is made once and cached in the
// layer's CUDA engine cache; workspaces come from the caching allocator per call, so after
// the first step they are cached blocks. A backward algorithm is chosen by the first
// backward that runs it: a network's first layer never computes its input gradient
// (SavedState::need_input_grads), and for some configurations (f16/bf16 with 3 input
// channels, deterministic mode) cuDNN may offer no backward-data algorithm at all, which
// must not stop a layer that never needs one.
//
// Algorithms come from cuDNN's heuristics (Get_v7), best first; we take the first that
// succeeded, fits kMaxWorkspace and, in deterministic mode (TNT_DETERMINISTIC), is
// deterministic. Heuristics need no trial runs, so planning has no side effects on the
// gradients being accumulated (cudnnFind* would overwrite the filter gradient buffer).
//
// Precision: f32 convolutions run with CUDNN_DEFAULT_MATH, which lets cuDNN use TF32
// tensor cores on Ampere and later (PyTorch's default for convolutions): products carry
// about 2^-10 relative error instead of 2^-24. Tests bound the difference accordingly.
//
// Mixed precision: an f16/bf16 input is convolved with the weight's compute copy
// (compute_value) in tensor-op math with f32 accumulation (the descriptors' compute type is
// float: cuDNN's "pseudo half" configurations); y and dx have the input's dtype. cuDNN
// writes the filter gradient in the filter descriptor's dtype, so it goes into a temporary
// half tensor (beta 0) that accumulate_as_float adds to the f32 master gradient. The f32
// bias is added by our kernel in float to cuDNN's already rounded half output, so that
// output is rounded twice (cudnnAddTensor wants the bias in the output's dtype).
#include "layers/conv2d_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/reduce.cuh"
#include "tarantella/runtime.hpp"

#include <array>
#include <map>
#include <memory>

namespace tnt::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t{1} << 30;

struct ConvPlan {
  TensorDescriptor x, y;  // (N, C, H, W), (N, F, Ho, Wo)
  FilterDescriptor w;     // (F, C, k, k)
  // One convolution descriptor per direction: each carries its algorithm's math type.
  ConvolutionDescriptor conv_fwd, conv_bwd_data, conv_bwd_filter;
  TensorDescriptor bias;  // (1, F, 1, 1)
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
  bool has_bwd_data = false, has_bwd_filter = false;  // chosen yet (see the top)
  int64_t ho = 0, wo = 0;
};

using PlanKey = std::array<int64_t, 5>;  // N, C, H, W, dtype

struct ConvCache {
  std::map<PlanKey, std::unique_ptr<ConvPlan>> plans;
};

void set_conv(const ConvolutionDescriptor& conv, const Conv2D& layer, DType dtype) {
  const int pad = cudnn_dim(layer.padding(), "Conv2D padding"), stride = cudnn_dim(layer.stride(), "Conv2D stride");
  TNT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, pad, pad, stride, stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
  // Tensor cores for f16/bf16; for f32 the default (TF32 allowed, see the top).
  TNT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, dtype == DType::f32 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH));
}

// Picks the first acceptable entry of a heuristics list (best first).
template <typename Perf>
const Perf& choose(const Perf* perf, int count, const char* direction, const Conv2D& layer, const Shape& x_shape) {
  const bool deterministic = tnt::config().deterministic;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < count; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
      if (deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
      // First pass: within the workspace limit; second: the best there is.
      if (pass == 0 && perf[i].memory > kMaxWorkspace) continue;
      return perf[i];
    }
  }
  TNT_THROW("Conv2D '{}': cuDNN offers no {}{} algorithm for input {}", layer.name(),
            deterministic ? "deterministic " : "", direction, shape_str(x_shape));
}

ConvPlan& plan_for(Conv2D& layer, const Tensor& x, int device) {
  std::shared_ptr<void>& slot = layer.engine_cache(Device::Kind::cuda);
  if (!slot) slot = std::make_shared<ConvCache>();
  auto& cache = *static_cast<ConvCache*>(slot.get());
  const Shape& s = x.shape();
  PlanKey key{s[0], s[1], s[2], s[3], static_cast<int64_t>(x.dtype())};
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return *it->second;

  auto plan = std::make_unique<ConvPlan>();
  const char* what = "Conv2D";
  const DType dt = x.dtype();
  const int64_t f = layer.filters(), k = layer.kernel_size();
  set_nchw(plan->x, dt, s[0], s[1], s[2], s[3], what);
  TNT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w, cudnn_dtype(dt, what), CUDNN_TENSOR_NCHW, cudnn_dim(f, what),
                                             cudnn_dim(s[1], what), cudnn_dim(k, what), cudnn_dim(k, what)));
  for (const ConvolutionDescriptor* c : {&plan->conv_fwd, &plan->conv_bwd_data, &plan->conv_bwd_filter})
    set_conv(*c, layer, dt);
  int n = 0, co = 0, ho = 0, wo = 0;
  TNT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan->conv_fwd, plan->x, plan->w, &n, &co, &ho, &wo));
  plan->ho = ho;
  plan->wo = wo;
  set_nchw(plan->y, dt, n, co, ho, wo, what);
  set_nchw(plan->bias, DType::f32, 1, f, 1, 1, what);

  cudnnHandle_t h = cudnn_handle(device);
  int returned = 0;
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    TNT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, plan->x, plan->w, plan->conv_fwd, plan->y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf));
    const auto& p = choose(perf, returned, "forward", layer, s);
    plan->fwd_algo = p.algo;
    TNT_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv_fwd, p.mathType));
    TNT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, plan->x, plan->w, plan->conv_fwd, plan->y, p.algo,
                                                            &plan->fwd_ws));
  }
  ConvPlan& ref = *plan;
  cache.plans.emplace(key, std::move(plan));
  return ref;
}

void plan_backward_data(ConvPlan& plan, const Conv2D& layer, const Shape& s, int device) {
  if (plan.has_bwd_data) return;
  cudnnHandle_t h = cudnn_handle(device);
  int returned = 0;
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  TNT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, plan.w, plan.y, plan.conv_bwd_data, plan.x,
                                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
  const auto& p = choose(perf, returned, "backward-data", layer, s);
  plan.bwd_data_algo = p.algo;
  TNT_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv_bwd_data, p.mathType));
  TNT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, plan.w, plan.y, plan.conv_bwd_data, plan.x, p.algo,
                                                               &plan.bwd_data_ws));
  plan.has_bwd_data = true;
}

void plan_backward_filter(ConvPlan& plan, const Conv2D& layer, const Shape& s, int device) {
  if (plan.has_bwd_filter) return;
  cudnnHandle_t h = cudnn_handle(device);
  int returned = 0;
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  TNT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, plan.x, plan.y, plan.conv_bwd_filter, plan.w,
                                                                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned,
                                                                perf));
  const auto& p = choose(perf, returned, "backward-filter", layer, s);
  plan.bwd_filter_algo = p.algo;
  TNT_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv_bwd_filter, p.mathType));
  TNT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, plan.x, plan.y, plan.conv_bwd_filter, plan.w,
                                                                 p.algo, &plan.bwd_filter_ws));
  plan.has_bwd_filter = true;
}

// y += bias per channel, in float, for half outputs.
template <typename T>
__global__ void add_channel_bias_kernel(T* __restrict__ y,               // (N, F, Ho*Wo)
                                        const float* __restrict__ bias,  // (F)
                                        int64_t n, int64_t channels, int64_t inner) {
  TNT_KERNEL_LOOP(i, n) { y[i] = from_float<T>(to_float(y[i]) + bias[(i / inner) % channels]); }
}

}  // namespace

std::vector<Tensor> conv2d_forward(Conv2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                   SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);  // (N, C, H, W)
  // The f32 weight itself for an f32 input, else the network's half copy of it.
  const Tensor& w = compute_value(layer.weight(), x.dtype(), layer.name());  // (F, C, k, k)
  Parameter* bias = layer.bias();                                              // (F), f32
  int device = common_device({&x, &w}, "Conv2D");
  TNT_CHECK(x.ndim() == 4 && x.dim(1) == layer.in_channels(), "Conv2D '{}': input {} is not (N, {}, H, W)",
            layer.name(), x.str(), layer.in_channels());
  const int64_t n = x.dim(0), f = layer.filters();
  if (n == 0) {
    Shape out = layer.output_shapes({x.shape()}).at(0);
    saved.tensors = {x, Tensor()};
    return {Tensor::empty(out, x.dtype(), x.device())};
  }
  ConvPlan& plan = plan_for(layer, x, device);
  Tensor y = Tensor::empty({n, f, plan.ho, plan.wo}, x.dtype(), x.device());  // (N, F, Ho, Wo)
  cudnnHandle_t h = cudnn_handle(device);
  {
    Workspace ws(plan.fwd_ws, device);
    TNT_CUDNN_CHECK(cudnnConvolutionForward(h, CudnnScalars::one(), plan.x, x.raw(), plan.w, w.raw(), plan.conv_fwd,
                                            plan.fwd_algo, ws.data(), ws.bytes(), CudnnScalars::zero(), plan.y,
                                            y.raw()));
  }
  if (bias) {
    TNT_CHECK(bias->value.dtype() == DType::f32, "Conv2D '{}': the CUDA engine needs an f32 bias, got {}",
              layer.name(), bias->value.str());
    if (x.dtype() == DType::f32) {
      TNT_CUDNN_CHECK(cudnnAddTensor(h, CudnnScalars::one(), plan.bias, bias->value.raw(), CudnnScalars::one(),
                                     plan.y, y.raw()));
    } else {
      const int64_t total = y.numel(), inner = plan.ho * plan.wo;
      TNT_CUDA_DISPATCH_FLOAT(y.dtype(), "Conv2D", {
        add_channel_bias_kernel<scalar_t><<<grid_for(total, kBlock, device), kBlock, 0, compute_stream(device)>>>(
            static_cast<scalar_t*>(y.raw()), static_cast<const float*>(bias->value.raw()), total, f, inner);
      });
      TNT_CUDA_CHECK_LAUNCH();
    }
  }
  // Two entries, as the CPU engine keeps (Conv2D::backward checks the count before it
  // dispatches); the second is unused here.
  saved.tensors = {x, Tensor()};
  return {y};
}

std::vector<Tensor> conv2d_backward(Conv2D& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                    SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 2, "Conv2D '{}': backward without a forward", layer.name());
  const Tensor& x = saved.tensors[0];                                          // (N, C, H, W)
  const Tensor& dy = grad_outputs.at(0);                                       // (N, F, Ho, Wo)
  const Tensor& w = compute_value(layer.weight(), x.dtype(), layer.name());  // (F, C, k, k)
  const Tensor& dw = layer.weight().grad;                                      // (F, C, k, k), f32
  Parameter* bias = layer.bias();
  int device = common_device({&x, &dy, &w}, "Conv2D backward");
  // The first layer of a network may skip its input gradient (SavedState::need_input_grads):
  // for the convolution on the images it costs as much as the weight gradient.
  Tensor dx = saved.need_input_grads ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();  // (N, C, H, W)
  if (x.dim(0) == 0) return {dx};
  ConvPlan& plan = plan_for(layer, x, device);
  TNT_CHECK(dy.dtype() == x.dtype() && dy.shape() == Shape({x.dim(0), layer.filters(), plan.ho, plan.wo}),
            "Conv2D '{}': gradient {} does not match the output ({}, {}, {}, {}) {}", layer.name(), dy.str(),
            x.dim(0), layer.filters(), plan.ho, plan.wo, dtype_name(x.dtype()));
  cudnnHandle_t h = cudnn_handle(device);
  if (dx.defined()) {
    plan_backward_data(plan, layer, x.shape(), device);
    Workspace ws(plan.bwd_data_ws, device);
    TNT_CUDNN_CHECK(cudnnConvolutionBackwardData(h, CudnnScalars::one(), plan.w, w.raw(), plan.y, dy.raw(),
                                                 plan.conv_bwd_data, plan.bwd_data_algo, ws.data(), ws.bytes(),
                                                 CudnnScalars::zero(), plan.x, dx.raw()));
  }
  if (dw.defined()) {
    TNT_CHECK(dw.dtype() == DType::f32 || dw.dtype() == x.dtype(), "Conv2D '{}': weight gradient {} for input {}",
              layer.name(), dw.str(), x.str());
    plan_backward_filter(plan, layer, x.shape(), device);
    Workspace ws(plan.bwd_filter_ws, device);
    if (dw.dtype() == x.dtype()) {
      // beta = 1: the gradient accumulates over the calls of a step.
      TNT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, CudnnScalars::one(), plan.x, x.raw(), plan.y, dy.raw(),
                                                     plan.conv_bwd_filter, plan.bwd_filter_algo, ws.data(),
                                                     ws.bytes(), CudnnScalars::one(), plan.w, dw.raw()));
    } else {
      // Mixed precision: this call's gradient in the filter's (half) dtype, then added in
      // float to the f32 master gradient. The temporary returns to the allocator's cache at
      // scope exit, safely: the kernels that use it are queued on the compute stream.
      Tensor part = Tensor::empty(dw.shape(), x.dtype(), x.device());  // (F, C, k, k)
      TNT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, CudnnScalars::one(), plan.x, x.raw(), plan.y, dy.raw(),
                                                     plan.conv_bwd_filter, plan.bwd_filter_algo, ws.data(),
                                                     ws.bytes(), CudnnScalars::zero(), plan.w, part.raw()));
      accumulate_as_float(part, dw);
    }
  }
  if (bias && bias->grad.defined()) {
    TNT_CHECK(bias->grad.dtype() == DType::f32, "Conv2D '{}': bias gradient must be f32, got {}", layer.name(),
              bias->grad.str());
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "Conv2D", {
      channel_sum(dy.dim(0), dy.dim(1), plan.ho * plan.wo,
                  LoadAsFloat<scalar_t>{static_cast<const scalar_t*>(dy.raw())}, 1.0f,
                  static_cast<float*>(bias->grad.raw()), device);
    });
  }
  return {dx};
}

}  // namespace tnt::cuda
