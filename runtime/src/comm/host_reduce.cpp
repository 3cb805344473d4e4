#include "comm/host_reduce.hpp"

#include "tarantella/check.hpp"

#include <cstring>

namespace tnt::comm {

namespace {

template <typename T>
void sum_loop(T* __restrict dst, const T* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

template <typename T>
void sum_div_loop(T* __restrict dst, const T* __restrict src, int64_t n, T divisor) {
  // Division rather than multiplication by 1/p: the average of exactly representable data
  // is then correctly rounded, and equal to what a serial program computes.
  for (int64_t i = 0; i < n; ++i) dst[i] = (dst[i] + src[i]) / divisor;
}

template <typename T>
void div_loop(T* __restrict data, int64_t n, T divisor) {
  for (int64_t i = 0; i < n; ++i) data[i] /= divisor;
}

template <typename T>
void scale_copy_loop(T* __restrict dst, const T* __restrict src, int64_t n, T scale) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
}

template <typename T>
void scale_loop(T* __restrict data, int64_t n, T scale) {
  for (int64_t i = 0; i < n; ++i) data[i] *= scale;
}

[[noreturn]] void not_floating(const char* what, DType dtype) {
  TNT_THROW("{} needs a floating-point dtype, got {}", what, dtype_name(dtype));
}

}  // namespace

bool host_reducible(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32 || dtype == DType::i64;
}

void host_sum(void* dst, const void* src, int64_t n, DType dtype) {
  switch (dtype) {
    case DType::f32: return sum_loop(static_cast<float*>(dst), static_cast<const float*>(src), n);
    case DType::f64: return sum_loop(static_cast<double*>(dst), static_cast<const double*>(src), n);
    case DType::i32: return sum_loop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n);
    case DType::i64: return sum_loop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n);
    default: TNT_THROW("host reduction of {} is not supported (f32, f64, i32, i64)", dtype_name(dtype));
  }
}

void host_sum_div(void* dst, const void* src, int64_t n, DType dtype, double divisor) {
  switch (dtype) {
    case DType::f32:
      return sum_div_loop(static_cast<float*>(dst), static_cast<const float*>(src), n, static_cast<float>(divisor));
    case DType::f64: return sum_div_loop(static_cast<double*>(dst), static_cast<const double*>(src), n, divisor);
    default: not_floating("an average", dtype);
  }
}

void host_div(void* data, int64_t n, DType dtype, double divisor) {
  switch (dtype) {
    case DType::f32: return div_loop(static_cast<float*>(data), n, static_cast<float>(divisor));
    case DType::f64: return div_loop(static_cast<double*>(data), n, divisor);
    default: not_floating("an average", dtype);
  }
}

void host_scale_copy(void* dst, const void* src, int64_t n, DType dtype, double scale) {
  if (scale == 1.0) {
    if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dtype));
    return;
  }
  if (dst == src) return host_scale(dst, n, dtype, scale);
  switch (dtype) {
    case DType::f32:
      return scale_copy_loop(static_cast<float*>(dst), static_cast<const float*>(src), n, static_cast<float>(scale));
    case DType::f64: return scale_copy_loop(static_cast<double*>(dst), static_cast<const double*>(src), n, scale);
    default: not_floating("scaling", dtype);
  }
}

void host_scale(void* data, int64_t n, DType dtype, double scale) {
  if (scale == 1.0) return;
  switch (dtype) {
    case DType::f32: return scale_loop(static_cast<float*>(data), n, static_cast<float>(scale));
    case DType::f64: return scale_loop(static_cast<double*>(data), n, scale);
    default: not_floating("scaling", dtype);
  }
}

}  // namespace tnt::comm
