// Pooling on CUDA.
// MaxPool2D is ours: the contract (padding never wins, a NaN anywhere in a window is the
// output, the gradient goes to the FIRST maximum of a window in row-major order, or to its
// first NaN) is exact only if we pick the argmax ourselves; cuDNN does not document how it
// breaks ties, and ties are common after a ReLU. The forward records each window's argmax;
// the backward gathers, for every input position, the gradients of the windows whose argmax
// it is, in a fixed order: no atomics, so overlapping windows (3x3 stride 2) stay
// deterministic.
// AvgPool2D is cuDNN's average pooling excluding padding (deterministic in both passes).
// GlobalAveragePool is ours (one warp per (n, c) plane).
#include "layers/pooling_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"

#include <memory>

namespace tnt::cuda {

namespace {

struct PoolGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0, ho = 0, wo = 0, pool = 0, stride = 0, pad = 0;
};

PoolGeometry geometry(const Pool2DBase& layer, const Shape& x) {
  TNT_CHECK(x.size() == 4, "{} '{}': input {} is not (N, C, H, W)", layer.type(), layer.name(), shape_str(x));
  PoolGeometry g;
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.pool = layer.pool_size();
  g.stride = layer.stride() > 0 ? layer.stride() : layer.pool_size();
  g.pad = layer.padding();
  Shape out = layer.output_shapes({x}).at(0);
  g.ho = out.at(2);
  g.wo = out.at(3);
  return g;
}

template <typename T>
__global__ void max_pool_forward_kernel(const T* __restrict__ x,  // (N, C, H, W)
                                        PoolGeometry g,
                                        T* __restrict__ y,                // (N, C, Ho, Wo)
                                        int32_t* __restrict__ argmax) {   // (N, C, Ho, Wo), ih * W + iw or -1
  const int64_t total = g.n * g.c * g.ho * g.wo;
  TNT_KERNEL_LOOP(o, total) {
    const int64_t ow = o % g.wo, oh = (o / g.wo) % g.ho, plane = o / (g.wo * g.ho);
    const T* xp = x + plane * g.h * g.w;
    float best = 0.0f;
    int32_t best_at = -1;
    for (int64_t i = 0; i < g.pool; ++i) {
      const int64_t ih = oh * g.stride - g.pad + i;
      if (ih < 0 || ih >= g.h) continue;
      for (int64_t j = 0; j < g.pool; ++j) {
        const int64_t iw = ow * g.stride - g.pad + j;
        if (iw < 0 || iw >= g.w) continue;
        const float v = to_float(xp[ih * g.w + iw]);
        // Strict, so the first maximum stays; a NaN beats any number (v > NaN is false, so
        // without the second test a NaN after the first element would never win) and the
        // first NaN stays, as in the CPU engine.
        if (best_at < 0 || v > best || (v != v && best == best)) {
          best = v;
          best_at = static_cast<int32_t>(ih * g.w + iw);
        }
      }
    }
    y[o] = best_at < 0 ? from_float<T>(0.0f) : xp[best_at];
    argmax[o] = best_at;
  }
}

template <typename T>
__global__ void max_pool_backward_kernel(const T* __restrict__ dy,             // (N, C, Ho, Wo)
                                         const int32_t* __restrict__ argmax,  // (N, C, Ho, Wo)
                                         PoolGeometry g,
                                         T* __restrict__ dx) {  // (N, C, H, W)
  const int64_t total = g.n * g.c * g.h * g.w;
  TNT_KERNEL_LOOP(i, total) {
    const int64_t iw = i % g.w, ih = (i / g.w) % g.h, plane = i / (g.w * g.h);
    const int32_t here = static_cast<int32_t>(ih * g.w + iw);
    // Windows containing ih: oh * stride - pad <= ih <= oh * stride - pad + pool - 1.
    const int64_t oh0 = ih + g.pad < g.pool ? 0 : (ih + g.pad - g.pool) / g.stride + 1;
    const int64_t oh1 = min((ih + g.pad) / g.stride, g.ho - 1);
    const int64_t ow0 = iw + g.pad < g.pool ? 0 : (iw + g.pad - g.pool) / g.stride + 1;
    const int64_t ow1 = min((iw + g.pad) / g.stride, g.wo - 1);
    const int64_t base = plane * g.ho * g.wo;
    float acc = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t o = base + oh * g.wo + ow;
        if (argmax[o] == here) acc += to_float(dy[o]);
      }
    }
    dx[i] = from_float<T>(acc);
  }
}

