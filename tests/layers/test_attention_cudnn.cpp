// The cuDNN attention engine's graphs, built on the CPU: every tensor, pointwise, matmul,
// reduction, reshape and RNG descriptor of the forward and backward graphs is created,
// given its attributes and finalized, which cuDNN does without a GPU or a handle (only the
// operation graph, heuristics and plans need one). So a wrong attribute type, a missing
// operand or an inconsistent shape fails here, in every CUDA build, before the lent GPU
// runs test_attention_cudnn_cuda.cpp. Also the engine's applicability rule. Label layers.
#include "backend/cuda/cudnn_graph.hpp"
#include "layers/attention_cudnn_cuda.hpp"
#include "cudnn_deviceless.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace tnt;
using cuda::CudnnAttentionKey;

namespace {

CudnnAttentionKey key(DType dt, int64_t tq, int64_t tk, int64_t depth, bool causal, bool bias, float rate) {
  CudnnAttentionKey k;
  k.batch = 3;
  k.heads = 2;
  k.tq = tq;
  k.tk = tk;
  k.depth = depth;
  k.dtype = dt;
  k.causal = causal;
  k.bias = bias;
  k.rate = rate;
  k.scale = 0.125f;
  return k;
}

int64_t count(const std::vector<std::string>& ops, const std::string& prefix) {
  return std::count_if(ops.begin(), ops.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
}

std::string joined(const std::vector<std::string>& ops) {
  std::string s;
  for (const auto& o : ops) s += "\n  " + o;
  return s;
}

}  // namespace

TEST_CASE("cuDNN attention graphs build on the CPU: every variant", "[layers][attention]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    for (int64_t depth : {64, 128}) {
      for (bool causal : {false, true}) {
        for (bool bias : {false, true}) {
          for (float rate : {0.0f, 0.1f}) {
            const CudnnAttentionKey k = key(dt, 100, causal ? 100 : 77, depth, causal, bias, rate);
            INFO(k.str());
            std::vector<std::string> fwd, bwd;
            REQUIRE_NOTHROW(fwd = cuda::cudnn_attention_forward_graph(k).ops);
            REQUIRE_NOTHROW(bwd = cuda::cudnn_attention_backward_graph(k).ops);
            INFO("forward:" << joined(fwd) << "\nbackward:" << joined(bwd));
            // The forward: two products (Q K^T, P V), the softmax's two reductions, the
            // mask's four nodes when causal, the RNG when dropping out.
            CHECK(count(fwd, "MATMUL") == 2);
            CHECK(count(fwd, "REDUCTION") == 2);
            CHECK(count(fwd, "RNG") == (rate > 0 ? 1 : 0));
            CHECK(count(fwd, "POINTWISE GEN_INDEX") == (causal ? 2 : 0));
            CHECK(count(fwd, "POINTWISE ADD (+ padding bias") == (bias ? 1 : 0));
            CHECK(fwd.front() == "MATMUL (Q K^T)");
            CHECK(fwd.back() == "MATMUL (P V -> O)");
            // The backward: Q K^T again, dV, dP, dK, dQ; dO.O's reduction; three transposes;
            // dQ through the f32 accumulator last.
            CHECK(count(bwd, "MATMUL") == 5);
            CHECK(count(bwd, "REDUCTION") == 1);
            CHECK(count(bwd, "RESHAPE") == 3);
            CHECK(count(bwd, "RNG") == (rate > 0 ? 1 : 0));
            CHECK(count(bwd, "POINTWISE GEN_INDEX") == (causal ? 2 : 0));
            CHECK(bwd.back() == "POINTWISE IDENTITY (-> dQ)");
            if (bias) {
              // Every bias layout the engine may fall back to builds too.
              for (const auto& layout : cuda::cudnn_attention_bias_layouts()) {
                INFO("bias " << layout.str());
                std::vector<std::string> fwd_l, bwd_l;
                REQUIRE_NOTHROW(fwd_l = cuda::cudnn_attention_forward_graph(k, layout).ops);
                REQUIRE_NOTHROW(bwd_l = cuda::cudnn_attention_backward_graph(k, layout).ops);
                CHECK(count(fwd_l, "POINTWISE ADD (+ padding bias " + layout.str() + ")") == 1);
                CHECK(count(bwd_l, "POINTWISE ADD (+ padding bias " + layout.str() + ")") == 1);
                CHECK(fwd_l.size() == fwd.size());
                CHECK(bwd_l.size() == bwd.size());
              }
            }
          }
        }
      }
    }
  }
}

