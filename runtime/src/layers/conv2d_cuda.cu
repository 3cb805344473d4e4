// Conv2D on CUDA with cuDNN. For each input shape and memory format a plan (descriptors and
// the three algorithms: forward, backward data, backward filter) is made once and cached in
// the layer's CUDA engine cache; workspaces come from the caching allocator per call, so
// after the first step they are cached blocks. A backward algorithm is chosen by the first
// backward that runs it: a network's first layer never computes its input gradient
// (SavedState::need_input_grads), and for some configurations (f16/bf16 with 3 input
// channels, deterministic mode) cuDNN may offer no backward-data algorithm at all, which
// must not stop a layer that never needs one.
//
// Memory formats. The convolution runs in rc.memory_format (Network::set_memory_format):
// y is in that format, and so are the descriptors of x, y, dx and dy. channels_last is
// NHWC, where tensor cores run without transposes; the filter is then KRSC (cuDNN's NHWC
// filter format). The parameters stay (F, C, k, k) contiguous f32 masters (checkpoints keep
// PyTorch's layouts), so every forward makes a KRSC copy of compute_value(weight) (a 4-D
// (F, C, k, k) tensor converted to channels_last IS KRSC) and keeps it in SavedState for
// the backward; the filter gradient is computed in KRSC into a temporary and added (as
// float, transposed on the fly) to the contiguous f32 master gradient. A 1x1 filter is the
// same bytes in both layouts ((F, C, 1, 1) = (F, 1, 1, C)): no copy, and its gradient
// takes the contiguous path (ResNet-50 has 36 such convolutions of 53). An input in the
// other format (the network's images before the first convolution) is converted once; dx
// is returned in that input's format. dy must be in y's format (the executor's contract).
//
// Channel padding. A channels_last input of 1-3 channels (a network's images) may run as 4
// or 8 channels, the added ones zero, with the filter padded alike: cuDNN's first-layer
// kernels want 4 (conv2d_autotune.hpp, pad_candidates). The results are the same numbers:
// every product with a zero channel is zero. Under TNT_CONV_PAD_CHANNELS=auto (the default)
// the layer's first forward of each input shape times the forward, filter-gradient and, if
// needed, data-gradient algorithms of each channel count on the real input and keeps the
// fastest (choose_padding, which wants a padded count to win by 2%); 4 or 8 force it, 0 or
// autotuning off never pad. The padding replaces the format conversion the images needed
// anyway (pad_channels reads either format), SavedState keeps the padded input and filter,
// and backward returns dx with the input's channels and adds only the real channels of
// the filter gradient to the master (layout.hpp). Padding needs the f32 master weight that
// mixed precision keeps (a half one stays unpadded).
//
// Precision: f32 convolutions run with CUDNN_DEFAULT_MATH, which lets cuDNN use TF32
// tensor cores on Ampere and later (PyTorch's default for convolutions): products carry
// about 2^-10 relative error instead of 2^-24. Tests bound the difference accordingly.
//
// Mixed precision: an f16/bf16 input is convolved with the weight's compute copy
// (compute_value) in tensor-op math with f32 accumulation (the descriptors' compute type is
// float: cuDNN's "pseudo half" configurations); y and dx have the input's dtype. cuDNN
// writes the filter gradient in the filter descriptor's dtype, so it goes into a temporary
// half tensor (beta 0) that is added in float to the f32 master gradient. The f32 bias is
// added by our kernel in float to cuDNN's already rounded half output, so that output is
// rounded twice (cudnnAddTensor wants the bias in the output's dtype). Our kernel adds the
// bias of every channels_last output too (one float addition, as cudnnAddTensor's).
//
// Algorithms: each direction's legacy cuDNN algorithm, timed once per problem, or a cuDNN
// graph timed faster (conv2d_algorithms_cuda.cu's header, conv2d_plan_cuda.hpp).
#include "layers/conv2d_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/layout.hpp"
#include "backend/cuda/reduce.cuh"
#include "layers/conv2d_plan_cuda.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <atomic>
#include <memory>

