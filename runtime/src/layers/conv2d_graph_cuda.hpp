// Convolution through cuDNN's graph API (backend/cuda/cudnn_graph.hpp), for Conv2D's
// autotuning (conv2d_cuda.cu): the legacy API's Find times one engine per legacy algorithm
// with cuDNN's default knobs; the graph API's heuristics propose engine configs with other
// knobs (tiles, split-K, stages) as well, which frameworks that benchmark through it
// (PyTorch's cudnn.benchmark) time too. Here each direction of a problem gets its proposed
// configs built into execution plans, engines that compile at run time left out; the Conv2D
// engine times them against the legacy choice, checks their output against it and keeps the
// fastest. Plain C++ (no kernels): the deviceless test plans these graphs on a CPU machine.
//
// Tensors as the legacy descriptors see them: x (N, C, H, W), w (K, C, R, R), y (N, K, P, Q),
// with channels-last strides (and KRSC filters) or packed NCHW ones; f32 compute; alpha 1,
// beta 0 (the output overwritten).
#pragma once

#include "backend/cuda/cudnn_graph.hpp"
#include "tarantella/dtype.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tnt::cuda {

enum class ConvGraphDirection { forward, backward_data, backward_filter };
const char* conv_graph_direction_name(ConvGraphDirection d);

struct ConvGraphShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t k = 0, r = 1;                // filters, square filter size
  int64_t stride = 1, padding = 0;
  DType dtype = DType::bf16;  // x, w, y and their gradients
  bool channels_last = true;
  int64_t p() const { return (h + 2 * padding - r) / stride + 1; }
  int64_t q() const { return (w + 2 * padding - r) / stride + 1; }
  std::string str() const;  // "bf16 NHWC (256, 64, 56, 56) * 64 3x3/s1/p1"
};

// One direction's operation graph, shared by its candidate plans (a plan is used while its
// graph's descriptors live).
struct ConvGraphOps {
  ConvGraphOps();
  graph::GraphParts parts;
  graph::Descriptor conv;  // the convolution descriptor its operation refers to
  graph::Descriptor op_graph;
  ConvGraphDirection direction = ConvGraphDirection::forward;
};

// A candidate: an execution plan of one engine config for the graph.
struct ConvGraph {
  std::shared_ptr<ConvGraphOps> ops;
  graph::Plan plan;
  std::string describe() const;  // "engine 12 (mode A, config 3), 4096 B workspace"
};

// Builds the direction's graph for s (finalized against handle, or with a null handle for
// deviceless planning) and up to max_plans candidate plans, for this GPU (handle) or the one
// device_properties describes. Empty when cuDNN plans none; *refused then says why.
std::vector<ConvGraph> conv_graph_candidates(ConvGraphDirection d, const ConvGraphShape& s, cudnnHandle_t handle,
                                             const graph::Descriptor* device_properties, size_t max_plans,
                                             std::string* refused = nullptr);

// The graph's operation and tensors as cuDNN holds them ("CONV_FPROP", "x: uid 1 bf16 ..."),
// built without a GPU, for tests to pin.
std::vector<std::string> conv_graph_text(ConvGraphDirection d, const ConvGraphShape& s);

// The uids the variant pack gives run_conv_graph's (a, b, out) for direction d: the uids of
// forward (x, w, y), backward data (dy, w, dx), backward filter (x, dy, dw) as the graph's
// tensors carry them (conv_graph_text). A pointer under another tensor's uid is read with
// that tensor's sizes: pinned by a deviceless test, as on a GPU it is a wrong result or an
// illegal address.
std::array<int64_t, 3> conv_graph_operand_uids(ConvGraphDirection d);

// Runs a candidate on handle's stream. Operands by direction: forward (x, w) -> y; backward
// data (dy, w) -> dx; backward filter (x, dy) -> dw. workspace: at least plan.workspace bytes.
void run_conv_graph(const ConvGraph& g, cudnnHandle_t handle, const void* a, const void* b, void* out,
                    void* workspace);

}  // namespace tnt::cuda