namespace {

// The description of the tensor called name (the part after "name: "), or "" if none.
std::string tensor_line(const cuda::CudnnAttentionGraphText& g, const std::string& name) {
  for (const auto& t : g.tensors) {
    if (t.rfind(name + ": ", 0) == 0) return t.substr(name.size() + 2);
  }
  return "";
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

// What cuDNN holds after finalize, read back through cudnnBackendGetAttribute, against what
// cudnn-frontend builds for the same SDPA graph (see attention_cudnn_cuda.hpp): the choices
// that decide whether cuDNN 9.19's fused engines take the graph on Hopper.
TEST_CASE("cuDNN attention graphs carry cudnn-frontend's attributes", "[layers][attention]") {
  // B = 3, H = 2, Tq = 100, Tk = 77, d = 64: Q as a (B, H, T, d) view of (B, T, H d).
  const CudnnAttentionKey k = key(DType::bf16, 100, 77, 64, false, true, 0.1f);
  const auto fwd = cuda::cudnn_attention_forward_graph(k);
  const auto bwd = cuda::cudnn_attention_backward_graph(k);
  INFO("forward tensors:" << joined(fwd.tensors) << "\nbackward tensors:" << joined(bwd.tensors));

  // The I/O tensors: strided views, never virtual nor by value.
  CHECK(tensor_line(fwd, "Q") == "uid 1 bf16 [3,2,100,64] strides [12800,64,128,1]");
  CHECK(tensor_line(fwd, "K^T") == "uid 2 bf16 [3,2,64,77] strides [9856,64,1,128]");
  CHECK(tensor_line(bwd, "V^T") == "uid 3 bf16 [3,2,64,77] strides [9856,64,1,128]");
  // Stats: f32 (B, H, Tq, 1) packed, the only Stats layout cuDNN below 9.26 reads right.
  CHECK(tensor_line(fwd, "Stats") == "uid 5 f32 [3,2,100,1] strides [200,100,1,1]");
  CHECK(tensor_line(bwd, "Stats") == "uid 5 f32 [3,2,100,1] strides [200,100,1,1]");
  // The backward's scratch: user tensors, f32, packed, as the frontend gives them.
  CHECK(tensor_line(bwd, "softmax sum") == "uid 17 f32 [3,2,100,1] strides [200,100,1,1]");
  CHECK(tensor_line(bwd, "dQ accumulator") == "uid 18 f32 [3,2,100,64] strides [12800,6400,64,1]");
  // Scalars by value in f32; the dropout seed and offset int64 in device memory.
  for (const char* s : {"attention scale", "dropout scale"}) {
    INFO(s);
    CHECK(ends_with(tensor_line(fwd, s), "f32 [1,1,1,1] strides [1,1,1,1] by-value"));
  }
  CHECK(ends_with(tensor_line(bwd, "1 - rate"), "f32 [1,1,1,1] strides [1,1,1,1] by-value"));
  for (const char* s : {"dropout seed", "dropout offset"}) {
    INFO(s);
    CHECK(tensor_line(fwd, s) == (std::string(s) == "dropout seed" ? "uid 8" : "uid 9") +
                                     std::string(" i64 [1,1,1,1] strides [1,1,1,1]"));
    CHECK(tensor_line(bwd, s) == tensor_line(fwd, s));
  }
  // The padding bias: per key in the I/O dtype first.
  CHECK(tensor_line(fwd, "padding bias") == "uid 7 bf16 [3,1,1,77] strides [77,77,77,1]");
  CHECK(tensor_line(bwd, "padding bias") == "uid 7 bf16 [3,1,1,77] strides [77,77,77,1]");
  // dO * O with the frontend's strides, not our view's.
  CHECK(ends_with(tensor_line(bwd, "dO * O"), "f32 [3,2,100,64] strides [12800,6400,128,1] virtual"));
  // The probabilities meet the second matmul (and P^T, dS^T meet theirs) in the I/O dtype.
  CHECK(ends_with(tensor_line(fwd, "dropped probabilities"), "bf16 [3,2,100,77] strides [15400,7700,77,1] virtual"));
  CHECK(ends_with(tensor_line(bwd, "P^T"), "bf16 [3,2,77,100] strides [15400,7700,1,77] virtual"));
  CHECK(ends_with(tensor_line(bwd, "dS^T"), "bf16 [3,2,77,100] strides [15400,7700,1,77] virtual"));
  // ... but K, reshaped back from K^T for dS K, stays f32 as the frontend leaves it.
  CHECK(ends_with(tensor_line(bwd, "K"), "f32 [3,2,77,64] strides [9856,64,128,1] virtual"));
  // alpha1 = alpha2 = 1 on every pointwise operation (as set: cuDNN does not read them back).
  for (const auto* g : {&fwd, &bwd}) {
    CHECK(g->pointwise.size() == static_cast<size_t>(count(g->ops, "POINTWISE")));
    for (const auto& pw : g->pointwise) {
      INFO(pw);
      CHECK(ends_with(pw, ": alpha1 1 alpha2 1"));
    }
  }

  SECTION("without dropout the softmax's division feeds P V directly, in the I/O dtype") {
    const CudnnAttentionKey k0 = key(DType::f16, 100, 77, 64, false, false, 0.0f);
    const auto g = cuda::cudnn_attention_forward_graph(k0);
    CHECK(ends_with(tensor_line(g, "probabilities"), "f16 [3,2,100,77] strides [15400,7700,77,1] virtual"));
    CHECK(tensor_line(g, "dropout seed").empty());
  }

  SECTION("the bias layouts, in the order the engine tries them") {
    const auto layouts = cuda::cudnn_attention_bias_layouts();
    REQUIRE(layouts.size() == 5);
    const char* want[] = {"bf16 [3,1,1,77] strides [77,77,77,1]", "bf16 [3,1,100,77] strides [77,77,0,1]",
                          "bf16 [3,1,100,77] strides [7700,7700,77,1]", "f32 [3,1,1,77] strides [77,77,77,1]",
                          "f32 [3,1,100,77] strides [7700,7700,77,1]"};
    for (size_t i = 0; i < layouts.size(); ++i) {
      INFO(layouts[i].str());
      CHECK(tensor_line(cuda::cudnn_attention_forward_graph(k, layouts[i]), "padding bias") ==
            std::string("uid 7 ") + want[i]);
      CHECK(tensor_line(cuda::cudnn_attention_backward_graph(k, layouts[i]), "padding bias") ==
            std::string("uid 7 ") + want[i]);
    }
    // f16 I/O: the bias follows it.
    const CudnnAttentionKey k16 = key(DType::f16, 100, 77, 64, false, true, 0.0f);
    CHECK(tensor_line(cuda::cudnn_attention_forward_graph(k16), "padding bias") ==
          "uid 7 f16 [3,1,1,77] strides [77,77,77,1]");
  }

  SECTION("causal: the frontend's composite diagonal band") {
    const CudnnAttentionKey kc = key(DType::bf16, 100, 100, 64, true, false, 0.0f);
    for (const auto& g : {cuda::cudnn_attention_forward_graph(kc), cuda::cudnn_attention_backward_graph(kc)}) {
      INFO(joined(g.tensors));
      CHECK(ends_with(tensor_line(g, "row index"), "i32 [3,2,100,100] strides [20000,10000,100,1] virtual"));
      CHECK(ends_with(tensor_line(g, "column index"), "i32 [3,2,100,100] strides [20000,10000,100,1] virtual"));
      CHECK(ends_with(tensor_line(g, "causal keep"), "bool [3,2,100,100] strides [20000,10000,100,1] virtual"));
      CHECK(ends_with(tensor_line(g, "causal mask value"), "f32 [1,1,1,1] strides [1,1,1,1] by-value"));
      CHECK(count(g.ops, "POINTWISE BINARY_SELECT (keep ? logit : -inf)") == 1);
    }
    // -inf from cuDNN 9.10 on, as the frontend passes it.
    CHECK(std::isinf(cuda::kCudnnCausalMaskValue));
    CHECK(cuda::kCudnnCausalMaskValue < 0);
  }

  SECTION("the padding value is exact in every bias dtype") {
    // bf16 keeps the top 16 bits of an f32; f16 holds integers up to 2048 exactly and powers
    // of two up to 2^15.
    uint32_t bits = 0;
    std::memcpy(&bits, &cuda::kCudnnPaddingBias, sizeof(bits));
    CHECK((bits & 0xffffu) == 0u);
    CHECK(cuda::kCudnnPaddingBias == -8192.0f);
  }
}

TEST_CASE("cuDNN attention graphs: the wrapper names the failing step", "[layers][attention]") {
  // A tensor whose strides do not match its dimensions' count never reaches cuDNN.
  cuda::graph::TensorSpec s;
  s.uid = 1;
  s.name = "bad";
  s.dims = {1, 2, 3, 4};
  s.strides = {24, 12, 4};
  CHECK_THROWS_WITH(cuda::graph::make_tensor(s), Catch::Contains("tensor bad") && Catch::Contains("4 dims, 3 strides"));
  // cuDNN refuses to finalize a tensor without a unique id: the message names the tensor,
  // the step and cuDNN's status.
  cuda::graph::Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor without uid");
  t.set_data_type(TNT_ATTR(CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_DATA_FLOAT)
      .set_int64s(TNT_ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS), {1, 1, 1, 1})
      .set_int64s(TNT_ATTR(CUDNN_ATTR_TENSOR_STRIDES), {1, 1, 1, 1});
  CHECK_THROWS_WITH(t.finalize(), Catch::Contains("cuDNN graph: tensor without uid: finalize: CUDNN_STATUS"));
}

TEST_CASE("The cuDNN attention engine refuses a cuDNN older than its graphs", "[layers][attention]") {
  // The GPU machines lend their own cuDNN: one before 9.16 would need the frontend's
  // backward workaround, which these graphs do not carry.
  CHECK_THAT(cuda::cudnn_attention_version_problem(91500), Catch::Contains("cuDNN 9.15.0 at run time"));
  CHECK_FALSE(cuda::cudnn_attention_version_problem(90800).empty());
  CHECK(cuda::cudnn_attention_version_problem(91600).empty());
  CHECK(cuda::cudnn_attention_version_problem(91900).empty());
}

TEST_CASE("When the cuDNN attention engine applies", "[layers][attention]") {
  using cuda::cudnn_attention_applies;
  CHECK(cudnn_attention_applies(DType::bf16, 64, 16, 256, 256, 64, true));
  CHECK(cudnn_attention_applies(DType::f16, 2, 2, 37, 50, 128, false));
  CHECK(cudnn_attention_applies(DType::bf16, 2, 2, 2, 300, 8, false));
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 1, 300, 64, false));  // decoding: a plan per step
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 40, 1, 64, false));   // one key: not served
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 2, 1, 64, false));
  CHECK_FALSE(cudnn_attention_applies(DType::f32, 2, 2, 64, 64, 64, false));   // not a flash-attention dtype
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 64, 64, 60, false));  // depth not a multiple of 8
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 64, 64, 256, false)); // beyond what we test
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 37, 50, 64, true));   // causal needs Tq == Tk
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 0, 2, 64, 64, 64, false));  // empty
}

