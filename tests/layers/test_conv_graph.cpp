// Conv2D's cuDNN graphs (runtime/src/layers/conv2d_graph_cuda.hpp), proven on the CPU: each
// direction's graph holds the tensors the legacy descriptors describe (NHWC with KRSC
// filters, or packed NCHW; the uids the variant pack uses), and cuDNN 9.19 plans several
// engine configs of each for an H200 without it (deviceless), none compiled at run time: the
// candidates the Conv2D autotuning times on a GPU (TNT_CUDNN_CONV_GRAPH). Label layers.
#include "backend/cuda/cudnn_graph.hpp"
#include "cudnn_deviceless.hpp"
#include "layers/conv2d_graph_cuda.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

using namespace tnt;
using cuda::ConvGraphDirection;
using cuda::ConvGraphShape;
namespace g = cuda::graph;

namespace {

ConvGraphShape shape(int64_t n, int64_t c, int64_t hw, int64_t k, int64_t r, int64_t stride, int64_t pad,
                     DType dtype = DType::bf16, bool channels_last = true) {
  ConvGraphShape s;
  s.n = n;
  s.c = c;
  s.h = s.w = hw;
  s.k = k;
  s.r = r;
  s.stride = stride;
  s.padding = pad;
  s.dtype = dtype;
  s.channels_last = channels_last;
  return s;
}

std::string line(const std::vector<std::string>& text, const std::string& name) {
  for (const auto& t : text) {
    if (t.rfind(name + ": ", 0) == 0) return t.substr(name.size() + 2);
  }
  return "";
}

}  // namespace

TEST_CASE("Conv2D graphs: each direction's tensors as cuDNN holds them", "[layers][conv_graph]") {
  // ResNet-50's 3x3 convolution of its first stage, NHWC bf16: activations with
  // channels-last strides, the filter KRSC.
  const ConvGraphShape s = shape(256, 64, 56, 64, 3, 1, 1);
  auto fwd = cuda::conv_graph_text(ConvGraphDirection::forward, s);
  INFO([&] {
    std::string all;
    for (const auto& t : fwd) all += "\n  " + t;
    return all;
  }());
  CHECK(fwd.at(0) == "CONV_FPROP");
  CHECK(line(fwd, "x") == "uid 1 bf16 [256,64,56,56] strides [200704,1,3584,64]");
  CHECK(line(fwd, "w") == "uid 2 bf16 [64,64,3,3] strides [576,1,192,64]");
  CHECK(line(fwd, "y") == "uid 3 bf16 [256,64,56,56] strides [200704,1,3584,64]");
  // The gradients take the uids the variant pack gives them: dy 8, dx 9, dw 10.
  auto dgrad = cuda::conv_graph_text(ConvGraphDirection::backward_data, shape(8, 64, 14, 128, 3, 2, 1));
  CHECK(dgrad.at(0) == "CONV_DGRAD");
  CHECK(line(dgrad, "dx") == "uid 9 bf16 [8,64,14,14] strides [12544,1,896,64]");
  CHECK(line(dgrad, "dy") == "uid 8 bf16 [8,128,7,7] strides [6272,1,896,128]");
  auto wgrad = cuda::conv_graph_text(ConvGraphDirection::backward_filter, shape(8, 3, 23, 16, 7, 2, 3, DType::f16));
  CHECK(wgrad.at(0) == "CONV_WGRAD");
  CHECK(line(wgrad, "dw") == "uid 10 f16 [16,3,7,7] strides [147,1,21,3]");
  CHECK(line(wgrad, "dy") == "uid 8 f16 [8,16,12,12] strides [2304,1,192,16]");
  // NCHW: packed strides, the filter KCRS.
  auto nchw = cuda::conv_graph_text(ConvGraphDirection::forward, shape(2, 4, 10, 5, 3, 1, 1, DType::bf16, false));
  CHECK(line(nchw, "x") == "uid 1 bf16 [2,4,10,10] strides [400,100,10,1]");
  CHECK(line(nchw, "w") == "uid 2 bf16 [5,4,3,3] strides [36,9,3,1]");
}

