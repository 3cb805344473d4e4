// Dropout on CUDA: the mask is drawn from the same Philox stream as on the CPU
// (core/philox.hpp, compiled for the device), keep iff uniform4(key, base + i) >= rate with
// i the element's LOGICAL index (row-major in the logical shape), and kept values are
// multiplied by the same float scale, so y equals the CPU's bit for bit. The forward keeps
// its decisions, a byte each in its storage order, in SavedState::extra, and the backward
// reads them; a gradient in another memory format than the forward's output draws the mask
// again from (key, base). (Draws cost about 4 ps each on an H200: a Transformer-big step at
// 32k tokens has 2.6G of them.)
//
// A contiguous tensor's forward runs dropout_forward_contiguous_kernel: 8 consecutive
// elements a thread, their 2 or 3 Philox blocks drawn once. Everything else is a functor
// run by launch_elementwise (backend/cuda/vector_io.cuh), one block per element: a
// channels_last tensor (storage (N, H, W, C)) maps each storage index back to its logical
// (N, C, H, W) index before drawing, so its mask is the contiguous tensor's, element for
// element; that mapping divides in 32 bits when the element count allows, else in 64.
#include "layers/dropout_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/vector_io.cuh"
#include "core/philox.hpp"
#include "layers/dropout_keep.cuh"

#include <memory>

namespace tnt::cuda {

namespace {

struct DropoutSaved {
  uint64_t key = 0;
  uint64_t base = 0;  // counter of element 0
  float rate = 0.0f;
  float keep_scale = 1.0f;
  Shape shape;
  MemoryFormat format = MemoryFormat::contiguous;  // the forward output's
  Tensor mask;  // u8 (numel), 1 where kept, in the forward's storage order
};

// Logical index = storage index (contiguous tensors).
struct StorageOrder {
  __device__ uint64_t operator()(int64_t i) const { return static_cast<uint64_t>(i); }
};

// Storage index in (N, H, W, C) -> logical index in (N, C, H, W). I: uint32_t or uint64_t.
template <typename I>
struct ChannelsLastOrder {
  I c, h, w;
  __device__ uint64_t operator()(int64_t i) const {
    I s = static_cast<I>(i);
    const I ch = s % c;
    s /= c;
    const I x = s % w;
    s /= w;
    const I y = s % h;
    const I n = s / h;
    return ((static_cast<uint64_t>(n) * c + ch) * h + y) * w + x;
  }
};

// in: x forward, dy backward.
template <typename T, typename Order>
struct DropoutOp {
  uint64_t key, base;
  float rate, keep_scale;
  Order order;
  __device__ T operator()(int64_t i, T in) const {
    const bool keep = philox::uniform4(key, base + order(i)) >= rate;
    return keep ? from_float<T>(to_float(in) * keep_scale) : from_float<T>(0.0f);
  }
};

// The forward: y as DropoutOp, and each decision into mask (storage order).
template <typename T, typename Order>
struct DropoutMaskOp {
  uint64_t key, base;
  float rate, keep_scale;
  Order order;
  uint8_t* mask;
  __device__ T operator()(int64_t i, T in) const {
    const bool keep = philox::uniform4(key, base + order(i)) >= rate;
    mask[i] = keep ? 1 : 0;
    return keep ? from_float<T>(to_float(in) * keep_scale) : from_float<T>(0.0f);
  }
};

// The backward from the forward's mask: dx = dy * scale where kept.
template <typename T>
struct DropoutMaskedOp {
  float keep_scale;
  __device__ T operator()(int64_t, T in, uint8_t keep) const {
    return keep ? from_float<T>(to_float(in) * keep_scale) : from_float<T>(0.0f);
  }
};

// The forward of a contiguous tensor (logical index = storage index): a thread takes 8
// consecutive elements, whose counters lie in 2 or 3 Philox blocks (uniform4), each drawn
// once; 16-byte loads and stores where `vec` (x and y 16-byte aligned, T 2 bytes).
template <typename T>
__global__ void dropout_forward_contiguous_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                  uint8_t* __restrict__ mask, int64_t n, uint64_t key,
                                                  uint64_t base, float rate, float keep_scale, bool vec) {
  constexpr int kW = 8;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v * kW < n; v += threads) {
    const int64_t i0 = v * kW;
    const int count = n - i0 < kW ? static_cast<int>(n - i0) : kW;
    bool keep[kW];
    dropout_keep8(key, base + static_cast<uint64_t>(i0), count, rate, keep);
    bool stored = false;
    if constexpr (sizeof(T) == 2) {
      if (vec && count == kW) {  // 8 elements = 16 bytes
        uint4 in = *reinterpret_cast<const uint4*>(x + i0), out;
        const T* iv = reinterpret_cast<const T*>(&in);
        T* ov = reinterpret_cast<T*>(&out);
        uint2 m;
        uint8_t* mv = reinterpret_cast<uint8_t*>(&m);
#pragma unroll
        for (int e = 0; e < kW; ++e) {
          ov[e] = keep[e] ? from_float<T>(to_float(iv[e]) * keep_scale) : from_float<T>(0.0f);
          mv[e] = keep[e] ? 1 : 0;
        }
        *reinterpret_cast<uint4*>(y + i0) = out;
        *reinterpret_cast<uint2*>(mask + i0) = m;
        stored = true;
      }
    }
    if (!stored) {
      for (int e = 0; e < count; ++e) {
        y[i0 + e] = keep[e] ? from_float<T>(to_float(x[i0 + e]) * keep_scale) : from_float<T>(0.0f);
        mask[i0 + e] = keep[e] ? 1 : 0;
      }
    }
  }
}