// The whole way to cuDNN's generated kernels, for the GPU the engine runs on, on a machine
// without it: heuristics for an H200, every graph's engine config finalized into a plan (its
// kernel generated by NVRTC for sm_90), for the shapes and options the Transformer uses and
// the others the GPU test covers. A graph cuDNN's engines do not serve on Hopper (no engine
// config, or none that finalizes) fails here with cuDNN's reasons, not on the lent GPU.
// (Measured when it was written: forward engine 2 and backward engine 6 for every case, the
// padding bias broadcast over query rows in the I/O dtype accepted.)
TEST_CASE("cuDNN attention graphs plan for an H200 without the GPU", "[layers][attention][deviceless]") {
  test::load_libcuda_or_stub();
  struct Case {
    const char* what;
    DType dtype;
    int64_t tq, tk, depth;
    bool causal, bias;
    float rate;
    int64_t batch = 8;
  };
  const std::vector<Case> cases{
      {"encoder self-attention: padding, dropout", DType::bf16, 256, 256, 64, false, true, 0.1f},
      {"decoder self-attention: causal, dropout", DType::bf16, 256, 256, 64, true, false, 0.1f},
      {"cross attention: padding, dropout, Tq != Tk", DType::bf16, 200, 256, 64, false, true, 0.1f},
      {"evaluation: padding, no dropout", DType::bf16, 256, 256, 64, false, true, 0.0f},
      {"causal, padding, lengths off the tile", DType::bf16, 300, 300, 64, true, true, 0.1f},
      {"f16, depth 128", DType::f16, 256, 256, 128, false, true, 0.1f},
      {"plain", DType::bf16, 64, 64, 64, false, false, 0.0f},
      // The tiny model (hidden 32, 4 heads): depth 8, the smallest cuDNN takes; and a
      // --max_length off 8 (keys 50: rows of the bias off 16 bytes).
      {"depth 8: padding, dropout", DType::bf16, 64, 64, 8, false, true, 0.1f},
      {"depth 8: causal, dropout", DType::bf16, 64, 64, 8, true, false, 0.1f},
      {"keys off 8: padding, dropout", DType::bf16, 50, 50, 64, false, true, 0.1f},
      // The benchmark's batches (docs/gpu.md, gpu_targets): Transformer-big at 128 sentences
      // x 256 tokens and 64 x 64; heuristics see the batch, so the real sizes are planned too.
      {"128 x 256 encoder: padding, dropout", DType::bf16, 256, 256, 64, false, true, 0.1f, 128},
      {"128 x 256 decoder: causal, padding, dropout", DType::bf16, 256, 256, 64, true, true, 0.1f, 128},
      {"64 x 64 encoder: padding, dropout", DType::bf16, 64, 64, 64, false, true, 0.1f, 64}};
  for (const Case& c : cases) {
    CudnnAttentionKey k = key(c.dtype, c.tq, c.tk, c.depth, c.causal, c.bias, c.rate);
    k.batch = c.batch;
    k.heads = 16;
    INFO(c.what);
    cuda::CudnnAttentionPlanInfo info;
    try {
      info = cuda::cudnn_attention_plan_deviceless(k, test::kH200);
    } catch (const std::exception& e) {
      FAIL(e.what());
    }
    CHECK(info.forward_engine >= 0);
    CHECK(info.backward_engine >= 0);
    WARN(c.what << ": " << info.str());
  }
}

