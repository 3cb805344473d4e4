// Dense on CUDA: cuBLAS products in FP32 compute (no TF32), bias by our element-wise kernel.
//
// cuBLAS is column-major; a row-major (R, C) matrix is the column-major (C, R) matrix, its
// transpose. So the row-major product Y = X W^T is computed as the column-major
// Y^T = W X^T, and likewise for the two gradients:
//   forward   y^T  (U, R)  = W^T(T) (U, in) . x^T (in, R)      gemm(T, N, U, R, in)
//   dx        dx^T (in, R) = W^T   (in, U) . dy^T (U, R)       gemm(N, N, in, R, U)
//   dW       dW^T (in, U) += x^T   (in, R) . dy   (R, U)       gemm(N, T, in, U, R), beta 1
//
// Mixed precision: with an f16/bf16 input the products take the weight's compute copy
// (compute_value) and run on tensor cores with f32 accumulation; y and dx are in the input's
// dtype. dW stays f32: cublasGemmEx takes half A and B with an f32 C, so the weight gradient
// is accumulated (beta 1) straight into the f32 master gradient, never rounded to half. The
// bias is f32 and is added in float to the product, which cuBLAS has already rounded to
// half, so the output is rounded twice (about 1u more than one rounding).
//
// With an activation or a dropout (DenseOptions; dense_epilogue.hpp) bias, ReLU and dropout
// are one pass over the product (dense_epilogue_kernel), each step rounded to the dtype as
// the separate layers round it (AddBias, activation_cuda.cu's ReLU, dropout_cuda.cu), so
// the output equals Dense -> ReLU -> Dropout bit for bit; the backward's first pass turns
// dy into the product's gradient from the output alone (y > 0 exactly where the ReLU was
// positive and the element kept) or, without ReLU, from the mask drawn again.
#include "layers/dense_cuda.hpp"

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/reduce.cuh"
#include "backend/cuda/vector_io.cuh"
#include "core/philox.hpp"
#include "layers/dropout_keep.cuh"
#include "layers/dense_epilogue.hpp"
#include "layers/embedding_projection_cuda.hpp"
#include "layers/projection_pad.hpp"

#include <climits>
#include <memory>

