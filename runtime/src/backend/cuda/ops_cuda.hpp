// The CUDA engines of tarantella/ops.hpp (ops_cuda.cu), called by backend/cpu/ops_cpu.cpp,
// which has checked the arguments: all tensors on one CUDA device, equal element counts,
// equal dtypes except for copy_cast, out tensors allocated. The element-wise ones (axpy,
// add) also need equal memory formats and say so otherwise; copy_cast converts formats.
// Plain C++ declarations (no CUDA types), so the CPU side includes them in every build.
#pragma once

#include "tarantella/tensor.hpp"

#include <vector>

namespace tnt::cuda {

void axpy(double alpha, const Tensor& x, const Tensor& y);  // y += alpha x
void scale(const Tensor& x, double alpha);
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void copy_cast(const Tensor& src, const Tensor& dst);
double sum(const Tensor& x);
double sum_squares(const Tensor& x);
bool has_non_finite(const Tensor& x);
bool has_non_finite(const std::vector<Tensor>& xs);  // all on one CUDA device, floating
void argmax_rows(const Tensor& x, const Tensor& out);  // x (R, K), out (R) i64

}  // namespace tnt::cuda
