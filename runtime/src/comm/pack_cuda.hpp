// The NCCL transport's kernels (CUDA builds only; defined in pack_cuda.cu): one launch
// packs, unpacks or scales a whole bucket, plus the few event calls the transport needs.
// No CUDA types here, so the transport needs no CUDA header.
#pragma once

#include "tarantella/dtype.hpp"

#include <cstdint>
#include <vector>

namespace tnt::comm::cuda {

struct PackItem {
  void* ptr = nullptr;  // the gradient, (count,) on the device
  int64_t offset = 0;   // elements into the fused buffer
  int64_t count = 0;
};

// fused[offset + i] = item[i] * scale for every item      // fused: (bucket elements,)
void pack(const std::vector<PackItem>& items, void* fused, DType dtype, double scale, void* stream);
// item[i] = fused[offset + i] * scale
void unpack(const std::vector<PackItem>& items, const void* fused, DType dtype, double scale, void* stream);
// data[i] *= scale                                          // data: (count,)
void scale(void* data, int64_t count, DType dtype, double scale, void* stream);

void* event_create();  // cudaEvent_t with timing, on the current device
void event_destroy(void* event);
void event_record(void* event, void* stream);
// Waits for both events first (cudaEventElapsedTime on an event not yet reached returns
// cudaErrorNotReady). Only for events that cannot wait on a peer, or that a deadline-bound
// wait (NcclComm::synchronize) has already seen complete.
float event_elapsed_ms(void* from, void* to);

}  // namespace tnt::comm::cuda
