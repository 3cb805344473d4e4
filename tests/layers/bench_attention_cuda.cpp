// Benchmark (not a test): the attention core's forward + backward on CUDA, the fused engine
// (attention_fused_cuda.cu) against the unfused one (cuBLAS products and a softmax kernel)
// and cuDNN's flash attention (attention_cudnn_cuda.cpp),
// on Transformer-big shapes in bf16: B = 64 sentences, H = 16 heads of depth 64, T = 256.
// Times with CUDA events on the compute stream, 3 warm-up and 20 timed iterations; one line
// per case that a person can read and scripts/gpu-check can collect:
//   attention case=self B=64 H=16 Tq=256 Tk=256 d=64 dtype=bf16 fused=yes fused_ms=...
//     unfused_ms=... speedup=... fwd_fused_ms=... fwd_unfused_ms=...
// (ms: mean per iteration of forward + backward, fwd_: of the forward alone; speedup:
// unfused / fused; fused=no if the fused engine did not apply on this device, when both
// columns time the unfused one). Then the fused forward alone with 16 and with 32 query
// rows per warp (TNT_FUSED_ATTENTION_ROWS; the "attention case=" lines use the variable's
// value), after each case's line and for a few more shapes:
//   attention_fwd_rows case=self B=64 H=16 Tq=256 Tk=256 d=64 dtype=bf16 rows16_ms=...
//     rows32_ms=... rows32_speedup=... rows16_tflops=... rows32_tflops=...
// (speedup: rows16 / rows32; TFLOP/s: the two products' 4 d FLOPs per (query, key) pair,
// counting with causal only the pairs j <= i + Tk - Tq, over the forward's time; rows32
// runs as 16 above depth 64.)
// Then, per case, cuDNN's flash attention (attention_cudnn_cuda.cpp, TNT_CUDNN_ATTENTION):
//   attention_cudnn case=self B=64 H=16 Tq=256 Tk=256 d=64 dtype=bf16 cudnn=yes fwd_ms=...
//     bwd_ms=... fwd_bwd_ms=... fused_fwd_bwd_ms=... speedup_vs_fused=... fwd_tflops=...
// (bwd_ms: forward + backward less the forward; cudnn=no error="cuDNN's message" where its
// graph does not build on this device, and nothing timed.)
#include "backend/cuda/cuda_context.hpp"
#include "layers/attention_cuda.hpp"
#include "layers/attention_fused.hpp"
#include "layers/attention_fused_cuda.hpp"
#include "tarantella/device.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cuda_runtime.h>

#include <algorithm>
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

AttentionCoreArgs args_of(const BenchCase& c) {
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
  return a;
}

Timing time_engine(const BenchCase& c, cuda::AttentionEngine engine, bool backward, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& ids, const Tensor& d_o) {
  const AttentionCoreArgs a = args_of(c);
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

// The fused forward alone with warp_rows query rows per warp: ms per iteration.
double time_fused_forward(const BenchCase& c, int64_t warp_rows, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& ids) {
  const AttentionCoreArgs a = args_of(c);
  cudaStream_t stream = cuda::compute_stream(0);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int it = 0; it < kWarmup + kIters; ++it) {
    if (it == kWarmup) cudaEventRecord(start, stream);
    Tensor o, stats, keep;
    cuda::fused_attention_forward(q, k, v, ids, a, o, stats, keep, 0, warp_rows);
  }
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(std::string("attention bench: CUDA error ") + cudaGetErrorString(err));
  return ms / kIters;
}

// FLOPs of the forward's two products, 2 d for S and 2 d for P V per (query, key) pair:
// every pair, or with causal those with j <= i + Tk - Tq (the kernels skip most others).
double forward_flops(const BenchCase& c) {
  double pairs = 0;
  for (int64_t i = 0; i < c.tq; ++i) {
    const int64_t seen = c.causal ? std::min(c.tk, std::max<int64_t>(0, i + c.tk - c.tq + 1)) : c.tk;
    pairs += static_cast<double>(seen);
  }
  return 4.0 * static_cast<double>(c.depth) * pairs * static_cast<double>(c.batch * c.heads);
}

struct CaseInputs {
  Tensor q, k, v, d_o, ids;
};

