// Conv2D's CUDA plans: for one input shape and memory format, cuDNN's descriptors and each
// direction's choice (a legacy algorithm, or a cuDNN graph that was timed faster), made by
// conv2d_algorithms_cuda.cu and run by conv2d_cuda.cu. Internal to the layer.
#pragma once

#include "backend/cuda/cudnn_util.hpp"
#include "layers/conv2d_autotune.hpp"
#include "layers/conv2d_graph_cuda.hpp"
#include "tarantella/layers/conv2d.hpp"

#include <array>
#include <functional>
#include <map>
#include <memory>

namespace tnt::cuda {

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
  conv_autotune::Problem problem;                // the autotune key, less the direction
  // A direction's cuDNN graph, where one was timed faster than its algorithm (null: the
  // algorithm runs); shared with the other plans of the same problem.
  std::shared_ptr<const ConvGraph> fwd_graph, bwd_data_graph, bwd_filter_graph;
};

using PlanKey = std::array<int64_t, 6>;  // N, C, H, W, dtype, format

struct ConvCache {
  std::map<PlanKey, std::unique_ptr<ConvPlan>> plans;
  std::map<PlanKey, int64_t> padded_channels;  // under the input's key: the channels it runs with
};

// The real operands of a timing run (read only), and where its output may go: the real
// output when the real call overwrites it anyway (y, dx), else null for scratch memory.
struct ConvOperands {
  const void* x = nullptr;   // forward, backward filter
  const void* w = nullptr;   // forward, backward data
  const void* dy = nullptr;  // backward data, backward filter
  void* out = nullptr;       // forward: y; backward data: dx
};

// The most workspace an algorithm or graph of a convolution may take.
inline constexpr size_t kConvMaxWorkspace = size_t{1} << 30;

// One direction's cuDNN graph trial (conv2d_graph_trial_cuda.cu): the operands a and b of
// the direction's graph, where the algorithm's output may go (the real y or dx, which the
// real call overwrites anyway; null: a scratch buffer), its size, and the chosen algorithm,
// run with beta 0 into a given buffer.
struct ConvGraphTrial {
  ConvGraphDirection direction = ConvGraphDirection::forward;
  const char* name = "";
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  size_t output_bytes = 0;
  std::function<void(void* out)> run_algorithm;
};
// Whether graphs are tried for plan: TNT_CUDNN_CONV_GRAPH with autotuning, f16/bf16, not in
// deterministic mode.
bool conv_graphs_enabled(const ConvPlan& plan);
// The graph candidates of the trial's direction of plan's problem, checked against the
// algorithm's output and timed against its legacy_ms; the fastest that agrees and is 2%
// faster (any that agrees under conv2d_force_graphs), or null; its time in *ms_out.
std::shared_ptr<const ConvGraph> faster_conv_graph(const ConvPlan& plan, const Conv2D& layer, const ConvGraphTrial& t,
                                                   float legacy_ms, int device, float* ms_out);

// The layer's plan for x (N, C, H, W) in `format`, made at its first use: descriptors only;
// each direction is chosen by its choose_* at its first call.
ConvPlan& plan_for(Conv2D& layer, const Tensor& x, MemoryFormat format, int device);
// TNT_CUDNN_AUTOTUNE, as the process read it.
bool conv_autotune_enabled();
// Chooses one direction's algorithm (conv2d_algorithms_cuda.cu's header) and, where enabled,
// a faster cuDNN graph; returns the chosen one's timed milliseconds, or -1 when it was not
// timed (autotuning off, or the heuristics chose). x_shape is for messages.
float choose_forward(ConvPlan& plan, const Conv2D& layer, const Shape& x_shape, const ConvOperands& o, int device);
float choose_backward_data(ConvPlan& plan, const Conv2D& layer, const Shape& x_shape, const ConvOperands& o,
                           int device);
float choose_backward_filter(ConvPlan& plan, const Conv2D& layer, const Shape& x_shape, const ConvOperands& o,
                             int device);
// Run a chosen direction on the compute stream, with a workspace from the caching allocator.
void run_forward(const ConvPlan& plan, const void* x, const void* w, void* y, int device);
void run_backward_data(const ConvPlan& plan, const void* dy, const void* w, void* dx, int device);
// dw = beta dw + gradient. beta 1 (accumulate) runs the legacy algorithm: graphs overwrite,
// and are chosen for f16/bf16 plans only, whose gradient goes to a temporary with beta 0.
void run_backward_filter(const ConvPlan& plan, const void* x, const void* dy, void* dw, float beta, int device);

}  // namespace tnt::cuda
