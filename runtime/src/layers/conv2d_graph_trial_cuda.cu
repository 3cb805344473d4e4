// Conv2D's cuDNN graph trial (conv2d_plan_cuda.hpp, faster_conv_graph).
//
// cuDNN graphs (TNT_CUDNN_CONV_GRAPH, with autotuning, f16/bf16, not in deterministic mode):
// after a direction's algorithms are timed, the engine configs cuDNN's graph API proposes
// for the same problem (conv2d_graph_cuda.hpp, up to kGraphCandidates, none compiled at run
// time) run on the same operands. Each one's output is compared with the chosen algorithm's
// (largest difference within 2^-5 of the largest value: algorithms differ by the rounding
// of f32 sums to the half output, about 2^-8 of a value, while a graph given wrong strides
// or layouts is off by the values themselves), then it is timed over 3 runs with CUDA
// events; the fastest that agrees and beats the algorithm's time by kPadMinGain's 2% runs
// instead, for every plan of the problem in the process. A graph that fails to build, run
// or agree is logged (DEBUG when cuDNN plans none, WARNING when a planned one fails to run
// or disagrees) and left out. Each candidate
// writes into a buffer filled with NaN first, so one that leaves any of its output
// unwritten disagrees (the buffer is reused between candidates, and a fresh block from the
// allocator may hold a finished result); a reference the check cannot judge by (not
// finite, or all zero: conv2d_autotune.hpp, graph_output_agrees) takes no graph. Graphs
// run only on 16-byte aligned operands (graph_aligned), else the algorithm runs. A trial
// that fails as a whole (memory for its buffers) leaves the algorithm in place.
#include "layers/conv2d_plan_cuda.hpp"

#include "backend/cuda/compare.hpp"
#include "backend/cuda/device_common.cuh"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"

#include <atomic>
#include <cmath>

