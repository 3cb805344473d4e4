// Channel padding for the first convolution of a channels_last network (layout.hpp): images
// of 1-3 channels widened with zero channels to 4 or 8, and back for the gradients.
//
// One thread per pixel (n, h, w): it reads the pixel's C values from the source, wherever
// its format puts them (a warp's threads walk neighbouring pixels, so in a contiguous
// source each channel plane is read coalesced), and writes the padded pixel's Cp values as
// one aligned access of Cp elements (8-32 bytes). The way back reads a padded pixel the same
// way and writes its first C values. Both formats' offsets are linear in (n, c, hw):
// contiguous (C*HW, HW, 1), channels_last (HW*C, 1, C), so one kernel serves both, and a
// filter (F, C, k, k) is the same problem with F "images" of k*k pixels.
#include "backend/cuda/layout.hpp"

#include "backend/cuda/device_common.cuh"

#include <cstdint>
#include <type_traits>

namespace tnt::cuda {

namespace {

// The Cp elements of a padded pixel; its offset p * Cp * sizeof(T) keeps this alignment
// (the allocator's blocks are 512-byte aligned).
template <typename T, int CP>
struct alignas(sizeof(T) * CP >= 16 ? 16 : sizeof(T) * CP) Pixel {
  T v[CP];
};

// A 4-D tensor's element offsets along n, c and the flattened (h, w).
struct Strides {
  int64_t n, c, hw;
};

Strides strides_of(const Tensor& t) {
  const int64_t c = t.dim(1), hw = t.dim(2) * t.dim(3);
  return t.is_channels_last() ? Strides{hw * c, 1, c} : Strides{c * hw, hw, 1};
}

template <typename T, int CP>
__global__ void pad_channels_kernel(const T* __restrict__ src, Pixel<T, CP>* __restrict__ dst, int64_t pixels,
                                    int64_t hw, int channels, Strides s) {
  TNT_KERNEL_LOOP(p, pixels) {
    const int64_t n = p / hw, q = p - n * hw;
    const T* in = src + n * s.n + q * s.hw;
    Pixel<T, CP> px;
#pragma unroll
    for (int j = 0; j < CP; ++j) px.v[j] = j < channels ? in[j * s.c] : from_float<T>(0.0f);
    dst[p] = px;
  }
}

struct Store {
  template <typename T>
  __device__ void operator()(T* d, T v) const {
    *d = v;
  }
};

struct AddAsFloat {
  template <typename T>
  __device__ void operator()(float* d, T v) const {
    *d += to_float(v);
  }
};

template <typename T, typename D, int CP, typename Op>
__global__ void unpad_channels_kernel(const Pixel<T, CP>* __restrict__ src, D* __restrict__ dst, int64_t pixels,
                                      int64_t hw, int channels, Strides s, Op op) {
  TNT_KERNEL_LOOP(p, pixels) {
    const int64_t n = p / hw, q = p - n * hw;
    const Pixel<T, CP> px = src[p];
    D* out = dst + n * s.n + q * s.hw;
#pragma unroll
    for (int j = 0; j < CP; ++j) {
      if (j < channels) op(out + j * s.c, px.v[j]);
    }
  }
}

// Runs f.template operator()<CP>() for the padded channel count cp (4 or 8).
template <typename F>
void with_cp(int64_t cp, const char* what, F&& f) {
  if (cp == 4) {
    f.template operator()<4>();
  } else if (cp == 8) {
    f.template operator()<8>();
  } else {
    TNT_THROW("{}: {} channels; only 4 or 8 are supported", what, cp);
  }
}

void check_pair(const Tensor& padded, const Tensor& plain, const char* what) {
  TNT_CHECK(padded.ndim() == 4 && plain.ndim() == 4 && padded.is_channels_last() && padded.dim(0) == plain.dim(0) &&
                padded.dim(2) == plain.dim(2) && padded.dim(3) == plain.dim(3) && plain.dim(1) <= padded.dim(1),
            "{}: {} and {} are not a channels_last padded tensor and its unpadded shape", what, padded.str(),
            plain.str());
}

}  // namespace

Tensor pad_channels(const Tensor& src, int64_t cp) {
  TNT_CHECK(src.ndim() == 4 && src.dim(1) <= cp, "pad_channels: {} to {} channels", src.str(), cp);
  Tensor dst = Tensor::empty({src.dim(0), cp, src.dim(2), src.dim(3)}, src.dtype(), src.device(),
                             MemoryFormat::channels_last);
  const int64_t pixels = src.dim(0) * src.dim(2) * src.dim(3);
  if (pixels == 0) return dst;
  const int device = common_device({&src}, "pad_channels");
  const int64_t hw = src.dim(2) * src.dim(3);
  const int channels = static_cast<int>(src.dim(1));
  const Strides s = strides_of(src);
  TNT_CUDA_DISPATCH_FLOAT(src.dtype(), "pad_channels", {
    with_cp(cp, "pad_channels", [&]<int CP>() {
      pad_channels_kernel<scalar_t, CP><<<grid_for(pixels, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(src.raw()), static_cast<Pixel<scalar_t, CP>*>(dst.raw()), pixels, hw,
          channels, s);
    });
  });
  TNT_CUDA_CHECK_LAUNCH();
  return dst;
}

namespace {

// The way back for both callers (which checked the dtypes): the first C channels of each
// padded pixel of src into dst by op, dst of src's element type for Store, float for the sum.
template <typename Op>
void launch_unpad(const Tensor& src, const Tensor& dst, Op op, const char* what) {
  const int64_t pixels = dst.dim(0) * dst.dim(2) * dst.dim(3);
  if (pixels == 0) return;
  const int device = common_device({&src, &dst}, what);
  const int64_t hw = dst.dim(2) * dst.dim(3);
  const Strides s = strides_of(dst);
  TNT_CUDA_DISPATCH_FLOAT(src.dtype(), what, {
    using dst_t = std::conditional_t<std::is_same_v<Op, AddAsFloat>, float, scalar_t>;
    with_cp(src.dim(1), what, [&]<int CP>() {
      unpad_channels_kernel<scalar_t, dst_t, CP><<<grid_for(pixels, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const Pixel<scalar_t, CP>*>(src.raw()), static_cast<dst_t*>(dst.raw()), pixels, hw,
          static_cast<int>(dst.dim(1)), s, op);
    });
  });
  TNT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void unpad_channels(const Tensor& src, const Tensor& dst) {
  check_pair(src, dst, "unpad_channels");
  TNT_CHECK(src.dtype() == dst.dtype(), "unpad_channels: {} into {}", src.str(), dst.str());
  launch_unpad(src, dst, Store{}, "unpad_channels");
}

void accumulate_unpadded_as_float(const Tensor& src, const Tensor& dst) {
  check_pair(src, dst, "accumulate_unpadded_as_float");
  TNT_CHECK(dst.dtype() == DType::f32, "accumulate_unpadded_as_float: {} into {} (needs f32)", src.str(), dst.str());
  launch_unpad(src, dst, AddAsFloat{}, "accumulate_unpadded_as_float");
}

}  // namespace tnt::cuda