// The GPU test checks each bias layout, not only the first cuDNN builds: forcing one makes it
// the only layout planned, and -1 gives back the engine's order.
TEST_CASE("A forced cuDNN attention bias layout is the one planned", "[layers][attention][deviceless]") {
  test::load_libcuda_or_stub();
  const auto layouts = cuda::cudnn_attention_bias_layouts();
  CudnnAttentionKey k = key(DType::bf16, 64, 64, 64, false, true, 0.0f);
  CHECK_THROWS_WITH(cuda::cudnn_attention_force_bias_layout(static_cast<int>(layouts.size())),
                    Catch::Contains("bias layout 5 forced"));
  CHECK_THROWS(cuda::cudnn_attention_force_bias_layout(-2));
  struct Reset {
    ~Reset() { cuda::cudnn_attention_force_bias_layout(-1); }
  } reset;
  // Layout 2, the frontend's own [B, 1, Tq, Tk] in the I/O dtype, and layout 1, PyTorch's
  // expanded mask (query stride 0): each planned alone although layout 0 builds too.
  for (int forced : {2, 1}) {
    cuda::cudnn_attention_force_bias_layout(forced);
    CHECK(cuda::cudnn_attention_plan_deviceless(k, test::kH200).bias_layout.str() == layouts[forced].str());
  }
  cuda::cudnn_attention_force_bias_layout(-1);
  CHECK(cuda::cudnn_attention_plan_deviceless(k, test::kH200).bias_layout.str() == layouts[0].str());
  // A key without padding has no bias to lay out: forcing changes nothing there.
  cuda::cudnn_attention_force_bias_layout(3);
  k.bias = false;
  CHECK_NOTHROW(cuda::cudnn_attention_plan_deviceless(k, test::kH200));
}

