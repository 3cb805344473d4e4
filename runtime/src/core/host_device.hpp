// TNT_HD marks a function written once for the host and for CUDA kernels (the Philox
// generator, the optimizers' update rules): __host__ __device__ under nvcc, inline otherwise.
#pragma once

#if defined(__CUDACC__)
#define TNT_HD __host__ __device__ __forceinline__
#else
#define TNT_HD inline
#endif
