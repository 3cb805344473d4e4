// Pack/unpack kernels of the NCCL transport. A bucket's gradients are described by a small table
// passed by value (kMaxItems per launch); blockIdx.y picks the gradient, the x blocks
// stride over its elements. The arithmetic is in float (double for f64), so f16/bf16
// gradients are scaled with one rounding.
#include "backend/cuda/cuda_check.hpp"
#include "comm/pack_cuda.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace tnt::comm::cuda {

namespace {

constexpr int kMaxItems = 64;
constexpr int kThreads = 256;

struct ItemTable {
  PackItem items[kMaxItems];
};

template <typename T> struct Math { using type = float; };
template <> struct Math<double> { using type = double; };

template <typename T> __device__ typename Math<T>::type load(const T* p) { return static_cast<typename Math<T>::type>(*p); }
template <> __device__ float load<__half>(const __half* p) { return __half2float(*p); }
template <> __device__ float load<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <typename T> __device__ void store(T* p, typename Math<T>::type v) { *p = static_cast<T>(v); }
template <> __device__ void store<__half>(__half* p, float v) { *p = __float2half_rn(v); }
template <> __device__ void store<__nv_bfloat16>(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// to_fused: fused[offset + i] = item[i] * scale; else item[i] = fused[offset + i] * scale
template <typename T>
__global__ void pack_kernel(ItemTable table, T* fused, typename Math<T>::type scale, bool to_fused) {
  const PackItem it = table.items[blockIdx.y];
  T* grad = static_cast<T*>(it.ptr);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < it.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (to_fused) {
      store(&fused[it.offset + i], load(&grad[i]) * scale);
    } else {
      store(&grad[i], load(&fused[it.offset + i]) * scale);
    }
  }
}

template <typename T>
void launch(const std::vector<PackItem>& items, void* fused, double scale, void* stream, bool to_fused) {
  for (size_t first = 0; first < items.size(); first += kMaxItems) {
    ItemTable table{};
    size_t n = std::min<size_t>(kMaxItems, items.size() - first);
    int64_t largest = 0;
    for (size_t i = 0; i < n; ++i) {
      table.items[i] = items[first + i];
      largest = std::max(largest, items[first + i].count);
    }
    if (largest == 0) continue;
    unsigned blocks = static_cast<unsigned>(std::min<int64_t>((largest + kThreads - 1) / kThreads, 1024));
    dim3 grid(blocks, static_cast<unsigned>(n));
    pack_kernel<T><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        table, static_cast<T*>(fused), static_cast<typename Math<T>::type>(scale), to_fused);
    TNT_CUDA_CHECK(cudaGetLastError());
  }
}

void dispatch(const std::vector<PackItem>& items, void* fused, DType dtype, double scale, void* stream, bool to_fused) {
  switch (dtype) {
    case DType::f32: return launch<float>(items, fused, scale, stream, to_fused);
    case DType::f64: return launch<double>(items, fused, scale, stream, to_fused);
    case DType::f16: return launch<__half>(items, fused, scale, stream, to_fused);
    case DType::bf16: return launch<__nv_bfloat16>(items, fused, scale, stream, to_fused);
    default: TNT_THROW("the Reducer packs f32, f64, f16 and bf16 device gradients, not {}", dtype_name(dtype));
  }
}

}  // namespace

void pack(const std::vector<PackItem>& items, void* fused, DType dtype, double scale, void* stream) {
  dispatch(items, fused, dtype, scale, stream, true);
}

void unpack(const std::vector<PackItem>& items, const void* fused, DType dtype, double scale, void* stream) {
  dispatch(items, const_cast<void*>(fused), dtype, scale, stream, false);
}

void scale(void* data, int64_t count, DType dtype, double scale, void* stream) {
  if (scale == 1.0 || count == 0) return;
  // In place: the "fused buffer" is the gradient itself.
  std::vector<PackItem> one{PackItem{data, 0, count}};
  dispatch(one, data, dtype, scale, stream, false);
}

void* event_create() {
  cudaEvent_t e = nullptr;
  TNT_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void event_destroy(void* event) {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void event_record(void* event, void* stream) {
  TNT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

float event_elapsed_ms(void* from, void* to) {
  TNT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(from)));
  TNT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(to)));
  float ms = 0;
  TNT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
  return ms;
}

}  // namespace tnt::comm::cuda
