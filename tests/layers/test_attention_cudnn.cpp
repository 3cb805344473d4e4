// The cuDNN attention engine's graphs, built on the CPU: every tensor, pointwise, matmul,
// reduction, reshape and RNG descriptor of the forward and backward graphs is created,
// given its attributes and finalized, which cuDNN does without a GPU or a handle (only the
// operation graph, heuristics and plans need one). So a wrong attribute type, a missing
// operand or an inconsistent shape fails here, in every CUDA build, before the lent GPU
// runs test_attention_cudnn_cuda.cpp. Also the engine's applicability rule. Label layers.
#include "backend/cuda/cudnn_graph.hpp"
#include "layers/attention_cudnn_cuda.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
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
            REQUIRE_NOTHROW(fwd = cuda::cudnn_attention_forward_ops(k));
            REQUIRE_NOTHROW(bwd = cuda::cudnn_attention_backward_ops(k));
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
              // The engine's second choice of bias layout builds too.
              std::vector<std::string> fwd_rows, bwd_rows;
              REQUIRE_NOTHROW(fwd_rows = cuda::cudnn_attention_forward_ops(k, true));
              REQUIRE_NOTHROW(bwd_rows = cuda::cudnn_attention_backward_ops(k, true));
              CHECK(count(fwd_rows, "POINTWISE ADD (+ padding bias [B,1,Tq,Tk])") == 1);
              CHECK(count(bwd_rows, "POINTWISE ADD (+ padding bias [B,1,Tq,Tk])") == 1);
              CHECK(fwd_rows.size() == fwd.size());
              CHECK(bwd_rows.size() == bwd.size());
            }
          }
        }
      }
    }
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

TEST_CASE("When the cuDNN attention engine applies", "[layers][attention]") {
  using cuda::cudnn_attention_applies;
  CHECK(cudnn_attention_applies(DType::bf16, 64, 16, 256, 256, 64, true));
  CHECK(cudnn_attention_applies(DType::f16, 2, 2, 37, 50, 128, false));
  CHECK(cudnn_attention_applies(DType::bf16, 2, 2, 2, 300, 8, false));
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 1, 300, 64, false));  // decoding: a plan per step
  CHECK_FALSE(cudnn_attention_applies(DType::f32, 2, 2, 64, 64, 64, false));   // not a flash-attention dtype
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 64, 64, 60, false));  // depth not a multiple of 8
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 64, 64, 256, false)); // beyond what we test
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 2, 2, 37, 50, 64, true));   // causal needs Tq == Tk
  CHECK_FALSE(cudnn_attention_applies(DType::bf16, 0, 2, 64, 64, 64, false));  // empty
}