// run_conv_graph passes (a, b, out) under conv_graph_operand_uids: each must be the uid of
// the tensor that operand is, as the graph holds it (its role by name, and its dims).
TEST_CASE("Conv2D graphs: the variant pack's uids are the operands' tensors", "[layers][conv_graph]") {
  const ConvGraphShape s = shape(8, 16, 14, 32, 3, 2, 1);  // x (8,16,14,14), w (32,16,3,3), y (8,32,7,7)
  struct Case {
    ConvGraphDirection d;
    const char *a, *b, *out;
  };
  for (const Case& c : {Case{ConvGraphDirection::forward, "x", "w", "y"},
                        Case{ConvGraphDirection::backward_data, "dy", "w", "dx"},
                        Case{ConvGraphDirection::backward_filter, "x", "dy", "dw"}}) {
    INFO(cuda::conv_graph_direction_name(c.d));
    const auto text = cuda::conv_graph_text(c.d, s);
    const auto uids = cuda::conv_graph_operand_uids(c.d);
    const char* names[3] = {c.a, c.b, c.out};
    for (size_t i = 0; i < 3; ++i) {
      INFO("operand " << i << " (" << names[i] << ")");
      CHECK(line(text, names[i]).rfind("uid " + std::to_string(uids[i]) + " ", 0) == 0);
    }
  }
  // And the dims under those names: a's, b's and out's of each direction.
  CHECK(line(cuda::conv_graph_text(ConvGraphDirection::backward_data, s), "dy").find("[8,32,7,7]") !=
        std::string::npos);
  CHECK(line(cuda::conv_graph_text(ConvGraphDirection::backward_filter, s), "dw").find("[32,16,3,3]") !=
        std::string::npos);
}

// What cuDNN 9.19 proposes for ResNet-50's kinds of convolution on an H200 (batch 256, bf16
// NHWC): each direction gets several precompiled engine configs. Measured when written: the
// engines and counts are printed (and in docs/gpu.md); pinned are "at least two, none
// compiled at run time", what the autotuning needs to have a choice.
TEST_CASE("Conv2D graphs: several engine configs of each direction for an H200 without it",
          "[layers][conv_graph][deviceless]") {
  test::load_libcuda_or_stub();
  const g::Descriptor h200 = g::make_device_properties("H200", test::kH200);
  struct Case {
    const char* what;
    ConvGraphShape s;
  };
  const std::vector<Case> cases = {{"stem 7x7/s2, 4 channels (padded)", shape(256, 4, 224, 64, 7, 2, 3)},
                                   {"stage 1 3x3", shape(256, 64, 56, 64, 3, 1, 1)},
                                   {"stage 1 1x1 expand", shape(256, 64, 56, 256, 1, 1, 0)},
                                   {"stage 4 1x1 reduce", shape(256, 2048, 7, 512, 1, 1, 0)},
                                   {"stage 4 3x3/s2", shape(256, 512, 14, 512, 3, 2, 1)},
                                   {"stage 4 shortcut 1x1/s2", shape(256, 1024, 14, 2048, 1, 2, 0)}};
  const auto start = std::chrono::steady_clock::now();
  std::string table;
  for (const Case& c : cases) {
    for (ConvGraphDirection d :
         {ConvGraphDirection::forward, ConvGraphDirection::backward_data, ConvGraphDirection::backward_filter}) {
      INFO(c.what << " " << c.s.str() << " " << cuda::conv_graph_direction_name(d));
      std::string refused;
      const auto plans = cuda::conv_graph_candidates(d, c.s, nullptr, &h200, 8, &refused);
      INFO("refused or left out:" << refused);
      REQUIRE(plans.size() >= 2);
      std::string engines;
      for (const auto& p : plans) {
        CHECK(p.plan.engine >= 0);
        CHECK(p.plan.workspace >= 0);
        // The config the plan was made from lives as long as the plan, also for a plan
        // that stopped at loading its kernel here (compiled_only).
        CHECK(p.plan.engine_config.get() != nullptr);
        engines += " " + std::to_string(p.plan.engine);
      }
      table += std::string("\n  ") + c.what + ", " + cuda::conv_graph_direction_name(d) + ": " +
               std::to_string(plans.size()) + " plans, engines" + engines;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("Conv2D graph candidates for an H200 (%.1f s):%s\n", seconds, table.c_str());
}
