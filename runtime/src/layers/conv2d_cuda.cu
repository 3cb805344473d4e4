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
// Algorithms. By default each direction's algorithm is timed once per problem with
// cudnnFind*AlgorithmEx, timed into the real y and dx (fresh tensors the real call then
// overwrites: no second buffer of their size while the step's activations are alive) and
// into scratch for dw (the filter gradient accumulates over the calls of a step and must
// not be overwritten), with a workspace as
// large as the largest that cuDNN's heuristics list within kMaxWorkspace; in deterministic
// mode (TNT_DETERMINISTIC) only deterministic algorithms qualify; the fastest remaining one
// wins. Choices are cached for the whole process under everything that defines the problem
// (conv2d_autotune.hpp: device, shapes, geometry, dtype, format, math, determinism,
// direction), so ResNet-50's repeated layer shapes are timed once. Timing runs real kernels
// (milliseconds per problem, once), and the fastest algorithm for the shapes of a real
// network is often not the heuristics' first. TNT_CUDNN_AUTOTUNE=0 (a Config knob, read
// once per process) takes cuDNN's heuristics instead (Get_v7, best first): the first that succeeded,
// fits kMaxWorkspace and, in deterministic mode, is deterministic. If timing leaves no
// acceptable algorithm, the heuristics decide too.
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
#include "layers/conv2d_cuda.hpp"

#include "backend/cuda/cudnn_util.hpp"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/layout.hpp"
#include "backend/cuda/reduce.cuh"
#include "layers/conv2d_autotune.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

namespace tnt::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t{1} << 30;

using conv_autotune::Direction;
using conv_autotune::Problem;

struct ConvPlan {
  MemoryFormat format = MemoryFormat::contiguous;  // of x, y, dx, dy and the filter
  TensorDescriptor x, y;  // (N, C, H, W), (N, F, Ho, Wo)
  FilterDescriptor w;     // (F, C, k, k): KCRS or KRSC
  // One convolution descriptor per direction: each carries its algorithm's math type.
  ConvolutionDescriptor conv_fwd, conv_bwd_data, conv_bwd_filter;
  TensorDescriptor bias;  // (1, F, 1, 1), contiguous f32 plans only
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
  bool has_fwd = false, has_bwd_data = false, has_bwd_filter = false;  // chosen yet (see the top)
  int64_t ho = 0, wo = 0;
  size_t x_bytes = 0, y_bytes = 0, w_bytes = 0;  // scratch outputs of the timing runs
  bool autotune = true;                          // TNT_CUDNN_AUTOTUNE
  Problem problem;                               // the autotune key, less the direction
};

using PlanKey = std::array<int64_t, 6>;  // N, C, H, W, dtype, format

struct ConvCache {
  std::map<PlanKey, std::unique_ptr<ConvPlan>> plans;
  std::map<PlanKey, int64_t> padded_channels;  // under the input's key: the channels it runs with
};

// What backward needs to know about its forward.
struct ConvSavedCuda {
  MemoryFormat input_format = MemoryFormat::contiguous;  // dx is returned in it
  MemoryFormat format = MemoryFormat::contiguous;        // the plan's: x, y, dy
  bool krsc_copy = false;  // the filter in SavedState is a KRSC copy (channels_last, k > 1, or padded)
  int64_t channels = 0;    // of the input; x and the filter in SavedState have more when padded
  bool padded = false;     // zero channels were added (see "Channel padding" at the top)
};

// The process-wide autotune results (see the top): algorithm and math type per problem.
struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  float ms = -1;  // its timed milliseconds; below zero when the heuristics chose
};

struct AutotuneCache {
  std::mutex mutex;  // also serialises the timing runs
  std::map<Problem::Key, Choice> choices;
  std::atomic<int64_t> searches{0};
};

AutotuneCache& autotune_cache() {
  static AutotuneCache* cache = new AutotuneCache();  // never destroyed: used until exit
  return *cache;
}

