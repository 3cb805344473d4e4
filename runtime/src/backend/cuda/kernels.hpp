// Generic CUDA kernels on whole tensors (any shape; views at any byte offset): fill, dtype
// casts, and the f32 accumulation of a half-precision result (mixed precision). Each moves
// 16 bytes per access where every pointer is 16-byte aligned and falls back to one element
// per access otherwise, with bit-for-bit the same results (backend/cuda/vector_io.cuh).
// Plain C++ declarations, so tests and the core can call them without the CUDA headers.
// Every call is queued on the device's compute stream and returns without waiting.
#pragma once

#include "tarantella/tensor.hpp"

namespace tnt::cuda {

// Sets every element to value, converted to t's dtype exactly as the host does it
// (core/half.hpp for f16/bf16, static_cast for the others).
void fill(const Tensor& t, double value);

// dst = src converted elementwise (same shape; any dtypes among f32, f64, f16, bf16, i32,
// i64, u8). Float to f16/bf16 rounds to nearest even, like the host conversions; float
// to integer truncates toward zero like static_cast. A src in another memory format than
// dst is converted first (logical order kept, as copy_from does).
void cast(const Tensor& src, const Tensor& dst);
// A new tensor on src's device with the given dtype, in src's memory format.
Tensor cast(const Tensor& src, DType dtype);

// dst += float(src) elementwise: src f32, f16 or bf16, dst f32, equal element counts and
// memory formats. How
// a parameter gradient computed in the compute dtype (cuDNN's filter gradient has the
// filter's dtype) is added to its f32 master gradient.
void accumulate_as_float(const Tensor& src, const Tensor& dst);

}  // namespace tnt::cuda
