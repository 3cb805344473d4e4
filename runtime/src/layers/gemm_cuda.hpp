// Row-major products of (batches of) matrices on CUDA through cublasGemmStridedBatchedEx,
// FP32 accumulation (no TF32), for Embedding's projection and attention. Include from .cu
// files only.
//
// cuBLAS is column-major and a row-major (R, C) matrix is the column-major (C, R) one, so
// the row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T.
#pragma once

#include "backend/cuda/device_common.cuh"

namespace tnt::cuda {

// c (batch, M, N) = alpha op(a) op(b) + beta c. a: (batch, M, K), or (batch, K, M) stored
// when trans_a; b: (batch, K, N), or (batch, N, K) when trans_b. a and b of dtype ab
// (f32, f16, bf16), c of c_dtype (ab, or f32 for a half weight gradient accumulated in f32).
// A stride of 0 reuses one matrix for the whole batch.
void gemm_rm(int device, DType ab, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const void* a, int64_t stride_a, const void* b, int64_t stride_b, float beta, void* c,
             int64_t stride_c, int64_t batch = 1);

}  // namespace tnt::cuda