// TNT_CUDNN_AUTOTUNE: the Config knob, checked when the process reads its configuration.
bool autotune_enabled() { return tnt::config().cudnn_autotune; }

cudnnMathType_t initial_math(DType dtype) {
  // Tensor cores for f16/bf16; for f32 the default (TF32 allowed, see the top).
  return dtype == DType::f32 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
}

void set_conv(const ConvolutionDescriptor& conv, const Conv2D& layer, DType dtype) {
  const int pad = cudnn_dim(layer.padding(), "Conv2D padding"), stride = cudnn_dim(layer.stride(), "Conv2D stride");
  TNT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, pad, pad, stride, stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
  TNT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, initial_math(dtype)));
}

// The first acceptable entry of a heuristics list (best first); nullptr when none is.
template <typename Perf>
const Perf* choose(const Perf* perf, int count) {
  const bool deterministic = tnt::config().deterministic;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < count; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
      if (deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
      // First pass: within the workspace limit; second: the best there is.
      if (pass == 0 && perf[i].memory > kMaxWorkspace) continue;
      return &perf[i];
    }
  }
  return nullptr;
}

// The first (fastest: cuDNN sorts timings) entry of a timing list that ran, fits `limit`
// and is deterministic where that is asked for; nullptr when none does.
template <typename Perf>
const Perf* fastest(const Perf* perf, int count, size_t limit) {
  const bool deterministic = tnt::config().deterministic;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > limit) continue;
    if (deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    return &perf[i];
  }
  return nullptr;
}

// The real operands of a timing run (read only), and where its output may go: the real
// output when the real call overwrites it anyway (y, dx), else null for scratch memory.
struct Operands {
  const void* x = nullptr;   // forward, backward filter
  const void* w = nullptr;   // forward, backward data
  const void* dy = nullptr;  // backward data, backward filter
  void* out = nullptr;       // forward: y; backward data: dx
};

// One direction's cuDNN entry points, for choose_algorithm.
struct Forward {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static constexpr const char* kName = "forward";
  static constexpr Direction kDirection = Direction::forward;
  static const ConvolutionDescriptor& conv(const ConvPlan& p) { return p.conv_fwd; }
  static size_t output_bytes(const ConvPlan& p) { return p.y_bytes; }
  static void heuristics(cudnnHandle_t h, const ConvPlan& p, Perf* perf, int* n) {
    TNT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv_fwd, p.y, kCount, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvPlan& p, const Operands& o, void* out, Perf* perf, int* n,
                   const Workspace& ws) {
    TNT_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, p.x, o.x, p.w, o.w, p.conv_fwd, p.y, out, kCount, n,
                                                           perf, ws.data(), ws.bytes()));
  }
  static void set(cudnnHandle_t h, ConvPlan& p, Algo a) {
    p.fwd_algo = a;
    TNT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv_fwd, p.y, a, &p.fwd_ws));
    p.has_fwd = true;
  }
};

struct BackwardData {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static constexpr const char* kName = "backward-data";
  static constexpr Direction kDirection = Direction::backward_data;
  static const ConvolutionDescriptor& conv(const ConvPlan& p) { return p.conv_bwd_data; }
  static size_t output_bytes(const ConvPlan& p) { return p.x_bytes; }
  static void heuristics(cudnnHandle_t h, const ConvPlan& p, Perf* perf, int* n) {
    TNT_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv_bwd_data, p.x, kCount, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvPlan& p, const Operands& o, void* out, Perf* perf, int* n,
                   const Workspace& ws) {
    TNT_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w, o.w, p.y, o.dy, p.conv_bwd_data, p.x, out,
                                                                kCount, n, perf, ws.data(), ws.bytes()));
  }
  static void set(cudnnHandle_t h, ConvPlan& p, Algo a) {
    p.bwd_data_algo = a;
    TNT_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv_bwd_data, p.x, a, &p.bwd_data_ws));
    p.has_bwd_data = true;
  }
};

