// Conv2D's algorithm choice on CUDA (conv2d_plan_cuda.hpp): descriptors of a plan, each
// direction's legacy algorithm, timed or from cuDNN's heuristics, and a cuDNN graph where one
// is faster.
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
// cuDNN graphs: after a f16/bf16 direction is timed, cuDNN's graph-API configurations may
// take its place (conv2d_graph_trial_cuda.cu's header says how they are checked and timed).
#include "layers/conv2d_plan_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <atomic>
#include <mutex>

namespace tnt::cuda {

namespace {

constexpr size_t kMaxWorkspace = kConvMaxWorkspace;

using conv_autotune::Direction;
using conv_autotune::Problem;

// The process-wide autotune results (see the top): algorithm and math type per problem.
struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  float ms = -1;  // its timed milliseconds; below zero when the heuristics chose
};

struct AutotuneCache {
  std::mutex mutex;  // also serialises the timing runs
  std::map<Problem::Key, Choice> choices;
  std::map<Problem::Key, std::shared_ptr<const ConvGraph>> graphs;  // where a graph was faster
  std::atomic<int64_t> searches{0};
};

std::atomic<int64_t> graph_runs{0};

AutotuneCache& autotune_cache() {
  static AutotuneCache* cache = new AutotuneCache();  // never destroyed: used until exit
  return *cache;
}


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
  static void find(cudnnHandle_t h, const ConvPlan& p, const ConvOperands& o, void* out, Perf* perf, int* n,
                   const Workspace& ws) {
    TNT_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, p.x, o.x, p.w, o.w, p.conv_fwd, p.y, out, kCount, n,
                                                           perf, ws.data(), ws.bytes()));
  }
  static void set(cudnnHandle_t h, ConvPlan& p, Algo a) {
    p.fwd_algo = a;
    TNT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv_fwd, p.y, a, &p.fwd_ws));
    p.has_fwd = true;
  }
  // The graph's operands (a, b) -> out: (x, w) -> y.
  static constexpr ConvGraphDirection kGraph = ConvGraphDirection::forward;
  static std::shared_ptr<const ConvGraph>& graph(ConvPlan& p) { return p.fwd_graph; }
  static const std::shared_ptr<const ConvGraph>& graph(const ConvPlan& p) { return p.fwd_graph; }
  static const void* a(const ConvOperands& o) { return o.x; }
  static const void* b(const ConvOperands& o) { return o.w; }
  // The chosen algorithm: out = beta out + conv(a, b).
  static void legacy(cudnnHandle_t h, const ConvPlan& p, const void* a, const void* b, void* out, float beta,
                     int device) {
    Workspace ws(p.fwd_ws, device);
    const float one = 1.0f;
    TNT_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p.x, a, p.w, b, p.conv_fwd, p.fwd_algo, ws.data(), ws.bytes(),
                                            &beta, p.y, out));
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
  static void find(cudnnHandle_t h, const ConvPlan& p, const ConvOperands& o, void* out, Perf* perf, int* n,
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
  // (dy, w) -> dx.
  static constexpr ConvGraphDirection kGraph = ConvGraphDirection::backward_data;
  static std::shared_ptr<const ConvGraph>& graph(ConvPlan& p) { return p.bwd_data_graph; }
  static const std::shared_ptr<const ConvGraph>& graph(const ConvPlan& p) { return p.bwd_data_graph; }
  static const void* a(const ConvOperands& o) { return o.dy; }
  static const void* b(const ConvOperands& o) { return o.w; }
  static void legacy(cudnnHandle_t h, const ConvPlan& p, const void* a, const void* b, void* out, float beta,
                     int device) {
    Workspace ws(p.bwd_data_ws, device);
    const float one = 1.0f;
    TNT_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p.w, b, p.y, a, p.conv_bwd_data, p.bwd_data_algo, ws.data(),
                                                 ws.bytes(), &beta, p.x, out));
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
  static void find(cudnnHandle_t h, const ConvPlan& p, const ConvOperands& o, void* out, Perf* perf, int* n,
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
  // (x, dy) -> dw.
  static constexpr ConvGraphDirection kGraph = ConvGraphDirection::backward_filter;
  static std::shared_ptr<const ConvGraph>& graph(ConvPlan& p) { return p.bwd_filter_graph; }
  static const std::shared_ptr<const ConvGraph>& graph(const ConvPlan& p) { return p.bwd_filter_graph; }
  static const void* a(const ConvOperands& o) { return o.x; }
  static const void* b(const ConvOperands& o) { return o.dy; }
  static void legacy(cudnnHandle_t h, const ConvPlan& p, const void* a, const void* b, void* out, float beta,
                     int device) {
    Workspace ws(p.bwd_filter_ws, device);
    const float one = 1.0f;
    TNT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p.x, a, p.y, b, p.conv_bwd_filter, p.bwd_filter_algo,
                                                   ws.data(), ws.bytes(), &beta, p.w, out));
  }
};