// The cap on planned shapes (kCudnnAttentionMaxShapes): decoding's many lengths must not
// each compile two graphs. Keys admitted stay admitted; new ones past the cap are refused,
// and the refusal is reported once.
TEST_CASE("cuDNN attention plans a bounded number of shapes", "[layers][attention]") {
  cuda::CudnnShapeCap cap(3);
  auto k = [](int64_t t, bool causal) { return key(DType::bf16, t, t, 64, causal, true, 0.1f); };
  CHECK(cap.admit(k(64, false)));
  CHECK(cap.admit(k(64, true)));  // the options make another key
  CHECK(cap.admit(k(64, false)));  // seen: no new slot
  CHECK_FALSE(cap.first_refusal());
  CHECK(cap.admit(k(128, false)));
  CHECK(cap.admitted() == 3);
  CHECK_FALSE(cap.admit(k(130, false)));
  CHECK_FALSE(cap.admit(k(131, false)));
  CHECK(cap.admit(k(128, false)));  // admitted keys keep their plans
  CHECK(cap.admitted() == 3);
  CHECK(cap.first_refusal());
  CHECK_FALSE(cap.first_refusal());
  CHECK(cuda::kCudnnAttentionMaxShapes >= 12);  // training's keys, with evaluation and partial batches
}