struct BackwardFilter {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static constexpr const char* kName = "backward-filter";
  static constexpr Direction kDirection = Direction::backward_filter;
  static const ConvolutionDescriptor& conv(const ConvPlan& p) { return p.conv_bwd_filter; }
  static size_t output_bytes(const ConvPlan& p) { return p.w_bytes; }
  static void heuristics(cudnnHandle_t h, const ConvPlan& p, Perf* perf, int* n) {
    TNT_CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv_bwd_filter, p.w, kCount, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvPlan& p, const Operands& o, void* out, Perf* perf, int* n,
                   const Workspace& ws) {
    TNT_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.x, o.x, p.y, o.dy, p.conv_bwd_filter, p.w,
                                                                  out, kCount, n, perf, ws.data(), ws.bytes()));
  }
  static void set(cudnnHandle_t h, ConvPlan& p, Algo a) {
    p.bwd_filter_algo = a;
    TNT_CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv_bwd_filter, p.w, a, &p.bwd_filter_ws));
    p.has_bwd_filter = true;
  }
};

// Chooses one direction's algorithm for the plan (see the top) and sets its math type and
// workspace size. Returns the chosen algorithm's timed milliseconds, or -1 when it was not
// timed (autotuning off, or the heuristics chose).
template <typename Dir>
float choose_algorithm(ConvPlan& plan, const Conv2D& layer, const Shape& x_shape, const Operands& operands,
                      int device) {
  cudnnHandle_t h = cudnn_handle(device);
  typename Dir::Perf perf[Dir::kCount];
  int returned = 0;
  Dir::heuristics(h, plan, perf, &returned);
  const typename Dir::Perf* heuristic = choose(perf, returned);
  const typename Dir::Perf* timed_choice = nullptr;
  typename Dir::Perf chosen{};
  float timed_ms = -1;
  if (plan.autotune) {
    Problem problem = plan.problem;
    problem.direction = Dir::kDirection;
    AutotuneCache& cache = autotune_cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.choices.find(problem.key());
    if (it != cache.choices.end()) {
      chosen.algo = static_cast<typename Dir::Algo>(it->second.algo);
      chosen.mathType = it->second.math;
      timed_ms = it->second.ms;
      timed_choice = &chosen;
    } else {
      // The workspace: the largest any listed algorithm wants within the limit, so that
      // every algorithm that may be chosen can run in the timing.
      size_t limit = 0;
      for (int i = 0; i < returned; ++i) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspace)
          limit = std::max(limit, perf[i].memory);
      }
      Workspace ws(limit, device);
      Workspace scratch(operands.out ? 0 : Dir::output_bytes(plan), device);  // dw only (see the top)
      typename Dir::Perf timed[Dir::kCount];
      int timed_count = 0;
      try {
        Dir::find(h, plan, operands, operands.out ? operands.out : scratch.data(), timed, &timed_count, ws);
      } catch (const Error& e) {
        // The timing itself refused (a status of cuDNN's, not of one algorithm): the
        // heuristics choose, as the top of this file says, and training goes on.
        timed_count = 0;
        log_warning("Conv2D '{}': timing the {} algorithms for {} failed ({}); cuDNN's heuristics choose",
                    layer.name(), Dir::kName, problem.str(), e.what());
      }
      cache.searches.fetch_add(1);
      if (const auto* best = fastest(timed, timed_count, limit)) {
        chosen = *best;
        timed_choice = &chosen;
        timed_ms = best->time;
      } else if (heuristic) {
        chosen = *heuristic;  // cached too: timing again would find nothing again
      }
      if (timed_choice || heuristic) {
        cache.choices.emplace(problem.key(),
                              Choice{static_cast<int>(chosen.algo), chosen.mathType, timed_ms});
        log_debug("Conv2D '{}': timed {} algorithms for {}: algorithm {} (math {}){}", layer.name(), timed_count,
                  problem.str(), static_cast<int>(chosen.algo), static_cast<int>(chosen.mathType),
                  timed_choice ? "" : ", the heuristics' (none timed qualified)");
      }
    }
  }
  if (!timed_choice) {
    TNT_CHECK(heuristic != nullptr, "Conv2D '{}': cuDNN offers no {}{} algorithm for input {} ({})", layer.name(),
              tnt::config().deterministic ? "deterministic " : "", Dir::kName, shape_str(x_shape),
              memory_format_name(plan.format));
    chosen = *heuristic;
  }
  TNT_CUDNN_CHECK(cudnnSetConvolutionMathType(Dir::conv(plan), chosen.mathType));
  Dir::set(h, plan, chosen.algo);
  return timed_ms;
}

