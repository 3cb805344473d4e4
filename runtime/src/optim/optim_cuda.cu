// Elementwise optimizer updates on CUDA (and gradient clipping), two ways:
//   - per parameter: one grid-stride loop per rule of optim/update_rules.hpp and tensor;
//   - multi-tensor: one launch for all tensors of a step, one block per row of the table
//     of optim/multi_tensor.hpp, each block a plain loop over its chunk.
// Each element goes through the same rule either way (one compiled element loop shared by
// both kernels), and each element is independent, so the two give the same bits whatever
// the launch configuration.
//
// Norms for clipping are sums of squares in double without atomics: each chunk of
// kChunkElements is summed by one block (thread j takes elements j, j + 256, ..., then
// block_sum's fixed tree), then the chunks of a tensor are added left to right by one
// thread, and for a global norm the tensors too, left to right. The per-parameter path
// (sum_squares_chunked) cuts a tensor into the same chunks, so both paths compute the
// same norm, and neither depends on the GPU's number of SMs.
#include "optim/optim_cuda.hpp"

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/device_common.cuh"
#include "core/device_api.hpp"
#include "tarantella/check.hpp"

#include <limits>

namespace tnt::cuda {

namespace {

// The element loops of the rules, each compiled once (__noinline__) and called by both the
// per-parameter and the multi-tensor kernel: the same instructions, hence the same bits.
// Inlined into two kernels, nvcc would be free to fuse the multiply-adds of each copy
// differently. One call per thread and kernel, so the call costs nothing that shows.
// Elements first, first + stride, ... below n.
__device__ __noinline__ void sgd_elements(optim::SgdRule rule,
                                          float* __restrict__ param,       // (n)
                                          const float* __restrict__ grad,  // (n)
                                          float* __restrict__ buf,         // (n), or null without momentum
                                          int64_t first, int64_t n, int64_t stride) {
  for (int64_t i = first; i < n; i += stride) {
    optim::apply(rule, param[i], grad[i], buf != nullptr ? buf + i : nullptr);
  }
}

__device__ __noinline__ void adam_elements(optim::AdamRule rule,
                                           float* __restrict__ param,       // (n)
                                           const float* __restrict__ grad,  // (n)
                                           float* __restrict__ m,           // (n)
                                           float* __restrict__ v,           // (n)
                                           int64_t first, int64_t n, int64_t stride) {
  for (int64_t i = first; i < n; i += stride) optim::apply(rule, param[i], grad[i], m[i], v[i]);
}

__device__ int64_t grid_first() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__global__ void sgd_kernel(optim::SgdRule rule,
                           float* __restrict__ param,       // (n)
                           const float* __restrict__ grad,  // (n)
                           float* __restrict__ buf,         // (n), or null without momentum
                           int64_t n) {
  sgd_elements(rule, param, grad, buf, grid_first(), n, grid_stride());
}

__global__ void adam_kernel(optim::AdamRule rule,
                            float* __restrict__ param,       // (n)
                            const float* __restrict__ grad,  // (n)
                            float* __restrict__ m,           // (n)
                            float* __restrict__ v,           // (n)
                            int64_t n) {
  adam_elements(rule, param, grad, m, v, grid_first(), n, grid_stride());
}

// Comparisons only: no rounding for a compiler to treat differently.
__global__ void clip_value_kernel(float* __restrict__ grad,  // (n)
                                  float limit, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) grad[i] = optim::clip_value(grad[i], limit);
}

// ---- sums of squares, chunk by chunk ----

// The squares of one chunk, x: (count), in double; every thread gets the sum. blockDim.x is
// kBlock in every caller, so the tree, and the result, is the same in both paths (compiled
// once, as the element loops above).
__device__ __noinline__ double chunk_squares(const float* __restrict__ x, int64_t count, double* scratch) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const double v = static_cast<double>(x[i]);
    acc += v * v;
  }
  return block_sum(acc, scratch);
}

