// See conv2d_graph_cuda.hpp.
#include "layers/conv2d_graph_cuda.hpp"

#include "layers/conv2d_autotune.hpp"
#include "tarantella/check.hpp"

#include <fmt/format.h>

namespace tnt::cuda {

namespace g = graph;

namespace {

// The user tensors' uids, by role (the variant pack names them).
enum : int64_t { kX = 1, kW = 2, kY = 3, kDY = 8, kDX = 9, kDW = 10, kFirstVirtual = 100 };

// (d0, d1, d2, d3) = (N, C, H, W) or (K, C, R, S): channels-last strides (KRSC for a filter)
// or packed ones.
g::TensorSpec spec(int64_t uid, const char* name, const ConvGraphShape& s, int64_t d0, int64_t d1, int64_t d2,
                   int64_t d3) {
  g::TensorSpec t;
  t.uid = uid;
  t.name = name;
  t.dtype = g::data_type(s.dtype, "Conv2D graph");
  t.dims = {d0, d1, d2, d3};
  t.strides = s.channels_last ? std::vector<int64_t>{d2 * d3 * d1, 1, d3 * d1, d1} : g::packed_strides(t.dims);
  // What the engine may assume of the pointers; run<Dir> checks it (conv2d_autotune.hpp).
  t.alignment = static_cast<int64_t>(conv_autotune::kGraphAlignment);
  return t;
}

// The convolution descriptor goes to `conv`, kept as long as the graph: the operations refer
// to it.
void build(g::GraphParts& p, ConvGraphDirection d, const ConvGraphShape& s, g::Descriptor& conv) {
  const g::Descriptor& x = p.tensor(spec(d == ConvGraphDirection::backward_data ? kDX : kX,
                                         d == ConvGraphDirection::backward_data ? "dx" : "x", s, s.n, s.c, s.h, s.w));
  const g::Descriptor& w = p.tensor(spec(d == ConvGraphDirection::backward_filter ? kDW : kW,
                                         d == ConvGraphDirection::backward_filter ? "dw" : "w", s, s.k, s.c, s.r, s.r));
  const g::Descriptor& y = p.tensor(spec(d == ConvGraphDirection::forward ? kY : kDY,
                                         d == ConvGraphDirection::forward ? "y" : "dy", s, s.n, s.k, s.p(), s.q()));
  conv = g::make_convolution("conv", g::ConvSpec{{s.padding, s.padding}, {s.stride, s.stride}, {1, 1}});
  switch (d) {
    case ConvGraphDirection::forward: p.op(g::make_conv_fprop("conv fprop", conv, x, w, y), "CONV_FPROP"); break;
    case ConvGraphDirection::backward_data: p.op(g::make_conv_dgrad("conv dgrad", conv, y, w, x), "CONV_DGRAD"); break;
    case ConvGraphDirection::backward_filter:
      p.op(g::make_conv_wgrad("conv wgrad", conv, x, y, w), "CONV_WGRAD");
      break;
  }
}

}  // namespace

const char* conv_graph_direction_name(ConvGraphDirection d) {
  switch (d) {
    case ConvGraphDirection::forward: return "forward";
    case ConvGraphDirection::backward_data: return "backward-data";
    case ConvGraphDirection::backward_filter: return "backward-filter";
  }
  return "?";
}

std::string ConvGraphShape::str() const {
  return fmt::format("{} {} ({}, {}, {}, {}) * {} {}x{}/s{}/p{}", dtype_name(dtype), channels_last ? "NHWC" : "NCHW", n,
                     c, h, w, k, r, r, stride, padding);
}

ConvGraphOps::ConvGraphOps() : parts(kFirstVirtual) {}

std::string ConvGraph::describe() const {
  return fmt::format("engine {} (heuristics mode {}, config {}), {} B workspace", plan.engine,
                     plan.mode == CUDNN_HEUR_MODE_A ? "A" : std::to_string(static_cast<int>(plan.mode)), plan.config,
                     plan.workspace);
}

std::vector<ConvGraph> conv_graph_candidates(ConvGraphDirection d, const ConvGraphShape& s, cudnnHandle_t handle,
                                             const g::Descriptor* device_properties, size_t max_plans,
                                             std::string* refused) {
  auto ops = std::make_shared<ConvGraphOps>();
  ops->direction = d;
  const std::string name = fmt::format("Conv2D {} {}", conv_graph_direction_name(d), s.str());
  build(ops->parts, d, s, ops->conv);
  ops->op_graph = g::make_operation_graph(name, handle, ops->parts.op_list());
  std::vector<g::Plan> plans = g::make_plans(name, handle, device_properties, ops->op_graph, max_plans, refused);
  std::vector<ConvGraph> out;
  for (g::Plan& p : plans) out.push_back(ConvGraph{ops, std::move(p)});
  return out;
}

std::vector<std::string> conv_graph_text(ConvGraphDirection d, const ConvGraphShape& s) {
  g::GraphParts p(kFirstVirtual);
  g::Descriptor conv;
  build(p, d, s, conv);
  std::vector<std::string> out = p.op_names;
  size_t i = 0;
  for (const g::Descriptor& t : p.tensors) out.push_back(p.tensor_names[i++] + ": " + g::describe_tensor(t));
  return out;
}

std::array<int64_t, 3> conv_graph_operand_uids(ConvGraphDirection d) {
  switch (d) {
    case ConvGraphDirection::forward: return {kX, kW, kY};
    case ConvGraphDirection::backward_data: return {kDY, kW, kDX};
    case ConvGraphDirection::backward_filter: return {kX, kDY, kDW};
  }
  TNT_THROW("Conv2D graph: direction {}", static_cast<int>(d));
}

void run_conv_graph(const ConvGraph& c, cudnnHandle_t handle, const void* a, const void* b, void* out,
                    void* workspace) {
  const std::array<int64_t, 3> ids = conv_graph_operand_uids(c.ops->direction);
  const std::vector<int64_t> uids(ids.begin(), ids.end());
  g::execute(fmt::format("Conv2D {}", conv_graph_direction_name(c.ops->direction)), handle, c.plan, uids,
             {const_cast<void*>(a), const_cast<void*>(b), out}, workspace);
}

}  // namespace tnt::cuda
