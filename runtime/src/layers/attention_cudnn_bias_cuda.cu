// The two small inputs of the cuDNN attention graphs that we make on the device: the
// padding bias from key_ids, and the dropout seed/offset pair (a kernel rather than a copy
// so that the step never waits for the host and stays capturable as a CUDA graph).
#include "backend/cuda/device_common.cuh"
#include "layers/attention_cudnn_cuda.hpp"

namespace tnt::cuda {

namespace {

template <typename I, typename T>
__global__ void padding_bias_kernel(const I* __restrict__ ids,  // (B, Tk)
                                    T* __restrict__ bias,       // (B, rows, Tk)
                                    int64_t rows, int64_t tk, int64_t n) {
  TNT_KERNEL_LOOP(i, n) {
    const int64_t b = i / (rows * tk), j = i % tk;
    bias[i] = from_float<T>(ids[b * tk + j] == 0 ? kCudnnPaddingBias : 0.0f);
  }
}

// Seed at element 0, offset at element 2: each 16-byte aligned, as the graph declares.
__global__ void seed_offset_kernel(int64_t* out, uint64_t key, uint64_t base) {
  out[0] = static_cast<int64_t>(key);
  out[2] = static_cast<int64_t>(base);
}

}  // namespace

Tensor cudnn_attention_bias(const Tensor& key_ids, int64_t batch, int64_t rows, int64_t tk, DType dtype,
                            int device) {
  TNT_CHECK(key_ids.numel() == batch * tk, "MultiHeadAttention: key ids {} for ({}, {})", key_ids.str(), batch, tk);
  Tensor bias = Tensor::empty({batch, 1, rows, tk}, dtype, key_ids.device());
  const int64_t n = batch * rows * tk;
  if (n == 0) return bias;
  TNT_CUDA_DISPATCH_LABEL(key_ids.dtype(), "MultiHeadAttention key ids", {
    TNT_CUDA_DISPATCH_FLOAT(dtype, "cuDNN attention padding bias", {
      padding_bias_kernel<label_t, scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const label_t*>(key_ids.raw()), static_cast<scalar_t*>(bias.raw()), rows, tk, n);
    });
  });
  TNT_CUDA_CHECK_LAUNCH();
  return bias;
}

Tensor cudnn_attention_seed_offset(uint64_t key, uint64_t base, int device) {
  Tensor t = Tensor::empty({4}, DType::i64, Device::cuda(device));
  seed_offset_kernel<<<1, 1, 0, compute_stream(device)>>>(static_cast<int64_t*>(t.raw()), key, base);
  TNT_CUDA_CHECK_LAUNCH();
  return t;
}

}  // namespace tnt::cuda
