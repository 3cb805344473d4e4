// cuBLAS, loaded when a CUDA device first runs a product, not when the library loads.
//
// Why: libcublas pulls in libcublasLt, whose relocations cost every process that loads it
// about 95 MB of private memory. A CPU rank of a build with the CUDA backend never
// multiplies on a GPU, and a node may run one rank per core. So libtarantella does not
// link cuBLAS: the first cublas_api() call opens it (dlopen by its soname, where the loader
// would look: LD_LIBRARY_PATH, libtarantella's RUNPATH, the system's cache; then the folder
// the build found it in) and resolves the few functions the runtime calls. A library that
// cannot be opened or lacks one of them is an error naming it.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace tnt::cuda {

struct CublasApi {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  decltype(&::cublasGetProperty) get_property = nullptr;
  // Spelt out: C++ sees an inline overload of each besides the library's function.
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                                  const void*, const void*, cudaDataType, int, long long int,
                                                  const void*, cudaDataType, int, long long int, const void*, void*,
                                                  cudaDataType, int, long long int, int, cublasComputeType_t,
                                                  cublasGemmAlgo_t);
  GemmEx gemm_ex = nullptr;
  GemmStridedBatchedEx gemm_strided_batched_ex = nullptr;
  std::string path;  // what was opened: the soname, or the fallback folder's file
};

// Opens the library once (thread-safe); throws tnt::Error when it cannot.
const CublasApi& cublas_api();

// What cublas_api() does once: opens `soname`, else `fallback_dir`/`soname` (empty: none),
// and resolves the functions. Throws tnt::Error naming the library and what failed.
// Never closes the library.
CublasApi load_cublas(const std::string& soname, const std::string& fallback_dir);

// The soname the runtime was compiled against (libcublas.so.<major>).
const char* cublas_soname();

// Whether cuBLAS is mapped into this process (read from /proc/self/maps): for the test
// that a CPU run never loads it.
bool cublas_loaded();

// cuBLAS's text for a status, or "status N" while cuBLAS is not loaded.
std::string cublas_status_text(cublasStatus_t status);

}  // namespace tnt::cuda