// Chooses one direction's algorithm for the plan (see the top) and sets its math type and
// workspace size. Returns the chosen algorithm's timed milliseconds, or -1 when it was not
// timed (autotuning off, or the heuristics chose).
template <typename Dir>
float choose_algorithm(ConvPlan& plan, const Conv2D& layer, const Shape& x_shape, const ConvOperands& operands,
                      int device) {
  cudnnHandle_t h = cudnn_handle(device);
  typename Dir::Perf perf[Dir::kCount];
  int returned = 0;
  Dir::heuristics(h, plan, perf, &returned);
  const typename Dir::Perf* heuristic = choose(perf, returned);
  const typename Dir::Perf* timed_choice = nullptr;
  typename Dir::Perf chosen{};
  float timed_ms = -1;
  bool searched = false;  // timed here, not taken from the cache
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
      if (auto g = cache.graphs.find(problem.key()); g != cache.graphs.end()) Dir::graph(plan) = g->second;
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
      searched = true;
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
  if (searched && timed_ms >= 0 && conv_graphs_enabled(plan)) {
    Problem problem = plan.problem;
    problem.direction = Dir::kDirection;
    AutotuneCache& cache = autotune_cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    float graph_ms = -1;
    std::shared_ptr<const ConvGraph> g;
    try {
      ConvGraphTrial trial;
      trial.direction = Dir::kGraph;
      trial.name = Dir::kName;
      trial.a = Dir::a(operands);
      trial.b = Dir::b(operands);
      trial.out = operands.out;
      trial.output_bytes = Dir::output_bytes(plan);
      trial.run_algorithm = [&](void* out) { Dir::legacy(h, plan, trial.a, trial.b, out, 0.0f, device); };
      g = faster_conv_graph(plan, layer, trial, timed_ms, device, &graph_ms);
    } catch (const Error& e) {
      log_warning("Conv2D '{}': trying cuDNN graphs for {} failed ({}); the algorithm stays", layer.name(),
                  problem.str(), e.what());
    }
    if (g) {
      Dir::graph(plan) = g;
      cache.graphs[problem.key()] = g;
      cache.choices[problem.key()].ms = graph_ms;  // what this direction now takes
      timed_ms = graph_ms;
    }
  }
  return timed_ms;
}

}  // namespace

bool conv_autotune_enabled() { return tnt::config().cudnn_autotune; }

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
  plan->autotune = conv_autotune_enabled();
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

float choose_forward(ConvPlan& plan, const Conv2D& layer, const Shape& x_shape, const ConvOperands& o, int device) {
  return choose_algorithm<Forward>(plan, layer, x_shape, o, device);
}
float choose_backward_data(ConvPlan& plan, const Conv2D& layer, const Shape& x_shape, const ConvOperands& o,
                           int device) {
  return choose_algorithm<BackwardData>(plan, layer, x_shape, o, device);
}
float choose_backward_filter(ConvPlan& plan, const Conv2D& layer, const Shape& x_shape, const ConvOperands& o,
                             int device) {
  return choose_algorithm<BackwardFilter>(plan, layer, x_shape, o, device);
}

namespace {
// The direction's graph where one was chosen (and, for the filter gradient, no accumulation
// is asked: graphs overwrite; and the operands are aligned as the graph says, see the top),
// else its algorithm.
template <typename Dir>
void run(const ConvPlan& plan, const void* a, const void* b, void* out, float beta, int device) {
  const auto& g = Dir::graph(plan);
  cudnnHandle_t h = cudnn_handle(device);
  if (g && beta == 0.0f && conv_autotune::graph_aligned({a, b, out})) {
    Workspace ws(static_cast<size_t>(g->plan.workspace), device);
    run_conv_graph(*g, h, a, b, out, ws.data());
    graph_runs.fetch_add(1);
  } else {
    Dir::legacy(h, plan, a, b, out, beta, device);
  }
}
}  // namespace

void run_forward(const ConvPlan& plan, const void* x, const void* w, void* y, int device) {
  run<Forward>(plan, x, w, y, 0.0f, device);
}
void run_backward_data(const ConvPlan& plan, const void* dy, const void* w, void* dx, int device) {
  run<BackwardData>(plan, dy, w, dx, 0.0f, device);
}
void run_backward_filter(const ConvPlan& plan, const void* x, const void* dy, void* dw, float beta, int device) {
  run<BackwardFilter>(plan, x, dy, dw, beta, device);
}

int64_t conv2d_autotune_searches() { return autotune_cache().searches.load(); }
int64_t conv2d_graph_runs() { return graph_runs.load(); }

}  // namespace tnt::cuda
