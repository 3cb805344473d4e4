// Memory-format conversion on CUDA (tensor.hpp: MemoryFormat). Plain C++ declarations.
#pragma once

#include "tarantella/tensor.hpp"

namespace tnt::cuda {

// dst = src with dst's memory format: both 4-D, same shape, dtype and device, formats
// differ. Queued on the compute stream.
void convert_memory_format(const Tensor& src, const Tensor& dst);

// dst += float(src) element by element of the logical shape, where src and dst have
// different memory formats: src 4-D f32, f16 or bf16, dst 4-D f32 of the same shape. How
// the CUDA Conv2D adds a filter gradient computed in KRSC (a channels_last (F, C, k, k)
// tensor) to the contiguous f32 master gradient in one pass. Deterministic (each element
// of dst is read and written by one thread).
void accumulate_converted_as_float(const Tensor& src, const Tensor& dst);

}  // namespace tnt::cuda