namespace tnt::cuda {

namespace {

// What backward needs to know about its forward.
struct ConvSavedCuda {
  MemoryFormat input_format = MemoryFormat::contiguous;  // dx is returned in it
  MemoryFormat format = MemoryFormat::contiguous;        // the plan's: x, y, dy
  bool krsc_copy = false;  // the filter in SavedState is a KRSC copy (channels_last, k > 1, or padded)
  int64_t channels = 0;    // of the input; x and the filter in SavedState have more when padded
  bool padded = false;     // zero channels were added (see "Channel padding" at the top)
};

// y += bias per channel, in float, for half NCHW outputs.
template <typename T>
__global__ void add_channel_bias_kernel(T* __restrict__ y,               // (N, F, Ho*Wo)
                                        const float* __restrict__ bias,  // (F)
                                        int64_t n, int64_t channels, int64_t inner) {
  TNT_KERNEL_LOOP(i, n) { y[i] = from_float<T>(to_float(y[i]) + bias[(i / inner) % channels]); }
}

// The same for NHWC outputs, seen as (rows, F) with rows = N*Ho*Wo: block (32, 8), thread
// x along the channels (coalesced), thread y along the rows; no division per element.
constexpr int kBiasRowsPerBlock = 8;

template <typename T>
__global__ void add_channel_bias_nhwc_kernel(T* __restrict__ y,               // (N*Ho*Wo, F)
                                             const float* __restrict__ bias,  // (F)
                                             int64_t rows, int64_t channels) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    T* row = y + r * channels;
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) row[c] = from_float<T>(to_float(row[c]) + bias[c]);
  }
}

void add_bias(const ConvPlan& plan, const Tensor& y, const Tensor& bias, int device) {
  const int64_t f = y.dim(1);
  if (plan.format == MemoryFormat::contiguous && y.dtype() == DType::f32) {
    TNT_CUDNN_CHECK(cudnnAddTensor(cudnn_handle(device), CudnnScalars::one(), plan.bias, bias.raw(),
                                   CudnnScalars::one(), plan.y, y.raw()));
    return;
  }
  cudaStream_t stream = compute_stream(device);
  if (plan.format == MemoryFormat::contiguous) {
    const int64_t total = y.numel(), inner = plan.ho * plan.wo;
    TNT_CUDA_DISPATCH_FLOAT(y.dtype(), "Conv2D", {
      add_channel_bias_kernel<scalar_t><<<grid_for(total, kBlock, device), kBlock, 0, stream>>>(
          static_cast<scalar_t*>(y.raw()), static_cast<const float*>(bias.raw()), total, f, inner);
    });
  } else {
    const int64_t rows = y.numel() / f;
    TNT_CUDA_DISPATCH_FLOAT(y.dtype(), "Conv2D", {
      add_channel_bias_nhwc_kernel<scalar_t>
          <<<grid_for(rows, kBiasRowsPerBlock, device), dim3(kWarp, kBiasRowsPerBlock), 0, stream>>>(
              static_cast<scalar_t*>(y.raw()), static_cast<const float*>(bias.raw()), rows, f);
    });
  }
  TNT_CUDA_CHECK_LAUNCH();
}

// x (the input) in the plan's format with `channels` channels: converted, or padded with zero
// channels; the filter w (F, C, k, k) to match (KRSC for channels_last, see the top).
Tensor input_as(const Tensor& input, MemoryFormat format, int64_t channels) {
  return channels == input.dim(1) ? input.to_memory_format(format) : cuda::pad_channels(input, channels);
}
Tensor filter_as(const Tensor& w, MemoryFormat format, int64_t channels, bool krsc_copy) {
  if (channels != w.dim(1)) return cuda::pad_channels(w, channels);
  return krsc_copy ? w.to_memory_format(format) : w;
}

