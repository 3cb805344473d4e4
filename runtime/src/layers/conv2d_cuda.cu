// Conv2D on CUDA with cuDNN. For each input shape a plan (descriptors and the three
// algorithms: forward, backward data, backward filter) is made once and cached in the
// layer's CUDA engine cache; workspaces come from the caching allocator per call, so after
// the first step they are cached blocks.
//
// Algorithms come from cuDNN's heuristics (Get_v7), best first; we take the first that
// succeeded, fits kMaxWorkspace and, in deterministic mode (TNT_DETERMINISTIC), is
// deterministic. Heuristics need no trial runs, so planning has no side effects on the
// gradients being accumulated (cudnnFind* would overwrite the filter gradient buffer).
//
// Precision: f32 convolutions run with CUDNN_DEFAULT_MATH, which lets cuDNN use TF32
// tensor cores on Ampere and later (PyTorch's default for convolutions): products carry
// about 2^-10 relative error instead of 2^-24. Tests bound the difference accordingly.
#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/reduce.cuh"
#include "layers/cuda_engines.hpp"
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
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    TNT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, plan->w, plan->y, plan->conv_bwd_data, plan->x,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
    const auto& p = choose(perf, returned, "backward-data", layer, s);
    plan->bwd_data_algo = p.algo;
    TNT_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv_bwd_data, p.mathType));
    TNT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, plan->w, plan->y, plan->conv_bwd_data, plan->x,
                                                                 p.algo, &plan->bwd_data_ws));
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    TNT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, plan->x, plan->y, plan->conv_bwd_filter, plan->w,
                                                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned,
                                                                  perf));
    const auto& p = choose(perf, returned, "backward-filter", layer, s);
    plan->bwd_filter_algo = p.algo;
    TNT_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv_bwd_filter, p.mathType));
    TNT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, plan->x, plan->y, plan->conv_bwd_filter,
                                                                   plan->w, p.algo, &plan->bwd_filter_ws));
  }
  ConvPlan& ref = *plan;
  cache.plans.emplace(key, std::move(plan));
  return ref;
}

}  // namespace

std::vector<Tensor> conv2d_forward(Conv2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                   SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);          // (N, C, H, W)
  const Tensor& w = layer.weight().value;  // (F, C, k, k)
  Parameter* bias = layer.bias();          // (F)
  int device = common_device({&x, &w}, "Conv2D");
  TNT_CHECK(x.ndim() == 4 && x.dim(1) == layer.in_channels(), "Conv2D '{}': input {} is not (N, {}, H, W)",
            layer.name(), x.str(), layer.in_channels());
  TNT_CHECK(x.dtype() == w.dtype(), "Conv2D '{}': input {} and weight {} differ in dtype", layer.name(), x.str(),
            w.str());
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
    TNT_CHECK(bias->value.dtype() == DType::f32 && x.dtype() == DType::f32,
              "Conv2D '{}': the CUDA engine adds an f32 bias to f32 outputs only", layer.name());
    TNT_CUDNN_CHECK(cudnnAddTensor(h, CudnnScalars::one(), plan.bias, bias->value.raw(), CudnnScalars::one(), plan.y,
                                   y.raw()));
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
  const Tensor& x = saved.tensors[0];      // (N, C, H, W)
  const Tensor& dy = grad_outputs.at(0);   // (N, F, Ho, Wo)
  const Tensor& w = layer.weight().value;  // (F, C, k, k)
  const Tensor& dw = layer.weight().grad;  // (F, C, k, k)
  Parameter* bias = layer.bias();
  int device = common_device({&x, &dy, &w}, "Conv2D backward");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());  // (N, C, H, W)
  if (x.dim(0) == 0) return {dx};
  ConvPlan& plan = plan_for(layer, x, device);
  TNT_CHECK(dy.dtype() == x.dtype() && dy.shape() == Shape({x.dim(0), layer.filters(), plan.ho, plan.wo}),
            "Conv2D '{}': gradient {} does not match the output ({}, {}, {}, {})", layer.name(), dy.str(), x.dim(0),
            layer.filters(), plan.ho, plan.wo);
  cudnnHandle_t h = cudnn_handle(device);
  {
    Workspace ws(plan.bwd_data_ws, device);
    TNT_CUDNN_CHECK(cudnnConvolutionBackwardData(h, CudnnScalars::one(), plan.w, w.raw(), plan.y, dy.raw(),
                                                 plan.conv_bwd_data, plan.bwd_data_algo, ws.data(), ws.bytes(),
                                                 CudnnScalars::zero(), plan.x, dx.raw()));
  }
  if (dw.defined()) {
    Workspace ws(plan.bwd_filter_ws, device);
    // beta = 1: the gradient accumulates over the calls of a step.
    TNT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, CudnnScalars::one(), plan.x, x.raw(), plan.y, dy.raw(),
                                                   plan.conv_bwd_filter, plan.bwd_filter_algo, ws.data(), ws.bytes(),
                                                   CudnnScalars::one(), plan.w, dw.raw()));
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
