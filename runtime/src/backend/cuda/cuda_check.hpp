// Check macros for the CUDA libraries: each reports file, line and the library's own
// error string, and throws tnt::Error.
#pragma once

#include "tarantella/check.hpp"

#include <cuda_runtime.h>

#define TNT_CUDA_CHECK(call)                                                                    \
  do {                                                                                          \
    cudaError_t tnt_cuda_err_ = (call);                                                         \
    if (tnt_cuda_err_ != cudaSuccess)                                                           \
      ::tnt::detail::throw_error(__FILE__, __LINE__, ::fmt::format("CUDA error in {}: {}", #call, \
                                                                   cudaGetErrorString(tnt_cuda_err_))); \
  } while (0)