// The channels the input runs with (see "Channel padding" at the top): its own, or 4 or 8.
// Decided at the layer's first forward for each input shape; timed choices (auto) time
// the forward and, in training, the filter gradient and, where the input gradient is
// needed, the data gradient of each candidate on the real input, with the forward's output
// standing in for the output gradient (timing does not depend on the values). A shape first
// seen outside training (an evaluation's last, smaller batch) times its forward only: it
// may never run a backward, whose algorithms would be timed (and their workspaces taken)
// for nothing.
int64_t channels_to_run(Conv2D& layer, const Tensor& input, const Tensor& w, MemoryFormat format, bool training,
                        bool need_input_grads, int device) {
  const int64_t c = input.dim(1);
  if (input.dim(0) == 0 || layer.weight().value.dtype() != DType::f32) return c;  // f32 masters only (backward)
  const std::vector<int64_t> candidates = conv_autotune::pad_candidates(
      c, tnt::config().conv_pad_channels, conv_autotune_enabled(), format == MemoryFormat::channels_last);
  if (candidates.size() == 1) return candidates[0];
  auto& cache = *static_cast<ConvCache*>(layer.engine_cache(Device::Kind::cuda).get());
  const Shape& s = input.shape();
  const PlanKey key{s[0], s[1], s[2], s[3], static_cast<int64_t>(input.dtype()), static_cast<int64_t>(format)};
  if (auto it = cache.padded_channels.find(key); it != cache.padded_channels.end()) return it->second;
  std::vector<int64_t> tried;
  std::vector<double> ms;
  std::string times;
  for (int64_t cand : candidates) {
    try {
      Tensor x = input_as(input, format, cand);
      Tensor wc = filter_as(w, format, cand, layer.kernel_size() > 1);
      ConvPlan& plan = plan_for(layer, x, format, device);
      Tensor y = Tensor::empty({s[0], layer.filters(), plan.ho, plan.wo}, x.dtype(), x.device(), format);
      double t =
          choose_forward(plan, layer, x.shape(), ConvOperands{x.raw(), wc.raw(), nullptr, y.raw()}, device);
      if (training) {
        const double t_filter =
            choose_backward_filter(plan, layer, x.shape(), ConvOperands{x.raw(), nullptr, y.raw()}, device);
        t = t < 0 || t_filter < 0 ? -1 : t + t_filter;
      }
      if (training && need_input_grads) {
        const double t_data =
            choose_backward_data(plan, layer, x.shape(), ConvOperands{nullptr, wc.raw(), y.raw()}, device);
        t = t < 0 || t_data < 0 ? -1 : t + t_data;
      }
      tried.push_back(cand);
      ms.push_back(t);
      times += fmt::format("{}{}: {:.3f} ms", times.empty() ? "" : ", ", cand, t);
    } catch (const Error& e) {
      if (cand == c) throw;  // the layer as it is: its own errors
      log_warning("Conv2D '{}': input {} widened to {} channels cannot run ({}); not padded to {}", layer.name(),
                  shape_str(s), cand, e.what(), cand);
    }
  }
  const int64_t chosen = conv_autotune::choose_padding(tried, ms);
  cache.padded_channels.emplace(key, chosen);
  log_info("Conv2D '{}': input {} runs with {} channels{} (timed forward{}, by channels: {})", layer.name(),
           shape_str(s), chosen, chosen == c ? "" : " (zero channels added)", training ? " + backward" : "", times);
  return chosen;
}

}  // namespace

namespace {
std::atomic<int64_t> padded_forwards{0};
}  // namespace

int64_t conv2d_padded_forwards() { return padded_forwards.load(); }