// mask: where the forward writes its decisions, or null (draw only).
template <typename T, typename Order>
void launch_with(const DropoutSaved& s, const Tensor& in, const Tensor& out, int device, Order order,
                 uint8_t* mask) {
  if (mask != nullptr) {
    launch_elementwise(device, in.numel(), DropoutMaskOp<T, Order>{s.key, s.base, s.rate, s.keep_scale, order, mask},
                       static_cast<T*>(out.raw()), static_cast<const T*>(in.raw()));
  } else {
    launch_elementwise(device, in.numel(), DropoutOp<T, Order>{s.key, s.base, s.rate, s.keep_scale, order},
                       static_cast<T*>(out.raw()), static_cast<const T*>(in.raw()));
  }
}

void launch(const DropoutSaved& s, const Tensor& in, const Tensor& out, int device, uint8_t* mask = nullptr) {
  const int64_t n = in.numel();
  if (n == 0) return;
  TNT_CUDA_DISPATCH_FLOAT(in.dtype(), "Dropout", {
    if (!in.is_channels_last() && mask != nullptr) {
      const bool vec = reinterpret_cast<uintptr_t>(in.raw()) % 16 == 0 && reinterpret_cast<uintptr_t>(out.raw()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(mask) % 8 == 0;
      dropout_forward_contiguous_kernel<scalar_t><<<grid_for((n + 7) / 8, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(in.raw()), static_cast<scalar_t*>(out.raw()), mask, n, s.key, s.base, s.rate,
          s.keep_scale, vec);
      TNT_CUDA_CHECK_LAUNCH();
    } else if (!in.is_channels_last()) {
      launch_with<scalar_t>(s, in, out, device, StorageOrder{}, mask);
    } else if (n < (int64_t{1} << 32)) {
      const auto c = static_cast<uint32_t>(in.dim(1)), h = static_cast<uint32_t>(in.dim(2)),
                 w = static_cast<uint32_t>(in.dim(3));
      launch_with<scalar_t>(s, in, out, device, ChannelsLastOrder<uint32_t>{c, h, w}, mask);
    } else {
      const auto c = static_cast<uint64_t>(in.dim(1)), h = static_cast<uint64_t>(in.dim(2)),
                 w = static_cast<uint64_t>(in.dim(3));
      launch_with<scalar_t>(s, in, out, device, ChannelsLastOrder<uint64_t>{c, h, w}, mask);
    }
  });
}

// The chain Dropout -> Add (dropout_add_fusion.cpp), contiguous tensors: a thread takes 8
// consecutive elements as the forward above does, y = x + (keep ? round(h * scale) : 0),
// summed in float and rounded once (Add's kernel), and their 8 decisions as one byte of
// `bits` (bit e: element 8v + e). 16-byte accesses where `vec` (2-byte T, all three
// pointers 16-byte aligned).
template <typename T>
__device__ __forceinline__ T dropped(T in, bool keep, float keep_scale) {
  return keep ? from_float<T>(to_float(in) * keep_scale) : from_float<T>(0.0f);
}

template <typename T>
__global__ void dropout_add_forward_kernel(const T* __restrict__ h, const T* __restrict__ x, T* __restrict__ y,
                                           uint8_t* __restrict__ bits, int64_t n, uint64_t key, uint64_t base,
                                           float rate, float keep_scale, bool vec) {
  constexpr int kW = 8;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v * kW < n; v += threads) {
    const int64_t i0 = v * kW;
    const int count = n - i0 < kW ? static_cast<int>(n - i0) : kW;
    bool keep[kW];
    dropout_keep8(key, base + static_cast<uint64_t>(i0), count, rate, keep);
    unsigned byte = 0;
#pragma unroll
    for (int e = 0; e < kW; ++e) byte |= keep[e] ? 1u << e : 0u;
    bool stored = false;
    if constexpr (sizeof(T) == 2) {
      if (vec && count == kW) {
        const uint4 hin = *reinterpret_cast<const uint4*>(h + i0);
        const uint4 xin = *reinterpret_cast<const uint4*>(x + i0);
        uint4 out;
        const T* hv = reinterpret_cast<const T*>(&hin);
        const T* xv = reinterpret_cast<const T*>(&xin);
        T* ov = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int e = 0; e < kW; ++e) ov[e] = from_float<T>(to_float(xv[e]) + to_float(dropped(hv[e], keep[e], keep_scale)));
        *reinterpret_cast<uint4*>(y + i0) = out;
        stored = true;
      }
    }
    if (!stored) {
      for (int e = 0; e < count; ++e)
        y[i0 + e] = from_float<T>(to_float(x[i0 + e]) + to_float(dropped(h[i0 + e], keep[e], keep_scale)));
    }
    bits[v] = static_cast<uint8_t>(byte);
  }
}