ConvPlan& plan_for(Conv2D& layer, const Tensor& x, MemoryFormat format, int device) {
  std::shared_ptr<void>& slot = layer.engine_cache(Device::Kind::cuda);
  if (!slot) slot = std::make_shared<ConvCache>();
  auto& cache = *static_cast<ConvCache*>(slot.get());
  const Shape& s = x.shape();
  PlanKey key{s[0], s[1], s[2], s[3], static_cast<int64_t>(x.dtype()), static_cast<int64_t>(format)};
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return *it->second;

  auto plan = std::make_unique<ConvPlan>();
  const char* what = "Conv2D";
  const DType dt = x.dtype();
  const int64_t f = layer.filters(), k = layer.kernel_size();
  plan->format = format;
  set_4d(plan->x, dt, format, s[0], s[1], s[2], s[3], what);
  set_filter(plan->w, dt, format, f, s[1], k, k, what);
  for (const ConvolutionDescriptor* c : {&plan->conv_fwd, &plan->conv_bwd_data, &plan->conv_bwd_filter})
    set_conv(*c, layer, dt);
  int n = 0, co = 0, ho = 0, wo = 0;
  TNT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan->conv_fwd, plan->x, plan->w, &n, &co, &ho, &wo));
  plan->ho = ho;
  plan->wo = wo;
  set_4d(plan->y, dt, format, n, co, ho, wo, what);
  set_nchw(plan->bias, DType::f32, 1, f, 1, 1, what);
  const size_t elem = dtype_size(dt);
  plan->x_bytes = static_cast<size_t>(shape_numel(s)) * elem;
  plan->y_bytes = static_cast<size_t>(int64_t{n} * co * ho * wo) * elem;
  plan->w_bytes = static_cast<size_t>(f * s[1] * k * k) * elem;
  plan->autotune = autotune_enabled();
  Problem& p = plan->problem;
  p.device = device;
  p.n = s[0];
  p.c = s[1];
  p.h = s[2];
  p.w = s[3];
  p.filters = f;
  p.kernel = k;
  p.stride = layer.stride();
  p.padding = layer.padding();
  p.dtype = static_cast<int64_t>(dt);
  p.format = static_cast<int64_t>(format);
  p.math = static_cast<int64_t>(initial_math(dt));
  p.deterministic = tnt::config().deterministic;
  ConvPlan& ref = *plan;
  cache.plans.emplace(key, std::move(plan));
  return ref;
}

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
// the forward, the filter gradient and, where the input gradient is needed, the data
// gradient of each candidate on the real input, with the forward's output standing in for
// the output gradient (timing does not depend on the values).
int64_t channels_to_run(Conv2D& layer, const Tensor& input, const Tensor& w, MemoryFormat format,
                        bool need_input_grads, int device) {
  const int64_t c = input.dim(1);
  if (input.dim(0) == 0 || layer.weight().value.dtype() != DType::f32) return c;  // f32 masters only (backward)
  const std::vector<int64_t> candidates = conv_autotune::pad_candidates(
      c, tnt::config().conv_pad_channels, autotune_enabled(), format == MemoryFormat::channels_last);
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
          choose_algorithm<Forward>(plan, layer, x.shape(), Operands{x.raw(), wc.raw(), nullptr, y.raw()}, device);
      const double t_filter =
          choose_algorithm<BackwardFilter>(plan, layer, x.shape(), Operands{x.raw(), nullptr, y.raw()}, device);
      t = t < 0 || t_filter < 0 ? -1 : t + t_filter;
      if (need_input_grads) {
        const double t_data =
            choose_algorithm<BackwardData>(plan, layer, x.shape(), Operands{nullptr, wc.raw(), y.raw()}, device);
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
  log_info("Conv2D '{}': input {} runs with {} channels{} (timed forward + backward, by channels: {})", layer.name(),
           shape_str(s), chosen, chosen == c ? "" : " (zero channels added)", times);
  return chosen;
}

}  // namespace