std::vector<Tensor> conv2d_forward(Conv2D& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                   SavedState& saved) {
  const Tensor& input = inputs.at(0);  // (N, C, H, W), either format
  // The f32 weight itself for an f32 input, else the network's half copy of it.
  const Tensor& w = compute_value(layer.weight(), input.dtype(), layer.name());  // (F, C, k, k)
  Parameter* bias = layer.bias();                                                  // (F), f32
  int device = common_device({&input, &w}, "Conv2D");
  TNT_CHECK(input.ndim() == 4 && input.dim(1) == layer.in_channels(), "Conv2D '{}': input {} is not (N, {}, H, W)",
            layer.name(), input.str(), layer.in_channels());
  const MemoryFormat format = rc.memory_format;
  if (!layer.engine_cache(Device::Kind::cuda)) layer.engine_cache(Device::Kind::cuda) = std::make_shared<ConvCache>();
  const int64_t channels = channels_to_run(layer, input, w, format, rc.training, saved.need_input_grads, device);
  auto info = std::make_shared<ConvSavedCuda>();
  info->input_format = input.memory_format();
  info->format = format;
  info->channels = input.dim(1);
  info->padded = channels != input.dim(1);
  info->krsc_copy = format == MemoryFormat::channels_last && (layer.kernel_size() > 1 || info->padded);
  if (info->padded) padded_forwards.fetch_add(1);
  saved.extra = info;
  // The images before the first convolution of a channels_last network: converted once
  // (padded with zero channels, where that is faster), into (N, channels, H, W) in `format`.
  Tensor x = input_as(input, format, channels);
  // KRSC for channels_last (see the top; a 1x1 filter's bytes already are); kept for backward.
  Tensor w_used = filter_as(w, format, channels, info->krsc_copy);  // (F, channels, k, k)
  const int64_t n = x.dim(0), f = layer.filters();
  if (n == 0) {
    Shape out = layer.output_shapes({x.shape()}).at(0);
    saved.tensors = {x, format == MemoryFormat::channels_last ? w_used : Tensor()};
    return {Tensor::empty(out, x.dtype(), x.device(), format)};
  }
  ConvPlan& plan = plan_for(layer, x, format, device);
  Tensor y = Tensor::empty({n, f, plan.ho, plan.wo}, x.dtype(), x.device(), format);  // (N, F, Ho, Wo)
  if (!plan.has_fwd)
    choose_forward(plan, layer, x.shape(), ConvOperands{x.raw(), w_used.raw(), nullptr, y.raw()}, device);
  run_forward(plan, x.raw(), w_used.raw(), y.raw(), device);
  if (bias) {
    TNT_CHECK(bias->value.dtype() == DType::f32, "Conv2D '{}': the CUDA engine needs an f32 bias, got {}",
              layer.name(), bias->value.str());
    add_bias(plan, y, bias->value, device);
  }
  // Two entries, as the CPU engine keeps (Conv2D::backward checks the count before it
  // dispatches): x in the plan's format, and the filter in KRSC (channels_last only).
  saved.tensors = {x, format == MemoryFormat::channels_last ? w_used : Tensor()};
  return {y};
}

