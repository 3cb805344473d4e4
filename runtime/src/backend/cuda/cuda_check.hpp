// Check macros for the CUDA libraries: each reports file, line, the failing call and the
// library's own error string, and throws tnt::Error. (TNT_NCCL_CHECK lives with the NCCL
// communicator.)
#pragma once

// fmt 9 turns its constexpr off under nvcc, and then its C++20 compile-time format check
// fails to compile (in nvcc's front end and in the host pass alike); nvcc 12+ handles that
// constexpr fine. This must come before the first fmt include, so every .cu file includes
// a backend/cuda header first.
#if defined(__CUDACC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif

#include "backend/cuda/cublas_api.hpp"
#include "tarantella/check.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#define TNT_CUDA_CHECK(call)                                                                    \
  do {                                                                                          \
    cudaError_t tnt_cuda_err_ = (call);                                                         \
    if (tnt_cuda_err_ != cudaSuccess)                                                           \
      ::tnt::detail::throw_error(__FILE__, __LINE__, ::fmt::format("CUDA error in {}: {}", #call, \
                                                                   cudaGetErrorString(tnt_cuda_err_))); \
  } while (0)

#define TNT_CUDNN_CHECK(call)                                                                  \
  do {                                                                                         \
    cudnnStatus_t tnt_cudnn_st_ = (call);                                                      \
    if (tnt_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                                 \
      ::tnt::detail::throw_error(__FILE__, __LINE__, ::fmt::format("cuDNN error in {}: {}", #call, \
                                                                   cudnnGetErrorString(tnt_cudnn_st_))); \
  } while (0)

#define TNT_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                          \
    cublasStatus_t tnt_cublas_st_ = (call);                                                     \
    if (tnt_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::tnt::detail::throw_error(__FILE__, __LINE__, ::fmt::format("cuBLAS error in {}: {}", #call, \
                                                                   ::tnt::cuda::cublas_status_text(tnt_cublas_st_))); \
  } while (0)

// After a kernel launch: reports a bad launch configuration at the launch site (errors
// inside the kernel surface at the next synchronising call).
#define TNT_CUDA_CHECK_LAUNCH() TNT_CUDA_CHECK(cudaGetLastError())
