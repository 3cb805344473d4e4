// Pooling on CUDA.
// MaxPool2D is ours: the contract (padding never wins, a NaN anywhere in a window is the
// output, the gradient goes to the FIRST maximum of a window in row-major order, or to its
// first NaN) is exact only if we pick the argmax ourselves; cuDNN does not document how it
// breaks ties, and ties are common after a ReLU. The forward records each window's argmax;
// the backward gathers, for every input position, the gradients of the windows whose argmax
// it is, in a fixed order: no atomics, so overlapping windows (3x3 stride 2) stay
// deterministic.
// AvgPool2D is cuDNN's average pooling excluding padding (deterministic in both passes).
// GlobalAveragePool is ours (one warp per (n, c) plane, 16-byte loads and stores where the
// planes are aligned to them).
//
// Memory formats: every engine takes either format and returns its output and dx in the
// input's (GlobalAveragePool's (N, C) output is the same in both); dy must be in the
// output's format (the executor's contract). The NHWC max-pool kernels index outputs and
// inputs by (n, h, w, c), so neighbouring threads touch neighbouring channels (coalesced);
// argmax keeps its meaning (ih * W + iw within the window's (n, c) plane) and the same
// contract. AvgPool2D gives cuDNN NHWC descriptors. NHWC global average pooling sums the
// columns of each image's (H*W, C) matrix, 32 channels per block, in a fixed order.
#include "layers/pooling_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/reduce.cuh"
#include "layers/pooling_nhwc_cuda.cuh"

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>

