// Our host allreduce; the algorithm is described at the top of ring_allreduce.cpp.
#pragma once

#include "comm/waiter.hpp"

#include <cstdint>

namespace tnt::comm {

// In place over w.comm(); data: (count,) host memory of dtype (f32, f64, i32, i64).
// average divides by the number of ranks (floating dtypes only). Call after comm.enter().
void ring_allreduce(detail::Waiter& w, void* data, int64_t count, DType dtype, bool average);

// True when a buffer of count elements takes the small-message (recursive doubling) path.
bool ring_uses_recursive_doubling(const detail::CommImpl& comm, int64_t count, DType dtype);

}  // namespace tnt::comm