int64_t conv2d_autotune_searches() { return autotune_cache().searches.load(); }

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
  const int64_t channels = channels_to_run(layer, input, w, format, saved.need_input_grads, device);
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
    choose_algorithm<Forward>(plan, layer, x.shape(), Operands{x.raw(), w_used.raw(), nullptr, y.raw()}, device);
  {
    Workspace ws(plan.fwd_ws, device);
    TNT_CUDNN_CHECK(cudnnConvolutionForward(cudnn_handle(device), CudnnScalars::one(), plan.x, x.raw(), plan.w,
                                            w_used.raw(), plan.conv_fwd, plan.fwd_algo, ws.data(), ws.bytes(),
                                            CudnnScalars::zero(), plan.y, y.raw()));
  }
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
  cudnnHandle_t h = cudnn_handle(device);
  if (dx.defined()) {
    if (!plan.has_bwd_data)
      choose_algorithm<BackwardData>(plan, layer, x.shape(), Operands{nullptr, w.raw(), dy.raw(), dx.raw()}, device);
    Workspace ws(plan.bwd_data_ws, device);
    TNT_CUDNN_CHECK(cudnnConvolutionBackwardData(h, CudnnScalars::one(), plan.w, w.raw(), plan.y, dy.raw(),
                                                 plan.conv_bwd_data, plan.bwd_data_algo, ws.data(), ws.bytes(),
                                                 CudnnScalars::zero(), plan.x, dx.raw()));
  }
  if (dw.defined()) {
    TNT_CHECK(dw.dtype() == DType::f32 || (!info.krsc_copy && dw.dtype() == x.dtype()),
              "Conv2D '{}': weight gradient {} for input {}", layer.name(), dw.str(), x.str());
    TNT_CHECK(!dw.is_channels_last(), "Conv2D '{}': the weight gradient {} must be contiguous", layer.name(),
              dw.str());
    if (!plan.has_bwd_filter)
      choose_algorithm<BackwardFilter>(plan, layer, x.shape(), Operands{x.raw(), nullptr, dy.raw()}, device);
    Workspace ws(plan.bwd_filter_ws, device);
    // A filter gradient in KCRS, or a 1x1 one in KRSC (the same bytes), goes straight into
    // the master gradient when the dtypes agree.
    if (!info.krsc_copy && dw.dtype() == x.dtype()) {
      // beta = 1: the gradient accumulates over the calls of a step.
      TNT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, CudnnScalars::one(), plan.x, x.raw(), plan.y, dy.raw(),
                                                     plan.conv_bwd_filter, plan.bwd_filter_algo, ws.data(),
                                                     ws.bytes(), CudnnScalars::one(), plan.w, dw.raw()));
    } else {
      // This call's gradient in the filter's dtype and format (KCRS or KRSC), then added in
      // float to the f32 master gradient (transposed on the way for KRSC). The temporary
      // returns to the allocator's cache at scope exit, safely: the kernels that use it
      // are queued on the compute stream.
      const MemoryFormat part_format = info.krsc_copy ? MemoryFormat::channels_last : MemoryFormat::contiguous;
      Tensor part = Tensor::empty({dw.dim(0), x.dim(1), dw.dim(2), dw.dim(3)}, x.dtype(), x.device(),
                                  part_format);  // (F, C or the padded channels, k, k)
      TNT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, CudnnScalars::one(), plan.x, x.raw(), plan.y, dy.raw(),
                                                     plan.conv_bwd_filter, plan.bwd_filter_algo, ws.data(),
                                                     ws.bytes(), CudnnScalars::zero(), plan.w, part.raw()));
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
