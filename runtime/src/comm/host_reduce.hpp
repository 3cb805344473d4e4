// Element-wise loops of the host collectives and the Reducer's packing: plain loops over
// restrict pointers, which the compiler vectorises (the runtime is built for x86-64-v3).
#pragma once

#include "tarantella/dtype.hpp"

#include <cstdint>

namespace tnt::comm {

// dst[i] += src[i], i < n                                  // dst, src: (n,)
void host_sum(void* dst, const void* src, int64_t n, DType dtype);
// dst[i] = (dst[i] + src[i]) / divisor (the last step of an average; floating types only)
void host_sum_div(void* dst, const void* src, int64_t n, DType dtype, double divisor);
// data[i] /= divisor (floating types only)
void host_div(void* data, int64_t n, DType dtype, double divisor);
// dst[i] = src[i] * scale; a plain copy when scale == 1 (any dtype)
void host_scale_copy(void* dst, const void* src, int64_t n, DType dtype, double scale);
// data[i] *= scale (floating types only; nothing when scale == 1)
void host_scale(void* data, int64_t n, DType dtype, double scale);

bool host_reducible(DType dtype);  // f32, f64, i32, i64

}  // namespace tnt::comm