CaseInputs make_inputs(const BenchCase& c, Device dev) {
  const int64_t D = c.heads * c.depth;
  CaseInputs in;
  in.q = random_bf16({c.batch, c.tq, D}, 1, dev);
  in.k = random_bf16({c.batch, c.tk, D}, 2, dev);
  in.v = random_bf16({c.batch, c.tk, D}, 3, dev);
  in.d_o = random_bf16({c.batch, c.tq, D}, 4, dev);
  if (c.ids) {
    // Sentences of different lengths: row b keeps its first Tk - (b % 32) keys.
    std::vector<int64_t> idv(static_cast<size_t>(c.batch * c.tk));
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < c.tk; ++j) idv[static_cast<size_t>(b * c.tk + j)] = j < c.tk - b % 32 ? 1 + j % 7 : 0;
    in.ids = Tensor::from_data(idv.data(), {c.batch, c.tk}).to(dev);
  }
  return in;
}

void print_rows_line(const BenchCase& c, const CaseInputs& in) {
  std::printf("attention_fwd_rows case=%s B=%lld H=%lld Tq=%lld Tk=%lld d=%lld dtype=bf16 ", c.name.c_str(),
              static_cast<long long>(c.batch), static_cast<long long>(c.heads), static_cast<long long>(c.tq),
              static_cast<long long>(c.tk), static_cast<long long>(c.depth));
  if (!fused_attention_applies(DType::bf16, c.batch, c.heads, c.tq, c.tk, c.depth) ||
      !cuda::fused_attention_fits(c.depth, 0)) {
    std::printf("fused=no\n");
  } else {
    const double ms16 = time_fused_forward(c, 16, in.q, in.k, in.v, in.ids);
    const double ms32 = time_fused_forward(c, 32, in.q, in.k, in.v, in.ids);
    const double flops = forward_flops(c);
    std::printf("rows16_ms=%.3f rows32_ms=%.3f rows32_speedup=%.2f rows16_tflops=%.1f rows32_tflops=%.1f\n", ms16,
                ms32, ms16 / ms32, flops / (ms16 * 1e9), flops / (ms32 * 1e9));
  }
  std::fflush(stdout);
}

// cuDNN's engine on the case: forward alone, forward + backward; or why it cannot run.
void print_cudnn_line(const BenchCase& c, const CaseInputs& in, double fused_ms) {
  std::printf("attention_cudnn case=%s B=%lld H=%lld Tq=%lld Tk=%lld d=%lld dtype=bf16 ", c.name.c_str(),
              static_cast<long long>(c.batch), static_cast<long long>(c.heads), static_cast<long long>(c.tq),
              static_cast<long long>(c.tk), static_cast<long long>(c.depth));
  try {
    const Timing fwd = time_engine(c, cuda::AttentionEngine::cudnn, false, in.q, in.k, in.v, in.ids, in.d_o);
    const Timing both = time_engine(c, cuda::AttentionEngine::cudnn, true, in.q, in.k, in.v, in.ids, in.d_o);
    std::printf("cudnn=yes fwd_ms=%.3f bwd_ms=%.3f fwd_bwd_ms=%.3f fused_fwd_bwd_ms=%.3f speedup_vs_fused=%.2f "
                "fwd_tflops=%.1f\n",
                fwd.ms, both.ms - fwd.ms, both.ms, fused_ms, fused_ms / both.ms, forward_flops(c) / (fwd.ms * 1e9));
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::replace(msg.begin(), msg.end(), '"', '\'');
    std::printf("cudnn=no error=\"%s\"\n", msg.c_str());
  }
  std::fflush(stdout);
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
      const CaseInputs in = make_inputs(c, dev);
      const Tensor &q = in.q, &k = in.k, &v = in.v, &d_o = in.d_o, &ids = in.ids;
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
      print_rows_line(c, in);
      print_cudnn_line(c, in, fused.ms);
    }
    // The forward with 16 and 32 query rows per warp on more shapes: depth 32, and long
    // sequences (more key tiles per block).
    const std::vector<BenchCase> rows_cases{
        {"self_d32", 64, 32, 256, 256, 32, false, true, 0.0f},
        {"self_T1024", 16, 16, 1024, 1024, 64, false, true, 0.0f},
        {"causal_T1024", 16, 16, 1024, 1024, 64, true, false, 0.0f},
    };
    for (const BenchCase& c : rows_cases) print_rows_line(c, make_inputs(c, dev));
  });
}
