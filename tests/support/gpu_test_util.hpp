// Helpers of the GPU tests: reproducible random tensors, and the comparison
// |gpu - cpu| <= atol + rtol * |cpu| that reports the worst element when it fails.
#pragma once

#include <catch2/catch.hpp>

#include "tarantella/device.hpp"
#include "tarantella/initializers.hpp"
#include "tarantella/layer.hpp"
#include "tarantella/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace tnt::test {

// cuda:0, or a clear failure where this process cannot use a GPU.
inline Device gpu() {
  static const bool available = cuda_available();
  if (!available) {
    throw Error("no usable CUDA device: the gpu-labelled tests need one (scripts/gpu-check on a GPU machine)");
  }
  return Device::cuda(0);
}

// Uniform in [lo, hi), a pure function of (key, index): the same on every run.
inline Tensor random_tensor(const Shape& shape, const std::string& key, float lo = -1.0f, float hi = 1.0f) {
  CounterRng rng(2024, key);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * rng.uniform(i);
  return Tensor::from_vector(v, shape);
}

inline Tensor random_labels(int64_t rows, int64_t classes, const std::string& key, DType dtype = DType::i64) {
  CounterRng rng(2024, key);
  Tensor t = Tensor::empty({rows}, dtype);
  for (int64_t i = 0; i < rows; ++i) {
    int64_t v = static_cast<int64_t>(rng.bits(static_cast<uint64_t>(i)) % static_cast<uint32_t>(classes));
    if (dtype == DType::i32) {
      t.data<int32_t>()[i] = static_cast<int32_t>(v);
    } else {
      t.data<int64_t>()[i] = v;
    }
  }
  return t;
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_double_vector()) m = std::max(m, std::fabs(v));
  return m;
}

// The rule of every GPU-against-CPU comparison, for one element. A non-finite CPU value is
// matched exactly: the same infinity, or a NaN for a NaN; the tolerance `allowed` applies to
// finite values only (an infinite CPU value would otherwise make atol + rtol * |cpu|
// infinite and let any GPU value pass, and equal infinities give inf - inf = NaN). A finite
// CPU value needs a finite GPU value within `allowed`.
inline bool element_matches(double gpu, double cpu, double allowed) {
  if (std::isnan(cpu)) return std::isnan(gpu);
  if (std::isinf(cpu)) return gpu == cpu;
  if (!std::isfinite(gpu)) return false;
  return std::fabs(gpu - cpu) <= allowed;
}

