// Benchmark (not a test): the attention core's forward + backward on CUDA, the fused engine
// (attention_fused_cuda.cu) against the unfused one (cuBLAS products and a softmax kernel),
// on Transformer-big shapes in bf16: B = 64 sentences, H = 16 heads of depth 64, T = 256.
// Times with CUDA events on the compute stream, 3 warm-up and 20 timed iterations; one line
// per case that a person can read and scripts/gpu-check can collect:
//   attention case=self B=64 H=16 Tq=256 Tk=256 d=64 dtype=bf16 fused=yes fused_ms=...
//     unfused_ms=... speedup=... fwd_fused_ms=... fwd_unfused_ms=...
// (ms: mean per iteration of forward + backward, fwd_: of the forward alone; speedup:
// unfused / fused; fused=no if the fused engine did not apply on this device, when both
// columns time the unfused one).
#include "backend/cuda/cuda_context.hpp"
#include "layers/attention_cuda.hpp"
#include "tarantella/device.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace tnt;

constexpr int kWarmup = 3;
constexpr int kIters = 20;

struct BenchCase {
  std::string name;
  int64_t batch, heads, tq, tk, depth;
  bool causal, ids;
  float rate;
};

// Uniform in [-1, 1) from a 64-bit LCG: reproducible, cheap for 16M values.
Tensor random_bf16(const Shape& shape, uint64_t seed, Device dev) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (float& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<float>(static_cast<double>(s >> 40) / 16777216.0 * 2.0 - 1.0);
  }
  return ops::cast(Tensor::from_vector(v, shape).to(dev), DType::bf16);
}

struct Timing {
  double ms = 0;
  bool fused = false;
};

Timing time_engine(const BenchCase& c, cuda::AttentionEngine engine, bool backward, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& ids, const Tensor& d_o) {
  AttentionCoreArgs a;
  a.batch = c.batch;
  a.tq = c.tq;
  a.tk = c.tk;
  a.heads = c.heads;
  a.depth = c.depth;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.depth));
  a.causal = c.causal;
  a.rate = c.rate;
  a.key = 42;
  a.base = 0;
  cudaStream_t stream = cuda::compute_stream(0);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  Timing t;
  for (int it = 0; it < kWarmup + kIters; ++it) {
    if (it == kWarmup) cudaEventRecord(start, stream);
    std::shared_ptr<void> state;
    Tensor o = cuda::attention_core_forward(q, k, v, ids, a, state, engine);
    t.fused = cuda::attention_core_fused(state);
    if (backward) {
      Tensor dq, dk, dv;
      cuda::attention_core_backward(d_o, state, dq, dk, dv);
    }
  }
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(std::string("attention bench: CUDA error ") + cudaGetErrorString(err));
  t.ms = ms / kIters;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [&] {
    if (!cuda_available()) throw Error("tnt_attention_bench needs a CUDA device");
    const Device dev = Device::cuda(0);
    const std::vector<BenchCase> cases{
        {"self", 64, 16, 256, 256, 64, false, true, 0.0f},
        {"causal", 64, 16, 256, 256, 64, true, false, 0.0f},
        {"self_dropout", 64, 16, 256, 256, 64, false, true, 0.1f},
    };
    for (const BenchCase& c : cases) {
      const int64_t D = c.heads * c.depth;
      const Tensor q = random_bf16({c.batch, c.tq, D}, 1, dev);
      const Tensor k = random_bf16({c.batch, c.tk, D}, 2, dev);
      const Tensor v = random_bf16({c.batch, c.tk, D}, 3, dev);
      const Tensor d_o = random_bf16({c.batch, c.tq, D}, 4, dev);
      Tensor ids;
      if (c.ids) {
        // Sentences of different lengths: row b keeps its first Tk - (b % 32) keys.
        std::vector<int64_t> idv(static_cast<size_t>(c.batch * c.tk));
        for (int64_t b = 0; b < c.batch; ++b)
          for (int64_t j = 0; j < c.tk; ++j) idv[static_cast<size_t>(b * c.tk + j)] = j < c.tk - b % 32 ? 1 + j % 7 : 0;
        ids = Tensor::from_data(idv.data(), {c.batch, c.tk}).to(dev);
      }
      const Timing fused = time_engine(c, cuda::AttentionEngine::fused, true, q, k, v, ids, d_o);
      const Timing unfused = time_engine(c, cuda::AttentionEngine::unfused, true, q, k, v, ids, d_o);
      const Timing fwd_fused = time_engine(c, cuda::AttentionEngine::fused, false, q, k, v, ids, d_o);
      const Timing fwd_unfused = time_engine(c, cuda::AttentionEngine::unfused, false, q, k, v, ids, d_o);
      std::printf("attention case=%s B=%lld H=%lld Tq=%lld Tk=%lld d=%lld dtype=bf16 fused=%s fused_ms=%.3f "
                  "unfused_ms=%.3f speedup=%.2f fwd_fused_ms=%.3f fwd_unfused_ms=%.3f\n",
                  c.name.c_str(), static_cast<long long>(c.batch), static_cast<long long>(c.heads),
                  static_cast<long long>(c.tq), static_cast<long long>(c.tk), static_cast<long long>(c.depth),
                  fused.fused ? "yes" : "no", fused.ms, unfused.ms, unfused.ms / fused.ms, fwd_fused.ms,
                  fwd_unfused.ms);
      std::fflush(stdout);
    }
  });
}