namespace tnt::cuda {

namespace {

cudaDataType_t blas_dtype(DType d) {
  switch (d) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: TNT_THROW("Dense: dtype {} is not supported by the cuBLAS engine (f32, f16, bf16)", dtype_name(d));
  }
}

int blas_dim(int64_t v) {
  TNT_CHECK(v >= 0 && v <= INT_MAX, "Dense: dimension {} is too large for cuBLAS", v);
  return static_cast<int>(v);
}

// Column-major C (m, n) = alpha op(A) op(B) + beta C with FP32 accumulation; A and B of
// dtype ab, C of dtype c (equal, or half A/B with f32 C for the mixed weight gradient).
void gemm(int device, DType ab, DType c_dtype, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
          int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc) {
  const float alpha = 1.0f;
  const cudaDataType_t t = blas_dtype(ab);
  TNT_CUBLAS_CHECK(cublas_api().gemm_ex(cublas_handle(device), ta, tb, blas_dim(m), blas_dim(n), blas_dim(k), &alpha,
                                        a, t, blas_dim(lda), b, t, blas_dim(ldb), &beta, c, blas_dtype(c_dtype),
                                        blas_dim(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// y (R, U) += bias (U, f32 whatever y's dtype), in place through launch_elementwise (16-byte
// accesses where y allows). The column is i % units, in 32 bits where the element count
// allows (I = uint32_t: a 64-bit remainder per element costs more than the element's bytes).
template <typename T, typename I>
struct AddBias {
  const float* bias;
  I units;
  __device__ T operator()(int64_t i, T y) const {
    return from_float<T>(to_float(y) + bias[static_cast<I>(i) % units]);
  }
};

// y (n, viewed as rows of `units`) in place: v = round(y + bias[col]) (no bias: y); ReLU:
// v > 0 ? v : 0; dropout: keep ? round(v * keep_scale) : 0 with keep = uniform4(key, base +
// i) >= rate. A thread takes 8 consecutive elements, their 2 or 3 Philox blocks drawn once
// (dropout_keep8); `vec`: y aligned for one 8-element access.
template <typename T>
__global__ void dense_epilogue_kernel(T* __restrict__ y, int64_t n, const float* __restrict__ bias, int64_t units,
                                      bool relu, bool dropout, uint64_t key, uint64_t base, float rate,
                                      float keep_scale, bool vec) {
  constexpr int kW = 8;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v * kW < n; v += threads) {
    const int64_t i0 = v * kW;
    const int count = n - i0 < kW ? static_cast<int>(n - i0) : kW;
    bool keep[kW];
#pragma unroll
    for (int e = 0; e < kW; ++e) keep[e] = true;
    if (dropout) dropout_keep8(key, base + static_cast<uint64_t>(i0), count, rate, keep);
    T val[kW];
    const bool whole = vec && count == kW;
    if (whole) {
      const Pack<T, kW> p = load_pack<kW>(y + i0);
#pragma unroll
      for (int e = 0; e < kW; ++e) val[e] = p.v[e];
    } else {
#pragma unroll
      for (int e = 0; e < kW; ++e) val[e] = e < count ? y[i0 + e] : from_float<T>(0.0f);
    }
    int64_t col = bias != nullptr ? i0 % units : 0;
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      T t = val[e];
      if (bias != nullptr) {
        t = from_float<T>(to_float(t) + bias[col]);
        if (++col == units) col = 0;
      }
      if (relu) t = to_float(t) > 0.0f ? t : from_float<T>(0.0f);
      if (dropout) t = keep[e] ? from_float<T>(to_float(t) * keep_scale) : from_float<T>(0.0f);
      val[e] = t;
    }
    if (whole) {
      Pack<T, kW> p;
#pragma unroll
      for (int e = 0; e < kW; ++e) p.v[e] = val[e];
      store_pack<kW>(y + i0, p);
    } else {
      for (int e = 0; e < count; ++e) y[i0 + e] = val[e];
    }
  }
}

// The product's gradient from dy and the output y: ReLU (with or without dropout).
template <typename T>
struct EpilogueReluGrad {
  bool dropout;
  float keep_scale;
  __device__ T operator()(int64_t, T dy, T y) const {
    if (!(to_float(y) > 0.0f)) return from_float<T>(0.0f);
    return dropout ? from_float<T>(to_float(dy) * keep_scale) : dy;
  }
};

// EpilogueReluGrad over a (rows, units) matrix of a 2-byte dtype, units % 8 == 0, 16-byte
// aligned, with the bias gradient's column sums of dz in the same pass (column_sum would read
// dz again: at Transformer-big's 32k x 4096 feed-forward rows, 256 MB a block). Block (x, y):
// 8 adjacent columns a thread (256 threads: 2,048 columns), the rows of stripe y one after
// another; each thread writes its 8 columns' sums (of dz as rounded and stored, what
// column_sum read) over the stripe to partial[y][column], and column_sum adds the stripes
// in order. Stripes depend on the shape alone, so the bits do too.
constexpr int kReluBiasCols = 8;
constexpr int64_t kReluBiasStripeRows = 64;  // rows per stripe (at most 512 stripes)

int64_t relu_bias_stripe_rows(int64_t rows) { return std::max<int64_t>(kReluBiasStripeRows, (rows + 511) / 512); }

template <typename T>
__global__ void epilogue_relu_grad_bias_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dz,
                                               float* __restrict__ partial, int64_t rows, int64_t units,
                                               int64_t stripe_rows, bool dropout, float keep_scale) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kReluBiasCols;
  if (c0 >= units) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * stripe_rows;
  const int64_t r1 = r0 + stripe_rows < rows ? r0 + stripe_rows : rows;
  const EpilogueReluGrad<T> grad{dropout, keep_scale};
  float acc[kReluBiasCols];
#pragma unroll
  for (int e = 0; e < kReluBiasCols; ++e) acc[e] = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t at = r * units + c0;
    const Pack<T, kReluBiasCols> g = load_pack<kReluBiasCols>(dy + at);
    const Pack<T, kReluBiasCols> v = load_pack<kReluBiasCols>(y + at);
    Pack<T, kReluBiasCols> out;
#pragma unroll
    for (int e = 0; e < kReluBiasCols; ++e) {
      out.v[e] = grad(0, g.v[e], v.v[e]);
      acc[e] += to_float(out.v[e]);
    }
    store_pack<kReluBiasCols>(dz + at, out);
  }
  float* dst = partial + static_cast<int64_t>(blockIdx.y) * units + c0;
#pragma unroll
  for (int e = 0; e < kReluBiasCols; ++e) dst[e] = acc[e];
}

