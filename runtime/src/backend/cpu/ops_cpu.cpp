// tarantella/ops.hpp: argument checks, the CUDA dispatch, and the CPU loops. Reductions
// accumulate in double in a fixed order per thread count (static OpenMP schedule), so a
// result is reproducible run to run on one machine.
//
// Memory formats (tensor.hpp): the element-wise loops run over memory, so two operands must
// lie in one format; where they do not, the second is converted to the first's (to the
// destination's for axpy and copy_cast) before the loop or the CUDA dispatch. Reductions
// do not care about order beyond rounding, and argmax_rows works on a contiguous copy.
#include "tarantella/ops.hpp"

#include "backend/cuda/ops_cuda.hpp"
#include "backend/dispatch.hpp"
#include "core/half.hpp"
#include "tarantella/check.hpp"

#include <cmath>
#include <cstring>

namespace tnt::ops {

namespace {

bool is_float(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16; }

void check_same(const char* op, const Tensor& a, const Tensor& b, bool same_dtype = true) {
  TNT_CHECK(a.defined() && b.defined(), "ops::{}: undefined tensor", op);
  TNT_CHECK(a.numel() == b.numel(), "ops::{}: {} and {} differ in element count", op, a.str(), b.str());
  TNT_CHECK(!same_dtype || a.dtype() == b.dtype(), "ops::{}: {} and {} differ in dtype", op, a.str(), b.str());
  TNT_CHECK(a.device() == b.device(), "ops::{}: {} and {} are on different devices", op, a.str(), b.str());
}

void check_cpu_f32(const char* op, const Tensor& t) {
  TNT_CHECK(t.dtype() == DType::f32, "ops::{}: the CPU engine computes in f32, got {}", op, t.str());
}

double load(const void* p, DType d, int64_t i) {
  switch (d) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

void store(void* p, DType d, int64_t i, double v) {
  switch (d) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = float_to_f16(static_cast<float>(v)); break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
  }
}

// b in a's memory format (b itself when it already is); formats differ only for 4-D tensors
// of one shape, anything else is refused with both named.
Tensor same_format(const char* op, const Tensor& a, const Tensor& b) {
  if (a.memory_format() == b.memory_format()) return b;
  TNT_CHECK(a.shape() == b.shape(), "ops::{}: {} and {} differ in memory format and shape", op, a.str(), b.str());
  return b.to_memory_format(a.memory_format());
}

// The conversion as a template argument, so that it is inlined into the loop.
template <auto Convert, typename From, typename To>
void convert_loop(const From* from, To* to, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) to[i] = Convert(from[i]);
}

}  // namespace

void axpy(double alpha, const Tensor& x_any, const Tensor& y) {
  check_same("axpy", x_any, y);
  const Tensor x = same_format("axpy", y, x_any);
  TNT_CUDA_DISPATCH(x.device(), cuda::axpy(alpha, x, y));
  check_cpu_f32("axpy", x);
  const float* xs = x.data<float>();  // (n)
  float* ys = y.data<float>();        // (n)
  const float a = static_cast<float>(alpha);
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) ys[i] += a * xs[i];
}

void scale(const Tensor& x, double alpha) {
  TNT_CHECK(x.defined(), "ops::scale: undefined tensor");
  TNT_CUDA_DISPATCH(x.device(), cuda::scale(x, alpha));
  check_cpu_f32("scale", x);
  float* xs = x.data<float>();
  const float a = static_cast<float>(alpha);
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) xs[i] *= a;
}

Tensor add(const Tensor& a, const Tensor& b_any) {
  check_same("add", a, b_any);
  const Tensor b = same_format("add", a, b_any);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device(), a.memory_format());
  if (a.device().is_cuda()) {
#ifdef TNT_WITH_CUDA
    cuda::add(a, b, out);
    return out;
#else
    detail::no_cuda_engine("ops::add");
#endif
  }
  if (a.dtype() == DType::f16 || a.dtype() == DType::bf16) {
    // Mixed precision on the CPU (the network's emulation, see graph.hpp): gradients of
    // branches meet in the compute dtype; add in f32, round once.
    const void* ap = a.raw();
    const void* bp = b.raw();
    void* op = out.raw();
    const DType d = a.dtype();
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) store(op, d, i, static_cast<float>(load(ap, d, i)) + static_cast<float>(load(bp, d, i)));
    return out;
  }
  check_cpu_f32("add", a);
  const float* as = a.data<float>();
  const float* bs = b.data<float>();
  float* os = out.data<float>();
  const int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) os[i] = as[i] + bs[i];
  return out;
}

