// Memory-format conversion: per image, a (C, HW) <-> (HW, C) transpose.
#include "backend/cuda/layout.hpp"

#include "backend/cuda/device_common.cuh"

#include <cstdint>

namespace tnt::cuda {

namespace {

// One thread per element of dst; elements are moved as raw words of type W.
template <typename W>
__global__ void convert_format_kernel(const W* __restrict__ src, W* __restrict__ dst, int64_t total, int64_t c,
                                      int64_t hw, bool to_channels_last) {
  TNT_KERNEL_LOOP(i, total) {
    const int64_t per_image = c * hw;
    const int64_t image = i / per_image, r = i - image * per_image;
    int64_t from;
    if (to_channels_last) {  // dst index r = p * c + ch
      const int64_t p = r / c, ch = r - p * c;
      from = ch * hw + p;
    } else {  // dst index r = ch * hw + p
      const int64_t ch = r / hw, p = r - ch * hw;
      from = p * c + ch;
    }
    dst[i] = src[image * per_image + from];
  }
}

template <typename W>
void launch(const Tensor& src, const Tensor& dst, int device) {
  const int64_t total = src.numel();
  convert_format_kernel<W><<<grid_for(total, kBlock, device), kBlock, 0, compute_stream(device)>>>(
      static_cast<const W*>(src.raw()), static_cast<W*>(dst.raw()), total, src.dim(1), src.dim(2) * src.dim(3),
      dst.is_channels_last());
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void convert_memory_format(const Tensor& src, const Tensor& dst) {
  TNT_CHECK(src.ndim() == 4 && src.shape() == dst.shape() && src.dtype() == dst.dtype() &&
                src.device() == dst.device() && src.memory_format() != dst.memory_format(),
            "convert_memory_format: {} into {}", src.str(), dst.str());
  if (src.numel() == 0) return;
  const int device = src.device().index;
  switch (dtype_size(src.dtype())) {
    case 1: launch<uint8_t>(src, dst, device); break;
    case 2: launch<uint16_t>(src, dst, device); break;
    case 4: launch<uint32_t>(src, dst, device); break;
    case 8: launch<uint64_t>(src, dst, device); break;
    default: TNT_THROW("convert_memory_format: unsupported element size {}", dtype_size(src.dtype()));
  }
}

}  // namespace tnt::cuda