// dh = dy * scale where the forward kept, 0 elsewhere (Dropout's backward from its mask).
template <typename T>
__global__ void dropout_add_backward_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ bits,
                                            T* __restrict__ dh, int64_t n, float keep_scale, bool vec) {
  constexpr int kW = 8;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v * kW < n; v += threads) {
    const int64_t i0 = v * kW;
    const int count = n - i0 < kW ? static_cast<int>(n - i0) : kW;
    const unsigned byte = bits[v];
    bool stored = false;
    if constexpr (sizeof(T) == 2) {
      if (vec && count == kW) {
        const uint4 in = *reinterpret_cast<const uint4*>(dy + i0);
        uint4 out;
        const T* iv = reinterpret_cast<const T*>(&in);
        T* ov = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int e = 0; e < kW; ++e) ov[e] = dropped(iv[e], ((byte >> e) & 1u) != 0, keep_scale);
        *reinterpret_cast<uint4*>(dh + i0) = out;
        stored = true;
      }
    }
    if (!stored) {
      for (int e = 0; e < count; ++e) dh[i0 + e] = dropped(dy[i0 + e], ((byte >> e) & 1u) != 0, keep_scale);
    }
  }
}

struct DropoutAddSaved {
  float keep_scale = 1.0f;
  Shape shape;
  DType dtype = DType::f32;
  Tensor bits;  // u8 ((n + 7) / 8): bit e of byte v = element 8v + e kept
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

std::vector<Tensor> dropout_forward(Dropout& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                    SavedState& saved) {
  const Tensor& x = inputs.at(0);
  int device = common_device({&x}, "Dropout");
  auto s = std::make_shared<DropoutSaved>();
  s->key = layer.mask_key(rc);
  s->base = Dropout::mask_counter(rc, x.shape());
  s->rate = static_cast<float>(layer.rate());
  s->keep_scale = static_cast<float>(1.0 / (1.0 - layer.rate()));
  s->shape = x.shape();
  s->format = x.memory_format();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format());
  s->mask = Tensor::empty({x.numel()}, DType::u8, x.device());
  launch(*s, x, y, device, static_cast<uint8_t*>(s->mask.raw()));
  saved.tensors.clear();
  saved.extra = s;
  return {y};
}

