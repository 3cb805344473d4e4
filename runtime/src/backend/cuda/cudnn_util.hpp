// Owning wrappers of the cuDNN descriptors the engines use, and the dtype mapping. The
// legacy (non-graph) cuDNN API is enough for our layers and still ships in cuDNN 9.
#pragma once

#include "backend/cuda/cuda_check.hpp"
#include "tarantella/dtype.hpp"
#include "tarantella/tensor.hpp"

#include <cudnn.h>

#include <climits>
#include <cstdint>

namespace tnt::cuda {

inline cudnnDataType_t cudnn_dtype(DType d, const char* what) {
  switch (d) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: TNT_THROW("{}: dtype {} is not supported by the cuDNN engine (f32, f16, bf16)", what, dtype_name(d));
  }
}

// cuDNN's legacy descriptors take int dimensions.
inline int cudnn_dim(int64_t v, const char* what) {
  TNT_CHECK(v >= 0 && v <= INT_MAX, "{}: dimension {} is too large for cuDNN", what, v);
  return static_cast<int>(v);
}

// A move-only owner of one cuDNN descriptor type.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() { TNT_CUDNN_CHECK(Create(&desc_)); }
  ~CudnnDescriptor() {
    if (desc_) Destroy(desc_);
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  CudnnDescriptor(CudnnDescriptor&& o) noexcept : desc_(o.desc_) { o.desc_ = nullptr; }
  CudnnDescriptor& operator=(CudnnDescriptor&& o) noexcept {
    std::swap(desc_, o.desc_);
    return *this;
  }
  T get() const { return desc_; }
  operator T() const { return desc_; }

 private:
  T desc_ = nullptr;
};

using TensorDescriptor =
    CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor =
    CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor = CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                              cudnnDestroyConvolutionDescriptor>;
using ActivationDescriptor = CudnnDescriptor<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor,
                                             cudnnDestroyActivationDescriptor>;
using PoolingDescriptor =
    CudnnDescriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

// A packed NCHW tensor descriptor.
inline void set_nchw(const TensorDescriptor& desc, DType dtype, int64_t n, int64_t c, int64_t h, int64_t w,
                     const char* what) {
  TNT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, cudnn_dtype(dtype, what), cudnn_dim(n, what),
                                             cudnn_dim(c, what), cudnn_dim(h, what), cudnn_dim(w, what)));
}

// A packed 4-D tensor descriptor of the logical shape (N, C, H, W) stored in `format`
// (contiguous: NCHW; channels_last: NHWC). cuDNN takes the dimensions in NCHW order for both.
inline void set_4d(const TensorDescriptor& desc, DType dtype, MemoryFormat format, int64_t n, int64_t c, int64_t h,
                   int64_t w, const char* what) {
  const cudnnTensorFormat_t f = format == MemoryFormat::channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  TNT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc, f, cudnn_dtype(dtype, what), cudnn_dim(n, what),
                                             cudnn_dim(c, what), cudnn_dim(h, what), cudnn_dim(w, what)));
}

// A filter (K, C, R, S) stored in `format`: contiguous is KCRS (PyTorch's (F, C, k, k)),
// channels_last is KRSC (cuDNN's NHWC filter format). Dimensions in KCRS order for both.
inline void set_filter(const FilterDescriptor& desc, DType dtype, MemoryFormat format, int64_t k, int64_t c,
                       int64_t r, int64_t s, const char* what) {
  const cudnnTensorFormat_t f = format == MemoryFormat::channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  TNT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(desc, cudnn_dtype(dtype, what), f, cudnn_dim(k, what),
                                             cudnn_dim(c, what), cudnn_dim(r, what), cudnn_dim(s, what)));
}

// The scaling factors of cuDNN calls: float for float/half/bf16 data (double only for
// double data, which the engines do not use).
struct CudnnScalars {
  static const float* one() {
    static const float v = 1.0f;
    return &v;
  }
  static const float* zero() {
    static const float v = 0.0f;
    return &v;
  }
};

}  // namespace tnt::cuda