// The product's gradient from dy and the mask drawn again: dropout without an activation.
template <typename T>
struct EpilogueDropoutGrad {
  uint64_t key, base;
  float rate, keep_scale;
  __device__ T operator()(int64_t i, T dy) const {
    const bool keep = philox::uniform4(key, base + static_cast<uint64_t>(i)) >= rate;
    return keep ? from_float<T>(to_float(dy) * keep_scale) : from_float<T>(0.0f);
  }
};

}  // namespace

std::vector<Tensor> dense_forward(Dense& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                  SavedState& saved) {
  const Tensor& x = inputs.at(0);  // (..., in)
  // The f32 weight itself for an f32 input, else the network's half copy of it.
  const Tensor& w = compute_value(layer.weight(), x.dtype(), layer.name());  // (U, in)
  Parameter* bias = layer.bias();                                              // (U), f32
  int device = common_device({&x, &w}, "Dense");
  const int64_t in = layer.in_features(), units = layer.units();
  TNT_CHECK(x.ndim() >= 1 && x.dim(-1) == in, "Dense '{}': input {} does not end in {} features", layer.name(),
            x.str(), in);
  const int64_t rows = in > 0 ? x.numel() / in : 0;
  Shape out_shape = x.shape();
  out_shape.back() = units;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());  // (..., U)
  const auto epi = tnt::detail::DenseEpilogue::make(layer, rc, out_shape);
  if (rows > 0 && units > 0) {
    if (in == 0) {
      fill(y, 0.0);
    } else {
      // Units off 8 in f16/bf16: the product on padded rows where that pays (TNT_GEMM_PAD,
      // embedding_projection_cuda.hpp), then the bias and epilogue as below.
      const bool padded = projection_pad::applies(x.dtype(), units) &&
                          projection_path(fmt::format("Dense '{}'", layer.name()), x.dtype(), rows, units, in,
                                          x.raw(), w.raw(), y.raw(), device)
                              .forward_padded;
      if (padded) {
        projection_forward(true, device, x.dtype(), rows, units, in, x.raw(), w.raw(), y.raw());
      } else {
        gemm(device, x.dtype(), x.dtype(), CUBLAS_OP_T, CUBLAS_OP_N, units, rows, in, w.raw(), in, x.raw(), in, 0.0f,
             y.raw(), units);
      }
    }
    if (bias) {
      TNT_CHECK(bias->value.dtype() == DType::f32, "Dense '{}': the CUDA engine needs an f32 bias, got {}",
                layer.name(), bias->value.str());
    }
    if (epi.any()) {
      const int64_t n = y.numel();
      const float* b = bias ? static_cast<const float*>(bias->value.raw()) : nullptr;
      TNT_CUDA_DISPATCH_FLOAT(y.dtype(), "Dense", {
        auto* out = static_cast<scalar_t*>(y.raw());
        const bool vec = reinterpret_cast<uintptr_t>(out) % (8 * sizeof(scalar_t)) == 0;
        dense_epilogue_kernel<scalar_t><<<grid_for((n + 7) / 8, kBlock, device), kBlock, 0, compute_stream(device)>>>(
            out, n, b, units, epi.relu, epi.dropout, epi.key, epi.base, epi.rate, epi.keep_scale, vec);
        TNT_CUDA_CHECK_LAUNCH();
      });
    } else if (bias) {
      const int64_t n = y.numel();
      const auto* b = static_cast<const float*>(bias->value.raw());
      TNT_CUDA_DISPATCH_FLOAT(y.dtype(), "Dense", {
        auto* out = static_cast<scalar_t*>(y.raw());
        if (n < (int64_t{1} << 32)) {
          launch_elementwise(device, n, AddBias<scalar_t, uint32_t>{b, static_cast<uint32_t>(units)}, out,
                             static_cast<const scalar_t*>(out));
        } else {
          launch_elementwise(device, n, AddBias<scalar_t, uint64_t>{b, static_cast<uint64_t>(units)}, out,
                             static_cast<const scalar_t*>(out));
        }
      });
    }
  }
  saved.tensors = {x};
  saved.extra.reset();
  if (epi.any()) {
    saved.tensors.push_back(y);
    saved.extra = std::make_shared<tnt::detail::DenseEpilogue>(epi);
  }
  return {y};
}