// Every element within atol + rtol * |cpu| + bound_factor * bound (bound: an elementwise
// error scale with cpu's element count, such as the sums of |a| |b| behind each dot
// product; undefined: none), non-finite CPU values matched exactly (element_matches); on
// failure, says where and by how much.
inline void require_within(const Tensor& gpu_result, const Tensor& cpu_result, double atol, double rtol,
                           const Tensor& bound, double bound_factor, const std::string& what) {
  INFO(what << ": gpu " << gpu_result.str() << " vs cpu " << cpu_result.str());
  REQUIRE(gpu_result.defined());
  REQUIRE(cpu_result.defined());
  REQUIRE(gpu_result.numel() == cpu_result.numel());
  std::vector<double> g = gpu_result.to_double_vector();
  std::vector<double> c = cpu_result.to_double_vector();
  std::vector<double> b;
  if (bound.defined()) {
    REQUIRE(bound.numel() == cpu_result.numel());
    b = bound.to_double_vector();
  }
  auto allowed_at = [&](size_t i) {
    if (!std::isfinite(c[i])) return 0.0;  // matched exactly
    return atol + rtol * std::fabs(c[i]) + (b.empty() ? 0.0 : bound_factor * b[i]);
  };
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double allowed = allowed_at(i);
    if (!element_matches(g[i], c[i], allowed)) {
      ++bad;
      // A mismatch of non-finite values ranks above every finite excess.
      const double err = std::fabs(g[i] - c[i]);
      const double excess = std::isfinite(err) && std::isfinite(c[i]) ? err - allowed : INFINITY;
      if (worst < 0 || excess > worst_excess) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  if (bad > 0) {
    const auto w = static_cast<size_t>(worst);
    INFO(bad << " of " << g.size() << " elements differ; worst at " << worst << ": gpu " << g[w] << ", cpu " << c[w]
              << (std::isfinite(c[w]) ? ", allowed " : ", needed exactly ") << (std::isfinite(c[w]) ? allowed_at(w) : c[w]));
    CHECK(bad == 0);
  }
  REQUIRE(bad == 0);
}

// Every element within atol + rtol * |cpu|; on failure, says where and by how much.
inline void require_close(const Tensor& gpu_result, const Tensor& cpu_result, double atol, double rtol,
                          const std::string& what) {
  require_within(gpu_result, cpu_result, atol, rtol, Tensor(), 0.0, what);
}

inline void require_equal(const Tensor& gpu_result, const Tensor& cpu_result, const std::string& what) {
  require_close(gpu_result, cpu_result, 0.0, 0.0, what);
}

// The largest |a - b| over all elements (same sizes).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// |a - b| <= atol everywhere, as CHECK (not REQUIRE): one GPU run reports every failing
// case and output, each with its count and worst element by its index.
inline void check_all_close(const Tensor& a, const Tensor& b, double atol, const std::string& what) {
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  REQUIRE(x.size() == y.size());
  int64_t bad = 0;
  size_t worst = 0;
  double worst_err = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    const double err = std::fabs(x[i] - y[i]);
    if (!(err <= atol)) {
      ++bad;
      if (!(err <= worst_err)) {
        worst = i;
        worst_err = err;
      }
    }
  }
  std::string at;
  if (bad > 0) {
    size_t rest = worst;
    std::vector<int64_t> idx(a.shape().size());
    for (size_t d = idx.size(); d-- > 0;) {
      idx[d] = static_cast<int64_t>(rest % static_cast<size_t>(a.shape()[d]));
      rest /= static_cast<size_t>(a.shape()[d]);
    }
    for (size_t d = 0; d < idx.size(); ++d) at += (d ? ", " : "(") + std::to_string(idx[d]);
    at += ")";
  }
  INFO(what << ": " << bad << " of " << x.size() << " elements differ by more than " << atol << "; worst at " << at
            << ": " << (bad ? x[worst] : 0.0) << " against " << (bad ? y[worst] : 0.0));
  CHECK(bad == 0);
}

// Worst-case rounding bound for a dot product of length k with |a| <= amax, |b| <= bmax:
// each product carries a relative error of at most `unit` (2^-24 for FP32 inputs, 2^-10
// for TF32 tensor cores, which round both inputs to 10 mantissa bits), and a float sum of
// k terms errs by at most k * 2^-24 of the sum of their magnitudes, itself at most
// k * amax * bmax. Both engines err, hence the factor 2. The bound is loose (errors of
// random sign grow like sqrt(k)) but far below what an indexing bug produces.
inline double dot_atol(int64_t k, double amax, double bmax, double unit) {
  const double fp32 = std::ldexp(1.0, -24);
  const double kd = static_cast<double>(k);
  return 2.0 * (unit + kd * fp32) * kd * amax * bmax + 1e-30;
}

constexpr double kUnitFp32 = 5.9604644775390625e-08;  // 2^-24
constexpr double kUlp = 1.1920928955078125e-07;       // 2^-23: one float ulp at 1

// The run context of the CPU-against-CUDA layer tests: seed 99, step 4, and a sample offset
// that is not 0, so that Dropout's counters are offset as on a rank other than the first.
inline RunContext layer_context(bool training, Device device, int64_t sample_offset = 5) {
  RunContext rc;
  rc.training = training;
  rc.seed = 99;
  rc.step = 4;
  rc.sample_offset = sample_offset;
  rc.device = device;
  return rc;
}
constexpr double kUnitTf32 = 9.765625e-04;            // 2^-10
// Unit roundoff (half an ulp at 1, the largest relative error of one round-to-nearest) of
// the half formats: bf16 keeps 8 significant bits, f16 11.
constexpr double kUnitBf16 = 3.90625e-03;             // 2^-8
constexpr double kUnitF16 = 4.8828125e-04;            // 2^-11

}  // namespace tnt::test