void copy_cast(const Tensor& src_any, const Tensor& dst) {
  check_same("copy_cast", src_any, dst, false);
  const Tensor src = same_format("copy_cast", dst, src_any);
  TNT_CUDA_DISPATCH(src.device(), cuda::copy_cast(src, dst));
  if (src.dtype() == dst.dtype()) {
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  const void* s = src.raw();
  void* d = dst.raw();
  const DType sd = src.dtype(), dd = dst.dtype();
  const int64_t n = src.numel();
  // Mixed precision on the CPU casts every activation twice: direct loops for those pairs.
  const auto* sf = static_cast<const float*>(s);
  const auto* sh = static_cast<const uint16_t*>(s);
  if (sd == DType::f32 && dd == DType::bf16) return convert_loop<float_to_bf16>(sf, static_cast<uint16_t*>(d), n);
  if (sd == DType::bf16 && dd == DType::f32) return convert_loop<bf16_to_float>(sh, static_cast<float*>(d), n);
  if (sd == DType::f32 && dd == DType::f16) return convert_loop<float_to_f16>(sf, static_cast<uint16_t*>(d), n);
  if (sd == DType::f16 && dd == DType::f32) return convert_loop<f16_to_float>(sh, static_cast<float*>(d), n);
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) store(d, dd, i, load(s, sd, i));
}

Tensor cast(const Tensor& src, DType dtype) {
  TNT_CHECK(src.defined(), "ops::cast: undefined tensor");
  Tensor out = Tensor::empty(src.shape(), dtype, src.device(), src.memory_format());
  copy_cast(src, out);
  return out;
}

namespace {
// Sum of f(x_i) in double over a host tensor of any floating dtype.
template <class F>
double reduce_host(const Tensor& x, F f) {
  const void* p = x.raw();
  const DType d = x.dtype();
  const int64_t n = x.numel();
  double total = 0;
  if (d == DType::f32) {
    const float* xs = static_cast<const float*>(p);
#pragma omp parallel for reduction(+ : total) schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) total += f(static_cast<double>(xs[i]));
  } else {
#pragma omp parallel for reduction(+ : total) schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) total += f(load(p, d, i));
  }
  return total;
}
}  // namespace

double sum(const Tensor& x) {
  TNT_CHECK(x.defined(), "ops::sum: undefined tensor");
  TNT_CUDA_DISPATCH(x.device(), cuda::sum(x));
  return reduce_host(x, [](double v) { return v; });
}

double sum_squares(const Tensor& x) {
  TNT_CHECK(x.defined(), "ops::sum_squares: undefined tensor");
  TNT_CUDA_DISPATCH(x.device(), cuda::sum_squares(x));
  return reduce_host(x, [](double v) { return v * v; });
}

bool has_non_finite(const Tensor& x) {
  TNT_CHECK(x.defined(), "ops::has_non_finite: undefined tensor");
  TNT_CUDA_DISPATCH(x.device(), cuda::has_non_finite(x));
  if (!is_float(x.dtype())) return false;
  return reduce_host(x, [](double v) { return std::isfinite(v) ? 0.0 : 1.0; }) > 0;
}

bool has_non_finite(const std::vector<Tensor>& xs) {
  if (xs.empty()) return false;
  for (const Tensor& x : xs) {
    TNT_CHECK(x.defined(), "ops::has_non_finite: undefined tensor");
    TNT_CHECK(x.device() == xs[0].device(), "ops::has_non_finite: tensors on {} and {}", xs[0].device().str(),
              x.device().str());
  }
  TNT_CUDA_DISPATCH(xs[0].device(), cuda::has_non_finite(xs));
  for (const Tensor& x : xs) {
    if (has_non_finite(x)) return true;
  }
  return false;
}

Tensor argmax_rows(const Tensor& x_any) {
  TNT_CHECK(x_any.defined() && x_any.ndim() >= 1 && x_any.dim(-1) > 0,
            "ops::argmax_rows: needs a tensor (..., K) with K > 0, got {}",
            x_any.defined() ? x_any.str() : std::string("undefined"));
  const Tensor x = x_any.contiguous();  // rows along the logical last dimension
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  Tensor out = Tensor::empty(out_shape, DType::i64, x.device());
  if (x.device().is_cuda()) {
#ifdef TNT_WITH_CUDA
    cuda::argmax_rows(x, out);
    return out;
#else
    detail::no_cuda_engine("ops::argmax_rows");
#endif
  }
  check_cpu_f32("argmax_rows", x);
  const int64_t k = x.dim(-1), rows = x.numel() / k;
  const float* xs = x.data<float>();  // (R, K)
  int64_t* os = out.data<int64_t>();  // (R)
#pragma omp parallel for schedule(static) if (rows > 1024)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xs + r * k;
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j)
      if (row[j] > row[best]) best = j;
    os[r] = best;
  }
  return out;
}

double item(const Tensor& x) {
  TNT_CHECK(x.defined() && x.numel() == 1, "ops::item: needs a 1-element tensor, got {}",
            x.defined() ? x.str() : std::string("undefined"));
  return x.to_double_vector()[0];
}

}  // namespace tnt::ops