namespace {

// dense_backward's work; sum defined: the input gradient is added to it (beta = 1).
Tensor backward_into(Dense& layer, const std::vector<Tensor>& grad_outputs, SavedState& saved, const Tensor& sum) {
  TNT_CHECK(!saved.tensors.empty(), "Dense '{}': backward without a forward", layer.name());
  const Tensor& x = saved.tensors[0];                                          // (..., in)
  Tensor dy = grad_outputs.at(0);                                              // (..., U)
  bool bias_done = false;  // the bias gradient was summed with the epilogue's gradient
  if (saved.extra) {  // the activation's and the dropout's gradient first (see the forward)
    const auto& epi = *static_cast<const tnt::detail::DenseEpilogue*>(saved.extra.get());
    const Tensor& y = saved.tensors.at(1);
    TNT_CHECK(dy.numel() == y.numel() && dy.dtype() == y.dtype(), "Dense '{}': gradient {} for output {}",
              layer.name(), dy.str(), y.str());
    Tensor dz = Tensor::empty(y.shape(), y.dtype(), y.device());
    const int dz_device = common_device({&dy, &y}, "Dense backward");
    const int64_t units = layer.units(), n = y.numel(), rows = units > 0 ? n / units : 0;
    Parameter* bias = layer.bias();
    const bool aligned = reinterpret_cast<uintptr_t>(dy.raw()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(y.raw()) % 16 == 0 && reinterpret_cast<uintptr_t>(dz.raw()) % 16 == 0;
    if (epi.relu && bias && bias->grad.defined() && bias->grad.dtype() == DType::f32 && is_half(y.dtype()) &&
        units % kReluBiasCols == 0 && rows > 0 && aligned) {
      // dz and the bias gradient in one pass over dy and y (epilogue_relu_grad_bias_kernel).
      const int64_t stripe_rows = relu_bias_stripe_rows(rows);
      const int64_t stripes = (rows + stripe_rows - 1) / stripe_rows;
      Workspace partial(static_cast<size_t>(stripes * units) * sizeof(float), dz_device);
      const int64_t groups = units / kReluBiasCols;
      const dim3 grid(static_cast<unsigned>((groups + kBlock - 1) / kBlock), static_cast<unsigned>(stripes));
      auto launch = [&](auto type_tag) {
        using scalar_t = decltype(type_tag);
        epilogue_relu_grad_bias_kernel<scalar_t><<<grid, kBlock, 0, compute_stream(dz_device)>>>(
            static_cast<const scalar_t*>(dy.raw()), static_cast<const scalar_t*>(y.raw()),
            static_cast<scalar_t*>(dz.raw()), partial.as<float>(), rows, units, stripe_rows, epi.dropout,
            epi.keep_scale);
        TNT_CUDA_CHECK_LAUNCH();
      };
      if (y.dtype() == DType::bf16) {
        launch(__nv_bfloat16{});
      } else {
        launch(__half{});
      }
      column_sum(stripes, units, LoadPartial{partial.as<float>()}, 1.0f, static_cast<float*>(bias->grad.raw()),
                 dz_device);
      bias_done = true;
    } else {
      TNT_CUDA_DISPATCH_FLOAT(y.dtype(), "Dense backward", {
        auto* out = static_cast<scalar_t*>(dz.raw());
        const auto* g = static_cast<const scalar_t*>(dy.raw());
        if (epi.relu) {
          launch_elementwise(dz_device, y.numel(), EpilogueReluGrad<scalar_t>{epi.dropout, epi.keep_scale}, out, g,
                             static_cast<const scalar_t*>(y.raw()));
        } else {
          launch_elementwise(dz_device, y.numel(),
                             EpilogueDropoutGrad<scalar_t>{epi.key, epi.base, epi.rate, epi.keep_scale}, out, g);
        }
      });
    }
    dy = dz;
  }
  const Tensor& w = compute_value(layer.weight(), x.dtype(), layer.name());  // (U, in)
  const Tensor& dw = layer.weight().grad;                                      // (U, in), f32
  Parameter* bias = layer.bias();
  int device = common_device({&x, &dy, &w}, "Dense backward");
  const int64_t in = layer.in_features(), units = layer.units();
  const int64_t rows = in > 0 ? x.numel() / in : 0;
  TNT_CHECK(dy.numel() == rows * units && dy.dtype() == x.dtype(), "Dense '{}': gradient {} for output of {} rows x {}",
            layer.name(), dy.str(), rows, units);
  // The first layer of a network may skip its input gradient (SavedState::need_input_grads).
  const bool add = sum.defined();
  if (add) {
    TNT_CHECK(sum.shape() == x.shape() && sum.dtype() == x.dtype() && sum.device() == x.device() &&
                  !sum.is_channels_last(),
              "Dense '{}': an input gradient {} to add to for input {}", layer.name(), sum.str(), x.str());
  }
  Tensor dx = add ? sum : saved.need_input_grads ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
  const bool write_dx = saved.need_input_grads && dx.defined();
  if (rows == 0 || in == 0) return dx;
  if (units == 0) {
    if (write_dx && !add) fill(dx, 0.0);
    return dx;
  }
  // The padded products (forward's note) where the forward's trial chose them; they write dx
  // (not add to it) and add dW into an f32 gradient.
  if (!add && dw.defined() && dw.dtype() == DType::f32 && projection_pad::applies(x.dtype(), units) &&
      projection_path_known(x.dtype(), rows, units, in, device).backward_padded) {
    projection_backward(true, device, x.dtype(), rows, units, in, dy.raw(), x.raw(), w.raw(),
                        write_dx ? dx.raw() : nullptr, static_cast<float*>(dw.raw()));
  } else {
    if (write_dx) {
      gemm(device, x.dtype(), x.dtype(), CUBLAS_OP_N, CUBLAS_OP_N, in, rows, units, w.raw(), in, dy.raw(), units,
           add ? 1.0f : 0.0f, dx.raw(), in);
    }
    if (dw.defined()) {
      TNT_CHECK(dw.dtype() == DType::f32 || dw.dtype() == x.dtype(), "Dense '{}': weight gradient {} for input {}",
                layer.name(), dw.str(), x.str());
      gemm(device, x.dtype(), dw.dtype(), CUBLAS_OP_N, CUBLAS_OP_T, in, units, rows, x.raw(), in, dy.raw(), units,
           1.0f, dw.raw(), in);
    }
  }
  if (bias && bias->grad.defined() && !bias_done) {
    TNT_CHECK(bias->grad.dtype() == DType::f32, "Dense '{}': bias gradient must be f32, got {}", layer.name(),
              bias->grad.str());
    TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "Dense", {
      channel_sum(rows, units, 1, LoadAsFloat<scalar_t>{static_cast<const scalar_t*>(dy.raw())}, 1.0f,
                  static_cast<float*>(bias->grad.raw()), device);
    });
  }
  return dx;
}

}  // namespace

std::vector<Tensor> dense_backward(Dense& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                   SavedState& saved) {
  (void)rc;
  return {backward_into(layer, grad_outputs, saved, Tensor())};
}

Tensor dense_backward_add(Dense& layer, const Tensor& dy, const RunContext& rc, SavedState& saved, const Tensor& sum) {
  (void)rc;
  return backward_into(layer, {dy}, saved, sum);
}

}  // namespace tnt::cuda