// One tensor: block b sums chunk b, elements [b * chunk, min((b + 1) * chunk, n)).
__global__ void chunked_squares_kernel(const float* __restrict__ x,  // (n)
                                       int64_t n, int64_t chunk,
                                       double* __restrict__ partials) {  // (gridDim.x)
  __shared__ double scratch[kWarp];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t count = n - begin < chunk ? n - begin : chunk;
  const double s = chunk_squares(x + begin, count, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One thread: out[0] = the partials added left to right, as mt_clip_factors_kernel adds a
// tensor's chunks.
__global__ void sum_in_order_kernel(const double* __restrict__ partials,  // (count)
                                    int64_t count, double* __restrict__ out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = 0.0;
  for (int64_t i = 0; i < count; ++i) s += partials[i];
  out[0] = s;
}

// ---- multi-tensor kernels: block b does row b of the table ----

// Rules as one kernel argument (the learning rate and the step's terms change every step;
// the table does not). At most 8 * 36 bytes, far below the argument limit.
struct SgdRules {
  optim::SgdRule r[optim::kMaxRules];
};
struct AdamRules {
  optim::AdamRule r[optim::kMaxRules];
};

__global__ void mt_sgd_kernel(const optim::MtChunk* __restrict__ chunks,  // (gridDim.x)
                              SgdRules rules) {
  const optim::MtChunk c = chunks[blockIdx.x];
  // c.param, c.grad, c.slot0 (momentum buffer or null): (c.count)
  sgd_elements(rules.r[c.rule], c.param, c.grad, c.slot0, threadIdx.x, c.count, blockDim.x);
}

__global__ void mt_adam_kernel(const optim::MtChunk* __restrict__ chunks,  // (gridDim.x)
                               AdamRules rules) {
  const optim::MtChunk c = chunks[blockIdx.x];
  // c.param, c.grad, c.slot0 (exp_avg), c.slot1 (exp_avg_sq): (c.count)
  adam_elements(rules.r[c.rule], c.param, c.grad, c.slot0, c.slot1, threadIdx.x, c.count, blockDim.x);
}

__global__ void mt_squares_kernel(const optim::MtChunk* __restrict__ chunks,  // (gridDim.x)
                                  double* __restrict__ partials) {            // (gridDim.x)
  __shared__ double scratch[kWarp];
  const optim::MtChunk c = chunks[blockIdx.x];
  const double s = chunk_squares(c.grad, c.count, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// As optim/clip.cpp's clip_to_norm: only a finite norm above the limit clips, by the factor
// limit / norm in double rounded to float once (ops::scale's). -1: leave the tensor alone.
// sqrt and division in double are correctly rounded on the device, as on the host.
__device__ float clip_factor(double squares, double limit) {
  const double norm = sqrt(squares);
  return (norm > limit && isfinite(norm)) ? static_cast<float>(limit / norm) : -1.0f;
}

// One block. Tensor t's squares: its chunks' partials left to right; with global, the
// tensors' squares left to right (the order the per-parameter path adds them on the host).
__global__ void mt_clip_factors_kernel(const double* __restrict__ partials,     // (chunks)
                                       const int32_t* __restrict__ first_chunk,  // (n_tensors + 1)
                                       int32_t n_tensors, bool global, double limit,
                                       double* __restrict__ squares,  // (n_tensors)
                                       float* __restrict__ factors) {  // (n_tensors)
  __shared__ float global_factor;
  for (int32_t t = threadIdx.x; t < n_tensors; t += blockDim.x) {
    double s = 0.0;
    for (int32_t k = first_chunk[t]; k < first_chunk[t + 1]; ++k) s += partials[k];
    squares[t] = s;
    if (!global) factors[t] = clip_factor(s, limit);
  }
  if (!global) return;  // the same for every thread of the block: no barrier is skipped by some
  __syncthreads();      // makes every squares[t] visible to thread 0
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int32_t t = 0; t < n_tensors; ++t) s += squares[t];
    global_factor = clip_factor(s, limit);
  }
  __syncthreads();
  for (int32_t t = threadIdx.x; t < n_tensors; t += blockDim.x) factors[t] = global_factor;
}

// The norm's factor (factors null: no norm clipping), then the value, as clip_gradients
// orders them. A tensor that neither touches is not written at all.
__global__ void mt_clip_kernel(const optim::MtChunk* __restrict__ chunks,  // (gridDim.x)
                               const float* __restrict__ factors,          // (tensors), or null
                               bool by_value, float limit) {
  const optim::MtChunk c = chunks[blockIdx.x];
  const float f = factors != nullptr ? factors[c.tensor] : -1.0f;
  if (f < 0.0f && !by_value) return;
  for (int64_t i = threadIdx.x; i < c.count; i += blockDim.x) {
    float g = c.grad[i];
    if (f >= 0.0f) g = g * f;
    if (by_value) g = optim::clip_value(g, limit);
    c.grad[i] = g;
  }
}

unsigned blocks_of(const optim::MtLaunch& launch) {
  TNT_CHECK(launch.n_chunks >= 0 && launch.n_chunks <= std::numeric_limits<int32_t>::max(),
            "multi-tensor launch of {} chunks: a grid holds at most 2^31 - 1 blocks", launch.n_chunks);
  TNT_CHECK(launch.device.is_cuda(), "multi-tensor launch for a table on {}: it must be on a CUDA device",
            launch.device.str());
  return static_cast<unsigned>(launch.n_chunks);
}

void check_rules(int n_rules, const char* what) {
  TNT_CHECK(n_rules >= 1 && n_rules <= optim::kMaxRules, "{}: {} rules, a launch carries 1 to {}", what, n_rules,
            optim::kMaxRules);
}

}  // namespace

void sgd_update(const optim::SgdRule& rule, float* param, const float* grad, float* buf, int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  sgd_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(rule, param, grad, buf, n);
  TNT_CUDA_CHECK_LAUNCH();
}

void adam_update(const optim::AdamRule& rule, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  adam_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(rule, param, grad, exp_avg,
                                                                                 exp_avg_sq, n);
  TNT_CUDA_CHECK_LAUNCH();
}

void clip_value(float* grad, float limit, int64_t n, int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  clip_value_kernel<<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(grad, limit, n);
  TNT_CUDA_CHECK_LAUNCH();
}

double sum_squares_chunked(const float* grad, int64_t n, int64_t chunk_elements, int device) {
  if (n == 0) return 0.0;
  TNT_CHECK(chunk_elements >= 1, "sum_squares_chunked: chunk size must be >= 1, got {}", chunk_elements);
  const int64_t blocks = (n + chunk_elements - 1) / chunk_elements;
  TNT_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "sum_squares_chunked: {} chunks of {} elements: too many",
            blocks, chunk_elements);
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  Workspace ws(static_cast<size_t>(blocks + 1) * sizeof(double), device);
  double* partials = ws.as<double>();  // (blocks)
  double* total = partials + blocks;    // (1)
  chunked_squares_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(grad, n, chunk_elements, partials);
  TNT_CUDA_CHECK_LAUNCH();
  sum_in_order_kernel<<<1, 1, 0, stream>>>(partials, blocks, total);
  TNT_CUDA_CHECK_LAUNCH();
  double host = 0.0;
  backend::cuda_copy(&host, Device::cpu(), total, Device::cuda(device), sizeof(double));
  return host;
}