namespace tnt::cuda {

namespace {

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
    int64_t oh0, oh1, ow0, ow1;
    windows_holding(ih, g.pad, g.pool, g.stride, g.ho, oh0, oh1);
    windows_holding(iw, g.pad, g.pool, g.stride, g.wo, ow0, ow1);
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

// Whether every index of x and y of a pooling fits int32_t, with room for the grid-stride
// loop's last step (o + blockDim * gridDim must not overflow).
bool fits_int32(const PoolGeometry& g) {
  const int64_t largest = std::max(g.n * g.c * g.h * g.w, g.n * g.c * g.ho * g.wo);
  return largest <= INT32_MAX / 2;
}

// Contiguous global average pooling: one warp per (n, c) plane of hw elements. With
// kVector every plane starts on a 16-byte boundary and holds whole 16-byte words (the host
// checks), and lanes load 16 bytes at a time.
template <typename T, bool kVector>
__global__ void gap_forward_kernel(const T* __restrict__ x,  // (N*C, HW)
                                   int64_t planes, int64_t hw,
                                   T* __restrict__ y) {  // (N*C)
  constexpr int kPerWord = 16 / sizeof(T);
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_per_block = blockDim.x / kWarp;
  for (int64_t p = blockIdx.x * warps_per_block + threadIdx.x / kWarp; p < planes;
       p += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    float acc = 0.0f;
    if (kVector) {
      const uint4* words = reinterpret_cast<const uint4*>(x + p * hw);
      for (int64_t j = lane; j < hw / kPerWord; j += kWarp) {
        const uint4 word = words[j];
        T v[kPerWord];
        memcpy(v, &word, sizeof(word));
        for (int k = 0; k < kPerWord; ++k) acc += to_float(v[k]);
      }
    } else {
      for (int64_t j = lane; j < hw; j += kWarp) acc += to_float(x[p * hw + j]);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[p] = from_float<T>(acc / static_cast<float>(hw));
  }
}

// dy * (1 / HW), the CPU engine's arithmetic: one warp per plane, one product per plane.
template <typename T, bool kVector>
__global__ void gap_backward_kernel(const T* __restrict__ dy,  // (N*C)
                                    int64_t planes, int64_t hw, float inv_hw,
                                    T* __restrict__ dx) {  // (N*C, HW)
  constexpr int kPerWord = 16 / sizeof(T);
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_per_block = blockDim.x / kWarp;
  for (int64_t p = blockIdx.x * warps_per_block + threadIdx.x / kWarp; p < planes;
       p += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    const T value = from_float<T>(to_float(dy[p]) * inv_hw);
    if (kVector) {
      T v[kPerWord];
      for (int k = 0; k < kPerWord; ++k) v[k] = value;
      uint4 word;
      memcpy(&word, v, sizeof(word));
      uint4* words = reinterpret_cast<uint4*>(dx + p * hw);
      for (int64_t j = lane; j < hw / kPerWord; j += kWarp) words[j] = word;
    } else {
      for (int64_t j = lane; j < hw; j += kWarp) dx[p * hw + j] = value;
    }
  }
}

// Whether the planes of hw elements of a tensor at `data` suit gap_*_kernel<T, true>.
template <typename T>
bool gap_vector(const void* data, int64_t hw) {
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 && (hw * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

// NHWC global average pooling: block (x, image) sums the 32 channels from blockIdx.x * 32
// over the image's HW rows, thread y taking rows y, y + 8, ..., then the 8 stripes in order.
template <typename T>
__global__ void gap_forward_nhwc_kernel(const T* __restrict__ x,  // (N, HW, C)
                                        int64_t images, int64_t hw, int64_t channels,
                                        T* __restrict__ y) {  // (N, C)
  __shared__ float tile[kColTileY][kColTileX];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTileX + threadIdx.x;
  for (int64_t image = blockIdx.y; image < images; image += gridDim.y) {
    const T* xi = x + image * hw * channels;
    float acc = 0.0f;
    if (c < channels) {
      for (int64_t p = threadIdx.y; p < hw; p += kColTileY) acc += to_float(xi[p * channels + c]);
    }
    tile[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
      float total = 0.0f;
      for (int k = 0; k < kColTileY; ++k) total += tile[k][threadIdx.x];
      y[image * channels + c] = from_float<T>(total / static_cast<float>(hw));
    }
    __syncthreads();  // the next image overwrites the tile
  }
}

// NHWC backward: dx seen as (N*HW, C) rows; thread x along the channels, one division per
// row (the image), none per element.
template <typename T>
__global__ void gap_backward_nhwc_kernel(const T* __restrict__ dy,  // (N, C)
                                         int64_t rows, int64_t hw, int64_t channels, float inv_hw,
                                         T* __restrict__ dx) {  // (N*HW, C)
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const T* dyi = dy + (r / hw) * channels;
    T* dxr = dx + r * channels;
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) dxr[c] = from_float<T>(to_float(dyi[c]) * inv_hw);
  }
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
  const Tensor& x = inputs.at(0);  // (N, C, H, W), either format
  int device = common_device({&x}, "MaxPool2D");
  PoolGeometry g = geometry(layer, x.shape());
  TNT_CHECK(g.h * g.w <= INT32_MAX, "MaxPool2D '{}': plane of {} x {} too large", layer.name(), g.h, g.w);
  const MemoryFormat format = x.memory_format();
  Tensor y = Tensor::empty({g.n, g.c, g.ho, g.wo}, x.dtype(), x.device(), format);        // (N, C, Ho, Wo)
  Tensor argmax = Tensor::empty({g.n, g.c, g.ho, g.wo}, DType::i32, x.device(), format);  // (N, C, Ho, Wo)
  const int64_t total = y.numel();
  if (total > 0) {
    const unsigned grid = grid_for(total, kBlock, device);
    cudaStream_t stream = compute_stream(device);
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "MaxPool2D", {
      const scalar_t* xp = static_cast<const scalar_t*>(x.raw());
      scalar_t* yp = static_cast<scalar_t*>(y.raw());
      if (x.is_channels_last() && fits_int32(g) &&
          pool_vec_applies(g, sizeof(scalar_t), {xp, yp, argmax.data<int32_t>()})) {
        max_pool_forward_nhwc_vec_kernel<scalar_t>
            <<<grid_for(total / PoolVec<scalar_t>::V, kBlock, device), kBlock, 0, stream>>>(
                xp, PoolIndex<int32_t>(g), yp, argmax.data<int32_t>());
      } else if (x.is_channels_last() && fits_int32(g)) {
        max_pool_forward_nhwc_kernel<scalar_t, int32_t>
            <<<grid, kBlock, 0, stream>>>(xp, PoolIndex<int32_t>(g), yp, argmax.data<int32_t>());
      } else if (x.is_channels_last()) {
        max_pool_forward_nhwc_kernel<scalar_t, int64_t>
            <<<grid, kBlock, 0, stream>>>(xp, PoolIndex<int64_t>(g), yp, argmax.data<int32_t>());
      } else {
        max_pool_forward_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(xp, g, yp, argmax.data<int32_t>());
      }
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  // Like the CPU engine: the argmax (in y's format), and the input's shape in extra (x
  // itself is not kept).
  saved.tensors = {argmax};
  saved.extra = std::make_shared<Shape>(x.shape());
  return {y};
}

std::vector<Tensor> max_pool2d_backward(MaxPool2D& layer, const std::vector<Tensor>& grad_outputs,
                                        const RunContext& rc, SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.tensors.size() == 1 && saved.extra, "MaxPool2D '{}': backward without a forward", layer.name());
  const Tensor& argmax = saved.tensors[0];  // (N, C, Ho, Wo) in the forward's format
  const Shape& x_shape = *static_cast<const Shape*>(saved.extra.get());
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&argmax, &dy}, "MaxPool2D backward");
  PoolGeometry g = geometry(layer, x_shape);
  TNT_CHECK(dy.shape() == argmax.shape(), "MaxPool2D '{}': gradient {} for output {}", layer.name(), dy.str(),
            shape_str(argmax.shape()));
  TNT_CHECK(dy.memory_format() == argmax.memory_format(),
            "MaxPool2D '{}': gradient {} is not {} like the layer's output (the executor gives every output "
            "gradient its output's memory format)",
            layer.name(), dy.str(), memory_format_name(argmax.memory_format()));
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device(), argmax.memory_format());
  const int64_t total = dx.numel();
  if (total > 0) {
    const unsigned grid = grid_for(total, kBlock, device);
    cudaStream_t stream = compute_stream(device);
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "MaxPool2D", {
      const scalar_t* dyp = static_cast<const scalar_t*>(dy.raw());
      scalar_t* dxp = static_cast<scalar_t*>(dx.raw());
      if (dx.is_channels_last() && fits_int32(g) &&
          pool_vec_applies(g, sizeof(scalar_t), {dyp, dxp, argmax.data<int32_t>()})) {
        max_pool_backward_nhwc_vec_kernel<scalar_t>
            <<<grid_for(total / PoolVec<scalar_t>::V, kBlock, device), kBlock, 0, stream>>>(
                dyp, argmax.data<int32_t>(), PoolIndex<int32_t>(g), dxp);
      } else if (dx.is_channels_last() && fits_int32(g)) {
        max_pool_backward_nhwc_kernel<scalar_t, int32_t>
            <<<grid, kBlock, 0, stream>>>(dyp, argmax.data<int32_t>(), PoolIndex<int32_t>(g), dxp);
      } else if (dx.is_channels_last()) {
        max_pool_backward_nhwc_kernel<scalar_t, int64_t>
            <<<grid, kBlock, 0, stream>>>(dyp, argmax.data<int32_t>(), PoolIndex<int64_t>(g), dxp);
      } else {
        max_pool_backward_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(dyp, argmax.data<int32_t>(), g, dxp);
      }
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  return {dx};
}

std::vector<Tensor> avg_pool2d_forward(AvgPool2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                       SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);  // (N, C, H, W), either format
  int device = common_device({&x}, "AvgPool2D");
  PoolGeometry g = geometry(layer, x.shape());
  const MemoryFormat format = x.memory_format();
  Tensor y = Tensor::empty({g.n, g.c, g.ho, g.wo}, x.dtype(), x.device(), format);  // (N, C, Ho, Wo)
  if (y.numel() > 0) {
    PoolingDescriptor pd;
    set_avg_pool(pd, g);
    TensorDescriptor xd, yd;
    set_4d(xd, x.dtype(), format, g.n, g.c, g.h, g.w, "AvgPool2D");
    set_4d(yd, x.dtype(), format, g.n, g.c, g.ho, g.wo, "AvgPool2D");
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
  const MemoryFormat format = x.memory_format();
  TNT_CHECK(dy.memory_format() == format,
            "AvgPool2D '{}': gradient {} is not {} like the layer's output (the executor gives every output "
            "gradient its output's memory format)",
            layer.name(), dy.str(), memory_format_name(format));
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device(), format);
  if (x.numel() == 0) return {dx};
  if (y.numel() == 0) {
    TNT_CUDA_CHECK(cudaMemsetAsync(dx.raw(), 0, dx.nbytes(), compute_stream(device)));
    return {dx};
  }
  PoolingDescriptor pd;
  set_avg_pool(pd, g);
  TensorDescriptor xd, yd;
  set_4d(xd, x.dtype(), format, g.n, g.c, g.h, g.w, "AvgPool2D");
  set_4d(yd, x.dtype(), format, g.n, g.c, g.ho, g.wo, "AvgPool2D");
  TNT_CUDNN_CHECK(cudnnPoolingBackward(cudnn_handle(device), pd, CudnnScalars::one(), yd, y.raw(), yd, dy.raw(), xd,
                                       x.raw(), CudnnScalars::zero(), xd, dx.raw()));
  return {dx};
}

namespace {

// What GlobalAveragePool's backward needs: the input's shape and format.
struct GapSaved {
  Shape shape;  // (N, C, H, W)
  MemoryFormat format = MemoryFormat::contiguous;
};

}  // namespace

std::vector<Tensor> global_average_pool_forward(GlobalAveragePool& layer, const std::vector<Tensor>& inputs,
                                                const RunContext& rc, SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);  // (N, C, H, W), either format
  int device = common_device({&x}, "GlobalAveragePool");
  TNT_CHECK(x.ndim() == 4, "GlobalAveragePool '{}': input {} is not (N, C, H, W)", layer.name(), x.str());
  const int64_t images = x.dim(0), channels = x.dim(1), planes = images * channels, hw = x.dim(2) * x.dim(3);
  Tensor y = Tensor::empty({images, channels}, x.dtype(), x.device());  // (N, C), the same in both formats
  if (planes > 0) {
    TNT_CHECK(hw > 0, "GlobalAveragePool '{}': input {} has empty planes", layer.name(), x.str());
    cudaStream_t stream = compute_stream(device);
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "GlobalAveragePool", {
      const scalar_t* xp = static_cast<const scalar_t*>(x.raw());
      scalar_t* yp = static_cast<scalar_t*>(y.raw());
      if (x.is_channels_last()) {
        const dim3 grid(static_cast<unsigned>((channels + kColTileX - 1) / kColTileX),
                        static_cast<unsigned>(std::min<int64_t>(images, 65535)));
        gap_forward_nhwc_kernel<scalar_t>
            <<<grid, dim3(kColTileX, kColTileY), 0, stream>>>(xp, images, hw, channels, yp);
      } else {
        constexpr int warps = kBlock / kWarp;
        const unsigned grid = grid_for(planes, warps, device);
        if (gap_vector<scalar_t>(xp, hw)) {
          gap_forward_kernel<scalar_t, true><<<grid, kBlock, 0, stream>>>(xp, planes, hw, yp);
        } else {
          gap_forward_kernel<scalar_t, false><<<grid, kBlock, 0, stream>>>(xp, planes, hw, yp);
        }
      }
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  // Like the CPU engine: backward needs only the input's shape (and here its format).
  saved.tensors.clear();
  saved.extra = std::make_shared<GapSaved>(GapSaved{x.shape(), x.memory_format()});
  return {y};
}

std::vector<Tensor> global_average_pool_backward(GlobalAveragePool& layer, const std::vector<Tensor>& grad_outputs,
                                                 const RunContext& rc, SavedState& saved) {
  (void)rc;
  TNT_CHECK(saved.extra, "GlobalAveragePool '{}': backward without a forward", layer.name());
  const auto& info = *static_cast<const GapSaved*>(saved.extra.get());
  const Shape& xs = info.shape;           // (N, C, H, W)
  const Tensor& dy = grad_outputs.at(0);  // (N, C)
  int device = common_device({&dy}, "GlobalAveragePool backward");
  const int64_t hw = xs[2] * xs[3], total = shape_numel(xs), channels = xs[1];
  TNT_CHECK(dy.numel() == xs[0] * xs[1] && !dy.is_channels_last(), "GlobalAveragePool '{}': gradient {} for input {}",
            layer.name(), dy.str(), shape_str(xs));
  Tensor dx = Tensor::empty(xs, dy.dtype(), dy.device(), info.format);
  if (total > 0) {
    const float inv_hw = 1.0f / static_cast<float>(hw);
    cudaStream_t stream = compute_stream(device);
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "GlobalAveragePool", {
      const scalar_t* dyp = static_cast<const scalar_t*>(dy.raw());
      scalar_t* dxp = static_cast<scalar_t*>(dx.raw());
      if (dx.is_channels_last()) {
        const int64_t rows = xs[0] * hw;  // (N*HW, C)
        gap_backward_nhwc_kernel<scalar_t><<<grid_for(rows, kColTileY, device), dim3(kWarp, kColTileY), 0, stream>>>(
            dyp, rows, hw, channels, inv_hw, dxp);
      } else {
        const int64_t planes = xs[0] * channels;
        const unsigned grid = grid_for(planes, kBlock / kWarp, device);
        if (gap_vector<scalar_t>(dxp, hw)) {
          gap_backward_kernel<scalar_t, true><<<grid, kBlock, 0, stream>>>(dyp, planes, hw, inv_hw, dxp);
        } else {
          gap_backward_kernel<scalar_t, false><<<grid, kBlock, 0, stream>>>(dyp, planes, hw, inv_hw, dxp);
        }
      }
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  return {dx};
}

}  // namespace tnt::cuda