std::vector<Tensor> conv2d_backward(Conv2D& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                    SavedState& saved) {
  (void)rc;  // the format is the forward's
  TNT_CHECK(saved.tensors.size() == 2 && saved.extra, "Conv2D '{}': backward without a forward", layer.name());
  const auto& info = *static_cast<const ConvSavedCuda*>(saved.extra.get());
  const Tensor& x = saved.tensors[0];     // (N, C, H, W) in info.format
  const Tensor& dy = grad_outputs.at(0);  // (N, F, Ho, Wo) in info.format
  const bool nhwc = info.format == MemoryFormat::channels_last;
  // The weight as the forward used it: the saved KRSC one, or the compute value itself.
  const Tensor& w = nhwc ? saved.tensors[1] : compute_value(layer.weight(), x.dtype(), layer.name());  // (F, C, k, k)
  const Tensor& dw = layer.weight().grad;  // (F, C, k, k), f32, contiguous
  Parameter* bias = layer.bias();
  int device = common_device({&x, &dy, &w}, "Conv2D backward");
  TNT_CHECK(dy.memory_format() == info.format,
            "Conv2D '{}': gradient {} is not {} like the layer's output (the executor gives every output gradient "
            "its output's memory format)",
            layer.name(), dy.str(), memory_format_name(info.format));
  // The first layer of a network may skip its input gradient (SavedState::need_input_grads):
  // for the convolution on the images it costs as much as the weight gradient.
  Tensor dx = saved.need_input_grads ? Tensor::empty(x.shape(), x.dtype(), x.device(), info.format)
                                     : Tensor();  // (N, C, H, W)
  if (x.dim(0) == 0) return {dx.defined() ? dx.to_memory_format(info.input_format) : dx};
  ConvPlan& plan = plan_for(layer, x, info.format, device);
  TNT_CHECK(dy.dtype() == x.dtype() && dy.shape() == Shape({x.dim(0), layer.filters(), plan.ho, plan.wo}),
            "Conv2D '{}': gradient {} does not match the output ({}, {}, {}, {}) {}", layer.name(), dy.str(),
            x.dim(0), layer.filters(), plan.ho, plan.wo, dtype_name(x.dtype()));
  if (dx.defined()) {
    if (!plan.has_bwd_data)
      choose_backward_data(plan, layer, x.shape(), ConvOperands{nullptr, w.raw(), dy.raw(), dx.raw()}, device);
    run_backward_data(plan, dy.raw(), w.raw(), dx.raw(), device);
  }
  if (dw.defined()) {
    TNT_CHECK(dw.dtype() == DType::f32 || (!info.krsc_copy && dw.dtype() == x.dtype()),
              "Conv2D '{}': weight gradient {} for input {}", layer.name(), dw.str(), x.str());
    TNT_CHECK(!dw.is_channels_last(), "Conv2D '{}': the weight gradient {} must be contiguous", layer.name(),
              dw.str());
    if (!plan.has_bwd_filter)
      choose_backward_filter(plan, layer, x.shape(), ConvOperands{x.raw(), nullptr, dy.raw()}, device);
    // A filter gradient in KCRS, or a 1x1 one in KRSC (the same bytes), goes straight into
    // the master gradient when the dtypes agree.
    if (!info.krsc_copy && dw.dtype() == x.dtype()) {
      // beta = 1: the gradient accumulates over the calls of a step.
      run_backward_filter(plan, x.raw(), dy.raw(), dw.raw(), 1.0f, device);
    } else {
      // This call's gradient in the filter's dtype and format (KCRS or KRSC), then added in
      // float to the f32 master gradient (transposed on the way for KRSC). The temporary
      // returns to the allocator's cache at scope exit, safely: the kernels that use it
      // are queued on the compute stream.
      const MemoryFormat part_format = info.krsc_copy ? MemoryFormat::channels_last : MemoryFormat::contiguous;
      Tensor part = Tensor::empty({dw.dim(0), x.dim(1), dw.dim(2), dw.dim(3)}, x.dtype(), x.device(),
                                  part_format);  // (F, C or the padded channels, k, k)
      run_backward_filter(plan, x.raw(), dy.raw(), part.raw(), 0.0f, device);
      if (info.padded) {
        accumulate_unpadded_as_float(part, dw);
      } else if (info.krsc_copy) {
        accumulate_converted_as_float(part, dw);
      } else {
        accumulate_as_float(part, dw);
      }
    }
  }
  if (bias && bias->grad.defined()) {
    TNT_CHECK(bias->grad.dtype() == DType::f32, "Conv2D '{}': bias gradient must be f32, got {}", layer.name(),
              bias->grad.str());
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "Conv2D", {
      const LoadAsFloat<scalar_t> load{static_cast<const scalar_t*>(dy.raw())};
      float* db = static_cast<float*>(bias->grad.raw());
      if (nhwc) {
        column_sum(dy.numel() / dy.dim(1), dy.dim(1), load, 1.0f, db, device);  // (N*Ho*Wo, F)
      } else {
        channel_sum(dy.dim(0), dy.dim(1), plan.ho * plan.wo, load, 1.0f, db, device);  // (N, F, Ho*Wo)
      }
    });
  }
  // dx with the input's channels, in the format of the forward's input (a contiguous input
  // to a channels_last layer).
  if (dx.defined() && info.padded) {
    Tensor unpadded = Tensor::empty({x.dim(0), info.channels, x.dim(2), x.dim(3)}, x.dtype(), x.device(),
                                    info.input_format);
    unpad_channels(dx, unpadded);
    return {unpadded};
  }
  if (dx.defined() && info.input_format != info.format) dx = dx.to_memory_format(info.input_format);
  return {dx};
}

}  // namespace tnt::cuda