void multi_tensor_sgd(const optim::MtLaunch& launch, const optim::SgdRule* rules, int n_rules) {
  check_rules(n_rules, "multi_tensor_sgd");
  const unsigned blocks = blocks_of(launch);
  if (blocks == 0) return;
  SgdRules args{};
  for (int k = 0; k < n_rules; ++k) args.r[k] = rules[k];
  const int device = launch.device.index;
  DeviceGuard guard(device);
  mt_sgd_kernel<<<blocks, kBlock, 0, compute_stream(device)>>>(launch.chunks, args);
  TNT_CUDA_CHECK_LAUNCH();
}

void multi_tensor_adam(const optim::MtLaunch& launch, const optim::AdamRule* rules, int n_rules) {
  check_rules(n_rules, "multi_tensor_adam");
  const unsigned blocks = blocks_of(launch);
  if (blocks == 0) return;
  AdamRules args{};
  for (int k = 0; k < n_rules; ++k) args.r[k] = rules[k];
  const int device = launch.device.index;
  DeviceGuard guard(device);
  mt_adam_kernel<<<blocks, kBlock, 0, compute_stream(device)>>>(launch.chunks, args);
  TNT_CUDA_CHECK_LAUNCH();
}

void multi_tensor_clip(const optim::MtLaunch& launch, const MultiTensorClip& clip) {
  TNT_CHECK(!(clip.norm && clip.global_norm), "multi_tensor_clip: norm and global_norm exclude each other");
  const unsigned blocks = blocks_of(launch);
  const std::optional<double> limit = clip.norm ? clip.norm : clip.global_norm;
  if (blocks == 0 || !(limit || clip.value)) return;
  const int device = launch.device.index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  // Scratch of the norms: partials (n_chunks) and squares (n_tensors) in double, then the
  // factors (n_tensors) in float. Released to the cache at the end of the scope: safe, the
  // kernels that use it are queued on the compute stream before anything that reuses it.
  Workspace ws;
  const float* factors = nullptr;
  if (limit) {
    const size_t n_chunks = blocks, n_tensors = static_cast<size_t>(launch.n_tensors);
    ws = Workspace((n_chunks + n_tensors) * sizeof(double) + n_tensors * sizeof(float), device);
    double* partials = ws.as<double>();
    double* squares = partials + n_chunks;
    float* f = reinterpret_cast<float*>(squares + n_tensors);
    mt_squares_kernel<<<blocks, kBlock, 0, stream>>>(launch.chunks, partials);
    TNT_CUDA_CHECK_LAUNCH();
    mt_clip_factors_kernel<<<1, kBlock, 0, stream>>>(partials, launch.first_chunk, launch.n_tensors,
                                                     clip.global_norm.has_value(), *limit, squares, f);
    TNT_CUDA_CHECK_LAUNCH();
    factors = f;
  }
  const float value = clip.value ? static_cast<float>(*clip.value) : 0.0f;
  mt_clip_kernel<<<blocks, kBlock, 0, stream>>>(launch.chunks, factors, clip.value.has_value(), value);
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace tnt::cuda
