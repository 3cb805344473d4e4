// Memory-format conversion on CUDA (tensor.hpp: MemoryFormat). Plain C++ declarations.
#pragma once

#include "tarantella/tensor.hpp"

namespace tnt::cuda {

// dst = src with dst's memory format: both 4-D, same shape, dtype and device, formats
// differ. Queued on the compute stream.
void convert_memory_format(const Tensor& src, const Tensor& dst);

}  // namespace tnt::cuda
