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

// Channel padding (channel_pad_cuda.cu), for the first convolution of a channels_last
// network: cuDNN's fastest kernels for images want 4 or 8 channels, not 1-3.
// src (N, C, H, W) in either format -> (N, cp, H, W) channels_last, its channels C..cp-1
// zero; cp is 4 or 8 and C <= cp. Queued on the compute stream.
Tensor pad_channels(const Tensor& src, int64_t cp);
// dst (N, C, H, W), either format, = the first C channels of src (N, Cp, H, W) channels_last
// (the same dtype). How a padded convolution's input gradient is returned.
void unpad_channels(const Tensor& src, const Tensor& dst);
// dst (F, C, k, k) f32, either format, += float(the first C channels of src), src (F, Cp, k,
// k) channels_last (KRSC) f32, f16 or bf16: a padded convolution's filter gradient added to
// the master gradient. Deterministic (each element of dst is written by one thread).
void accumulate_unpadded_as_float(const Tensor& src, const Tensor& dst);

}  // namespace tnt::cuda
