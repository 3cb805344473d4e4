// PositionEncoding on CUDA: one element-wise pass adding the cached f32 table.
#include "layers/position_encoding_cuda.hpp"

#include "backend/cuda/device_common.cuh"

namespace tnt::cuda {

namespace {

template <typename T>
__global__ void add_table_kernel(const T* __restrict__ x,        // (B, T, D)
                                 const float* __restrict__ table,  // (T, D)
                                 T* __restrict__ y,                // (B, T, D)
                                 int64_t n, int64_t td) {
  TNT_KERNEL_LOOP(i, n) { y[i] = from_float<T>(to_float(x[i]) + table[i % td]); }
}

}  // namespace

std::vector<Tensor> position_encoding_forward(PositionEncoding& layer, const std::vector<Tensor>& inputs,
                                              const RunContext& rc, SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);  // (B, T, D)
  const Tensor& table = layer.table(x.dim(1), x.dim(2), x.device());
  int device = common_device({&x, &table}, "PositionEncoding");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(x.dtype(), "PositionEncoding", {
      add_table_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(x.raw()), static_cast<const float*>(table.raw()),
          static_cast<scalar_t*>(y.raw()), n, x.dim(1) * x.dim(2));
    });
    TNT_CUDA_CHECK_LAUNCH();
  }
  saved.tensors.clear();
  return {y};
}

}  // namespace tnt::cuda
