// Row-major products of (batches of) f32 matrices on the CPU through oneDNN's cached matmul,
// for the layers whose operands are plain buffers (Embedding's projection, attention). A
// transposed operand is the same buffer described with swapped strides, never a copy.
#pragma once

#include "backend/cpu/dnnl_context.hpp"

namespace tnt::cpu {

// c (batch, M, N) = op(a) op(b), or += with accumulate. a is stored (batch, M, K), or
// (batch, K, M) when trans_a; b is stored (batch, K, N), or (batch, N, K) when trans_b.
inline void batched_matmul(const float* a, bool trans_a, const float* b, bool trans_b, float* c, int64_t batch,
                           int64_t m, int64_t n, int64_t k, bool accumulate) {
  if (batch == 0 || m == 0 || n == 0) return;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc da({batch, m, k}, dt::f32,
                              trans_a ? dnnl::memory::dims{m * k, 1, m} : dnnl::memory::dims{m * k, k, 1});
  const dnnl::memory::desc db({batch, k, n}, dt::f32,
                              trans_b ? dnnl::memory::dims{k * n, 1, k} : dnnl::memory::dims{k * n, n, 1});
  const dnnl::memory::desc dc({batch, m, n}, dt::f32, dnnl::memory::dims{m * n, n, 1});
  dnnl::memory ma(da, dnnl_engine(), const_cast<float*>(a));
  dnnl::memory mb(db, dnnl_engine(), const_cast<float*>(b));
  dnnl::memory mc(dc, dnnl_engine(), c);
  matmul(ma, mb, nullptr, mc, accumulate);
}

}  // namespace tnt::cpu