// One warp per (n, c) plane of hw elements.
template <typename T>
__global__ void gap_forward_kernel(const T* __restrict__ x,  // (N*C, HW)
                                   int64_t planes, int64_t hw,
                                   T* __restrict__ y) {  // (N*C)
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_per_block = blockDim.x / kWarp;
  for (int64_t p = blockIdx.x * warps_per_block + threadIdx.x / kWarp; p < planes;
       p += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    float acc = 0.0f;
    for (int64_t j = lane; j < hw; j += kWarp) acc += to_float(x[p * hw + j]);
    acc = warp_sum(acc);
    if (lane == 0) y[p] = from_float<T>(acc / static_cast<float>(hw));
  }
}

// dy * (1 / HW), the CPU engine's arithmetic.
template <typename T>
__global__ void gap_backward_kernel(const T* __restrict__ dy,  // (N*C)
                                    int64_t total, int64_t hw, float inv_hw,
                                    T* __restrict__ dx) {  // (N*C, HW)
  TNT_KERNEL_LOOP(i, total) { dx[i] = from_float<T>(to_float(dy[i / hw]) * inv_hw); }
}

void set_avg_pool(const PoolingDescriptor& pd, const PoolGeometry& g) {
  const char* what = "AvgPool2D";
  const int win = cudnn_dim(g.pool, what), pad = cudnn_dim(g.pad, what), stride = cudnn_dim(g.stride, what);
  TNT_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pd, CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, CUDNN_NOT_PROPAGATE_NAN,
                                              win, win, pad, pad, stride, stride));
}

}  // namespace

std::vector<Tensor> max_pool2d_forward(MaxPool2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);  // (N, C, H, W)
  int device = common_device({&x}, "MaxPool2D");
  PoolGeometry g = geometry(layer, x.shape());
  TNT_CHECK(g.h * g.w <= INT32_MAX, "MaxPool2D '{}': plane of {} x {} too large", layer.name(), g.h, g.w);
  Tensor y = Tensor::empty({g.n, g.c, g.ho, g.wo}, x.dtype(), x.device());             // (N, C, Ho, Wo)
  Tensor argmax = Tensor::empty({g.n, g.c, g.ho, g.wo}, DType::i32, x.device());       // (N, C, Ho, Wo)
  const int64_t total = y.numel();
  if (total > 0) {
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "MaxPool2D", {
      max_pool_forward_kernel<scalar_t><<<grid_for(total, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(x.raw()), g, static_cast<scalar_t*>(y.raw()), argmax.data<int32_t>());
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  // Like the CPU engine: the argmax, and the input's shape in extra (x itself is not kept).
  saved.tensors = {argmax};
  saved.extra = std::make_shared<Shape>(x.shape());
  return {y};
}

std::vector<Tensor> max_pool2d_backward(MaxPool2D& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 1 && saved.extra, "MaxPool2D '{}': backward without a forward", layer.name());
  const Tensor& argmax = saved.tensors[0];
  const Shape& x_shape = *static_cast<const Shape*>(saved.extra.get());
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&argmax, &dy}, "MaxPool2D backward");
  PoolGeometry g = geometry(layer, x_shape);
  TNT_CHECK(dy.shape() == argmax.shape(), "MaxPool2D '{}': gradient {} for output {}", layer.name(), dy.str(),
            shape_str(argmax.shape()));
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
  const int64_t total = dx.numel();
  if (total > 0) {
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "MaxPool2D", {
      max_pool_backward_kernel<scalar_t><<<grid_for(total, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(dy.raw()), argmax.data<int32_t>(), g, static_cast<scalar_t*>(dx.raw()));
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  return {dx};
}

std::vector<Tensor> avg_pool2d_forward(AvgPool2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);  // (N, C, H, W)
  int device = common_device({&x}, "AvgPool2D");
  PoolGeometry g = geometry(layer, x.shape());
  Tensor y = Tensor::empty({g.n, g.c, g.ho, g.wo}, x.dtype(), x.device());  // (N, C, Ho, Wo)
  if (y.numel() > 0) {
    PoolingDescriptor pd;
    set_avg_pool(pd, g);
    TensorDescriptor xd, yd;
    set_nchw(xd, x.dtype(), g.n, g.c, g.h, g.w, "AvgPool2D");
    set_nchw(yd, x.dtype(), g.n, g.c, g.ho, g.wo, "AvgPool2D");
    TNT_CUDNN_CHECK(cudnnPoolingForward(cudnn_handle(device), pd, CudnnScalars::one(), xd, x.raw(),
                                        CudnnScalars::zero(), yd, y.raw()));
  }
  saved.tensors = {x, y};
  return {y};
}