// The mask is a function of the logical index, so dy may come in either memory format; dx
// takes dy's.
std::vector<Tensor> dropout_backward(Dropout& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                     SavedState& saved) {
  (void)rc;  // the mask is the forward's, whatever rc says now
  TNT_CHECK(saved.extra, "Dropout '{}': backward without a forward", layer.name());
  const auto& s = *static_cast<const DropoutSaved*>(saved.extra.get());
  const Tensor& dy = grad_outputs.at(0);
  int device = common_device({&dy}, "Dropout backward");
  TNT_CHECK(shape_numel(s.shape) == dy.numel(), "Dropout '{}': gradient {} for output {}", layer.name(), dy.str(),
            shape_str(s.shape));
  TNT_CHECK(!dy.is_channels_last() || dy.shape() == s.shape,
            "Dropout '{}': channels_last gradient {} for output {}: shapes must match", layer.name(), dy.str(),
            shape_str(s.shape));
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device(), dy.memory_format());
  if (s.mask.defined() && dy.memory_format() == s.format && dy.numel() > 0) {
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "Dropout backward", {
      launch_elementwise(device, dy.numel(), DropoutMaskedOp<scalar_t>{s.keep_scale}, static_cast<scalar_t*>(dx.raw()),
                         static_cast<const scalar_t*>(dy.raw()), static_cast<const uint8_t*>(s.mask.raw()));
    });
  } else {
    launch(s, dy, dx, device);
  }
  return {dx};
}


bool dropout_add_forward(Dropout& layer, const Tensor& h, const Tensor& x, const RunContext& rc, SavedState& saved,
                         std::vector<Tensor>& outputs) {
  int device = common_device({&h, &x}, "Dropout -> Add");
  TNT_CHECK(h.shape() == x.shape() && h.dtype() == x.dtype() && !h.is_channels_last() && !x.is_channels_last(),
            "Dropout '{}' -> Add: inputs {} and {} must be contiguous, of one shape and dtype", layer.name(), h.str(),
            x.str());
  auto s = std::make_shared<DropoutAddSaved>();
  const uint64_t key = layer.mask_key(rc), base = Dropout::mask_counter(rc, h.shape());
  const auto rate = static_cast<float>(layer.rate());
  s->keep_scale = static_cast<float>(1.0 / (1.0 - layer.rate()));
  s->shape = h.shape();
  s->dtype = h.dtype();
  const int64_t n = h.numel();
  Tensor y = Tensor::empty(h.shape(), h.dtype(), h.device());
  s->bits = Tensor::empty({(n + 7) / 8}, DType::u8, h.device());
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(h.dtype(), "Dropout -> Add", {
      const bool vec = aligned16(h.raw()) && aligned16(x.raw()) && aligned16(y.raw());
      dropout_add_forward_kernel<scalar_t><<<grid_for((n + 7) / 8, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(h.raw()), static_cast<const scalar_t*>(x.raw()), static_cast<scalar_t*>(y.raw()),
          static_cast<uint8_t*>(s->bits.raw()), n, key, base, rate, s->keep_scale, vec);
      TNT_CUDA_CHECK_LAUNCH();
    });
  }
  saved.tensors.clear();
  saved.extra = s;
  outputs = {y};
  return true;
}

std::vector<Tensor> dropout_add_backward(Dropout& layer, const Tensor& dy, SavedState& saved) {
  TNT_CHECK(saved.extra, "Dropout '{}' -> Add: backward without a forward", layer.name());
  const auto& s = *static_cast<const DropoutAddSaved*>(saved.extra.get());
  int device = common_device({&dy}, "Dropout -> Add backward");
  TNT_CHECK(dy.shape() == s.shape && dy.dtype() == s.dtype && !dy.is_channels_last(),
            "Dropout '{}' -> Add: gradient {} for a contiguous output of shape {} in {}", layer.name(), dy.str(),
            shape_str(s.shape), dtype_name(s.dtype));
  const int64_t n = dy.numel();
  Tensor dh = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  if (n > 0) {
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "Dropout -> Add backward", {
      const bool vec = aligned16(dy.raw()) && aligned16(dh.raw());
      dropout_add_backward_kernel<scalar_t><<<grid_for((n + 7) / 8, kBlock, device), kBlock, 0, compute_stream(device)>>>(
          static_cast<const scalar_t*>(dy.raw()), static_cast<const uint8_t*>(s.bits.raw()),
          static_cast<scalar_t*>(dh.raw()), n, s.keep_scale, vec);
      TNT_CUDA_CHECK_LAUNCH();
    });
  }
  return {dh, dy};
}

}  // namespace tnt::cuda