namespace tnt::cuda {

namespace {

constexpr size_t kMaxWorkspace = kConvMaxWorkspace;

using conv_autotune::Problem;

// The graph candidates timed per direction of a problem (conv2d_graph_cuda.hpp); how close
// a candidate's output must be to the chosen algorithm's is conv2d_autotune.hpp's.
constexpr size_t kGraphCandidates = 8;
constexpr int kGraphTimedRuns = 3;

std::atomic<bool> force_graphs{false};  // tests: take the fastest graph that agrees, however slow

ConvGraphShape graph_shape(const ConvPlan& plan) {
  const Problem& p = plan.problem;
  ConvGraphShape s;
  s.n = p.n;
  s.c = p.c;
  s.h = p.h;
  s.w = p.w;
  s.k = p.filters;
  s.r = p.kernel;
  s.stride = p.stride;
  s.padding = p.padding;
  s.dtype = static_cast<DType>(p.dtype);
  s.channels_last = static_cast<MemoryFormat>(p.format) == MemoryFormat::channels_last;
  return s;
}

}  // namespace

bool conv_graphs_enabled(const ConvPlan& plan) {
  const auto dt = static_cast<DType>(plan.problem.dtype);
  return plan.autotune && tnt::config().cudnn_conv_graph && !tnt::config().deterministic &&
         (dt == DType::bf16 || dt == DType::f16);
}

// The graph candidates of one direction of plan's problem, timed against the algorithm just
// chosen (legacy_ms) on the same operands and checked against its output (see the top).
// Returns the fastest that agrees and is kPadMinGain faster, or null; its time in *ms_out.
std::shared_ptr<const ConvGraph> faster_conv_graph(const ConvPlan& plan, const Conv2D& layer, const ConvGraphTrial& t,
                                                   float legacy_ms, int device, float* ms_out) {
  cudnnHandle_t h = cudnn_handle(device);
  const ConvGraphShape shape = graph_shape(plan);
  std::vector<ConvGraph> candidates;
  std::string refused;
  try {
    candidates = conv_graph_candidates(t.direction, shape, h, nullptr, kGraphCandidates, &refused);
  } catch (const Error& e) {
    log_debug("Conv2D '{}': no cuDNN graph for {} {}: {}", layer.name(), t.name, shape.str(), e.what());
    return nullptr;
  }
  if (candidates.empty()) {
    log_debug("Conv2D '{}': cuDNN planned no graph for {} {}:{}", layer.name(), t.name, shape.str(), refused);
    return nullptr;
  }
  if (!conv_autotune::graph_aligned({t.a, t.b})) {
    log_debug("Conv2D '{}': {} {}: operands not {}-byte aligned; no cuDNN graph tried", layer.name(), t.name,
              shape.str(), conv_autotune::kGraphAlignment);
    return nullptr;
  }
  // The algorithm's output goes where the Find's went: the real y or dx where the real call
  // overwrites it anyway (see the top), so that only the candidates' output takes a second
  // buffer of that size.
  const size_t bytes = t.output_bytes;
  Workspace scratch_reference(t.out ? 0 : bytes, device), out(bytes, device);  // aligned blocks
  void* reference = t.out ? t.out : scratch_reference.data();
  t.run_algorithm(reference);
  std::shared_ptr<const ConvGraph> best;
  float best_ms = force_graphs ? INFINITY : legacy_ms * (1.0f - static_cast<float>(conv_autotune::kPadMinGain));
  std::string times;
  for (ConvGraph& c : candidates) {
    if (c.plan.workspace > static_cast<int64_t>(kMaxWorkspace)) continue;
    try {
      Workspace ws(static_cast<size_t>(c.plan.workspace), device);
      // All bits set: NaN in f32, f16 and bf16 (see the top).
      TNT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, bytes, compute_stream(device)));
      run_conv_graph(c, h, t.a, t.b, out.data(), ws.data());
      const DType dt = static_cast<DType>(plan.problem.dtype);
      const auto [diff, largest] =
          max_difference(out.data(), reference, static_cast<int64_t>(bytes / dtype_size(dt)), dt, device);
      if (!conv_autotune::graph_reference_judges(largest)) {
        log_warning("Conv2D '{}': {} {}: the algorithm's output (largest value {}) cannot tell a right cuDNN graph "
                    "from a wrong one; none used",
                    layer.name(), t.name, shape.str(), largest);
        break;
      }
      if (!conv_autotune::graph_output_agrees(diff, largest)) {
        log_warning("Conv2D '{}': cuDNN graph {} for {} {} differs from algorithm results by {} (largest value {}); "
                    "not used",
                    layer.name(), c.describe(), t.name, shape.str(), diff, largest);
        continue;
      }
      const float ms =
          time_runs([&] { run_conv_graph(c, h, t.a, t.b, out.data(), ws.data()); }, kGraphTimedRuns, device);
      times += fmt::format(" {}: {:.3f} ms;", c.plan.engine, ms);
      if (ms < best_ms) {
        best_ms = ms;
        best = std::make_shared<const ConvGraph>(std::move(c));
      }
    } catch (const Error& e) {
      // WARNING, not DEBUG: a finalized plan should run, and a kernel fault (an illegal
      // address) leaves the device unusable, so the next CUDA call anywhere fails with a
      // message that does not name this graph; this line does.
      log_warning("Conv2D '{}': cuDNN graph {} for {} {} failed: {}", layer.name(), c.describe(), t.name,
                  shape.str(), e.what());
    }
  }
  *ms_out = best_ms;
  if (best) {
    log_info("Conv2D '{}': {} {}: cuDNN graph {} at {:.3f} ms, the algorithm {:.3f} ms (graphs by engine:{})",
             layer.name(), t.name, shape.str(), best->describe(), best_ms, legacy_ms, times);
  } else {
    log_debug("Conv2D '{}': {} {}: the algorithm ({:.3f} ms) stays (graphs by engine:{})", layer.name(), t.name,
              shape.str(), legacy_ms, times);
  }
  return best;
}

void conv2d_force_graphs(bool on) { force_graphs = on; }

}  // namespace tnt::cuda