std::vector<Tensor> avg_pool2d_backward(AvgPool2D& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 2, "AvgPool2D '{}': backward without a forward", layer.name());
  const Tensor& x = saved.tensors[0];
  const Tensor& y = saved.tensors[1];
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&x, &dy}, "AvgPool2D backward");
  PoolGeometry g = geometry(layer, x.shape());
  TNT_CHECK(dy.shape() == y.shape() && dy.dtype() == x.dtype(), "AvgPool2D '{}': gradient {} for output {}",
            layer.name(), dy.str(), y.str());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return {dx};
  if (y.numel() == 0) {
    TNT_CUDA_CHECK(cudaMemsetAsync(dx.raw(), 0, dx.nbytes(), compute_stream(device)));
    return {dx};
  }
  PoolingDescriptor pd;
  set_avg_pool(pd, g);
  TensorDescriptor xd, yd;
  set_nchw(xd, x.dtype(), g.n, g.c, g.h, g.w, "AvgPool2D");
  set_nchw(yd, x.dtype(), g.n, g.c, g.ho, g.wo, "AvgPool2D");
  TNT_CUDNN_CHECK(cudnnPoolingBackward(cudnn_handle(device), pd, CudnnScalars::one(), yd, y.raw(), yd, dy.raw(), xd,
                                       x.raw(), CudnnScalars::zero(), xd, dx.raw()));
  return {dx};
}

std::vector<Tensor> global_average_pool_forward(GlobalAveragePool& layer, const std::vector<Tensor>& inputs,
                                                const RunContext& rc, SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);  // (N, C, H, W)
  int device = common_device({&x}, "GlobalAveragePool");
  TNT_CHECK(x.ndim() == 4, "GlobalAveragePool '{}': input {} is not (N, C, H, W)", layer.name(), x.str());
  const int64_t planes = x.dim(0) * x.dim(1), hw = x.dim(2) * x.dim(3);
  Tensor y = Tensor::empty({x.dim(0), x.dim(1)}, x.dtype(), x.device());  // (N, C)
  if (planes > 0) {
    TNT_CHECK(hw > 0, "GlobalAveragePool '{}': input {} has empty planes", layer.name(), x.str());
    constexpr int warps = kBlock / kWarp;
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "GlobalAveragePool", {
      gap_forward_kernel<scalar_t><<<grid_for(planes, warps, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(x.raw()), planes, hw, static_cast<scalar_t*>(y.raw()));
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  // Like the CPU engine: backward needs only the input's shape.
  saved.tensors.clear();
  saved.extra = std::make_shared<Shape>(x.shape());
  return {y};
}

std::vector<Tensor> global_average_pool_backward(GlobalAveragePool& layer, const std::vector<Tensor>& grad_outputs,
                                                 const RunContext& rc, SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.extra, "GlobalAveragePool '{}': backward without a forward", layer.name());
  const Shape& xs = *static_cast<const Shape*>(saved.extra.get());  // (N, C, H, W)
  const Tensor& dy = grad_outputs.at(0);                            // (N, C)
  int device = common_device({&dy}, "GlobalAveragePool backward");
  const int64_t hw = xs[2] * xs[3], total = shape_numel(xs);
  TNT_CHECK(dy.numel() == xs[0] * xs[1], "GlobalAveragePool '{}': gradient {} for input {}", layer.name(), dy.str(),
            shape_str(xs));
  Tensor dx = Tensor::empty(xs, dy.dtype(), dy.device());
  if (total > 0) {
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "GlobalAveragePool", {
      gap_backward_kernel<scalar_t><<<grid_for(total, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(dy.raw()), total, hw, 1.0f / static_cast<float>(hw),
          static_cast<scalar_t*>(dx.raw()));
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  return {dx};
}

}  // namespace tnt::cuda
