// See gemm_cuda.hpp.
#include "layers/gemm_cuda.hpp"

#include <algorithm>
#include <climits>

namespace tnt::cuda {

namespace {

cudaDataType_t blas_type(DType d) {
  switch (d) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: TNT_THROW("gemm: dtype {} is not supported by cuBLAS here (f32, f16, bf16)", dtype_name(d));
  }
}

int blas_int(int64_t v) {
  TNT_CHECK(v >= 0 && v <= INT_MAX, "gemm: dimension {} is too large for cuBLAS", v);
  return static_cast<int>(v);
}

}  // namespace

void gemm_rm(int device, DType ab, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const void* a, int64_t stride_a, const void* b, int64_t stride_b, float beta, void* c,
             int64_t stride_c, int64_t batch) {
  if (batch == 0 || m == 0 || n == 0) return;
  const cudaDataType_t t = blas_type(ab);
  // Row-major leading dimensions (stored row lengths). k may be 0 (attention over an empty
  // memory: C = beta C), and cuBLAS refuses a leading dimension below 1.
  const int64_t lda = std::max<int64_t>(1, trans_a ? m : k), ldb = std::max<int64_t>(1, trans_b ? k : n), ldc = n;
  // Column-major C^T (N, M) = op(B)^T (N, K) op(A)^T (K, M).
  TNT_CUBLAS_CHECK(cublas_api().gemm_strided_batched_ex(
      cublas_handle(device), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, blas_int(n),
      blas_int(m), blas_int(k), &alpha, b, t, blas_int(ldb), stride_b, a, t, blas_int(lda), stride_a, &beta, c,
      blas_type(c_dtype), blas_int(ldc), stride_c, blas_int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace tnt::cuda
