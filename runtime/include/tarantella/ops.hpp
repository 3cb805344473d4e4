// Small tensor ops the runtime needs on any device (optimisers, gradient checks,
// TerminateOnNaN, metrics). In-place ops write through a const Tensor& (a Tensor is a
// handle; const does not protect its data). Element-wise ops need equal element counts
// and dtypes; floating dtypes are f32 on the CPU, f32/f16/bf16 on CUDA. Reductions
// accumulate in double and return to the host.
//
// Memory formats (tensor.hpp): add() and cast() return the format of their (first) operand;
// where two operands differ in format (4-D, same shape), the other one is converted first:
// add(a, b) to a's, axpy(x, y) and copy_cast(src, dst) to y's and dst's. Operands that
// differ in format and shape are refused. Reductions do not depend on the format;
// argmax_rows takes rows along the logical last dimension.
#pragma once

#include "tarantella/tensor.hpp"

#include <vector>

namespace tnt::ops {

void axpy(double alpha, const Tensor& x, const Tensor& y);  // y += alpha * x
void scale(const Tensor& x, double alpha);                   // x *= alpha
Tensor add(const Tensor& a, const Tensor& b);                // a + b, a new tensor
void copy_cast(const Tensor& src, const Tensor& dst);         // same numel, same device, any dtypes
Tensor cast(const Tensor& src, DType dtype);                  // a new tensor on src's device
double sum(const Tensor& x);
double sum_squares(const Tensor& x);
bool has_non_finite(const Tensor& x);                         // any NaN or infinity
// Any NaN or infinity in any of them (one device round trip on CUDA; all on one device).
bool has_non_finite(const std::vector<Tensor>& xs);
Tensor argmax_rows(const Tensor& x);  // (..., K) -> (...) i64, first maximum of each row
double item(const Tensor& x);         // the value of a 1-element tensor

}  // namespace tnt::ops
