// Mixed precision on CUDA: the engines on f16 and bf16 inputs against the CPU engines in
// f32 on the same values, ops::has_non_finite over a list of tensors, accumulate_as_float,
// and a small network with Network::set_compute_dtype(bf16).
//
// How the layer comparisons are made: the input, the output gradient and the weights that
// the engine multiplies in the half format are rounded to it first (the CPU engine gets
// the rounded values in f32; the GPU layer gets the half tensors, and its compute copy of
// the weight is made by hand with ops::cast, as the network would). So both sides start
// from identical numbers, and what is left is the GPU's arithmetic: products, f32
// accumulation, and the rounding of its results to the half format.
//
// Tolerances, in the half format's unit roundoff u (bf16 2^-8, f16 2^-11):
//   - A result stored in the half format carries one rounding: u |result|. For f16, a
//     result below 2^-14 (subnormal) errs by up to 2^-25 absolutely: atol 2^-24.
//   - Products of two half values are exact in f32 (8 + 8 or 11 + 11 significant bits fit
//     in 24), so a dot product of length k errs only by its f32 accumulation, at most
//     k 2^-23 S on tensor cores (their adds may truncate rather than round) and k 2^-24 S
//     on the CPU, where S = sum |a_i b_i| is computed for every output by the CPU engine on
//     absolute values (Higham's bound): k 2^-22 S covers both. That is the growth factor
//     for the reduction length.
//   - 2 u S more for what cuDNN does not document: an algorithm that rounds a transformed
//     operand or a partial result to the half format once (Winograd, FFT variants), and the
//     bias that Conv2D adds after the product was rounded (u |product| <= u S).
// A wrong index, a missed accumulation or a parameter read in the wrong dtype errs by about
// |result|, far above these bounds (3 u S <= 1.2% of S for bf16).
#include "gpu_test_util.hpp"

#include "backend/cuda/kernels.hpp"
#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

using namespace tnt;
using tnt::test::dot_atol;
using tnt::test::gpu;
using tnt::test::kUlp;
using tnt::test::kUnitBf16;
using tnt::test::kUnitF16;
using tnt::test::kUnitFp32;
using tnt::test::max_abs;
using tnt::test::require_close;
using tnt::test::require_equal;
using tnt::test::require_within;

namespace {

const double kAccumulation = std::ldexp(1.0, -22);  // per term of an f32 sum, both sides (see the top)

struct HalfFormat {
  DType dtype;
  double u;     // unit roundoff
  double tiny;  // absolute error allowance for subnormal results
};

const HalfFormat kFormats[] = {
    {DType::bf16, kUnitBf16, 0.0},  // bf16 shares f32's exponent range: no subnormals here
    {DType::f16, kUnitF16, 5.9604644775390625e-08},  // 2^-24
};

RunContext context(bool training, Device device) { return tnt::test::layer_context(training, device); }

// The f32 values that a tensor rounded to `dtype` holds (on the host).
Tensor rounded(const Tensor& x, DType dtype) { return ops::cast(ops::cast(x, dtype), DType::f32); }

// x (host f32, already representable) as a `dtype` tensor on the GPU.
Tensor half_on_gpu(const Tensor& x, DType dtype) { return ops::cast(x, dtype).to(gpu()); }

Tensor abs_of(const Tensor& x) {
  std::vector<float> v = x.to(Device::cpu()).to_vector();
  for (float& e : v) e = std::fabs(e);
  return Tensor::from_vector(v, x.shape());
}

// Two copies of one layer (same name, so the same initial weights), CPU and GPU.
template <typename L, typename... Args>
std::pair<std::shared_ptr<L>, std::shared_ptr<L>> twins(const std::vector<Shape>& shapes, Args... args) {
  auto a = std::make_shared<L>(args...);
  auto b = std::make_shared<L>(args...);
  b->to(gpu());
  a->ensure_built(shapes);
  b->ensure_built(shapes);
  a->initialize(11);
  b->initialize(11);
  return {a, b};
}

// The same random values into a parameter of both twins (biases start at zero, which would
// hide a bias read in the wrong dtype).
void set_both(Parameter& pa, Parameter& pb, const std::string& key, float lo, float hi) {
  Tensor v = test::random_tensor(pa.value.shape(), key, lo, hi);
  pa.value.copy_from(v);
  pb.value.copy_from(v);
}

struct MixedRun {
  Tensor x, dy;  // the rounded input and output gradient, host f32
  Tensor y_cpu, y_gpu, dx_cpu, dx_gpu;
};

// Forward and backward of a single-input layer: a (CPU, f32) on rounded values, b (GPU) in
// `dtype`. Every parameter gradient starts from the same random values on both sides
// (backward must ADD to them, in f32). need_input_grads false: as for a network's first
// layer, backward returns no input gradient (dx_cpu and dx_gpu stay undefined).
MixedRun run_mixed(Layer& a, Layer& b, const Tensor& x, DType dtype, bool training, const std::string& key,
                   bool need_input_grads = true) {
  MixedRun r;
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!pa[i]->cast_for_compute) continue;
    Tensor w = rounded(pa[i]->value, dtype);
    pa[i]->value.copy_from(w);
    pb[i]->value.copy_from(w);
    pb[i]->compute = ops::cast(pb[i]->value, dtype);  // what Network keeps for a mixed forward
    REQUIRE(pb[i]->compute.device() == gpu());
  }
  r.x = rounded(x, dtype);
  SavedState sa, sb;
  sa.need_input_grads = need_input_grads;
  sb.need_input_grads = need_input_grads;
  std::vector<Tensor> ya = a.forward({r.x}, context(training, Device::cpu()), sa);
  std::vector<Tensor> yb = b.forward({half_on_gpu(r.x, dtype)}, context(training, gpu()), sb);
  REQUIRE(ya.size() == 1);
  REQUIRE(yb.size() == 1);
  r.y_cpu = ya[0];
  r.y_gpu = yb[0];
  REQUIRE(r.y_gpu.device() == gpu());
  REQUIRE(r.y_gpu.dtype() == dtype);  // activations stay in the compute dtype
  REQUIRE(r.y_gpu.shape() == r.y_cpu.shape());

  r.dy = rounded(test::random_tensor(r.y_cpu.shape(), key + "_dy"), dtype);
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!pa[i]->grad.defined()) continue;
    REQUIRE(pb[i]->grad.dtype() == DType::f32);  // master gradients
    Tensor g = test::random_tensor(pa[i]->grad.shape(), key + "_grad_" + pa[i]->name, -0.5f, 0.5f);
    pa[i]->grad.copy_from(g);
    pb[i]->grad.copy_from(g);
  }
  std::vector<Tensor> dxa = a.backward({r.dy}, context(training, Device::cpu()), sa);
  std::vector<Tensor> dxb = b.backward({half_on_gpu(r.dy, dtype)}, context(training, gpu()), sb);
  REQUIRE(dxa.size() == 1);
  REQUIRE(dxb.size() == 1);
  if (!need_input_grads) {
    REQUIRE(!dxb[0].defined());
    return r;
  }
  r.dx_cpu = dxa[0];
  r.dx_gpu = dxb[0];
  REQUIRE(r.dx_gpu.dtype() == dtype);
  return r;
}

// ||gpu - cpu||_2 <= rel ||cpu||_2.
void require_norm_close(const Tensor& gpu_result, const Tensor& cpu_result, double rel, const std::string& what) {
  INFO(what << ": gpu " << gpu_result.str() << " vs cpu " << cpu_result.str());
  REQUIRE(gpu_result.numel() == cpu_result.numel());
  std::vector<double> g = gpu_result.to_double_vector(), c = cpu_result.to_double_vector();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff += (g[i] - c[i]) * (g[i] - c[i]);
    norm += c[i] * c[i];
  }
  INFO("relative difference " << std::sqrt(diff / norm) << ", allowed " << rel);
  REQUIRE(norm > 0);
  REQUIRE(std::sqrt(diff) <= rel * std::sqrt(norm));
}

// For a product layer (Conv2D, Dense): S = sum |a_i b_i| behind every output, input
// gradient and weight gradient, by a third (CPU) copy of the layer on absolute values.
struct AbsSums {
  Tensor y, dx, dw;
};

template <typename L, typename... Args>
AbsSums abs_sums(const MixedRun& r, const Tensor& w, Args... args) {
  auto c = std::make_shared<L>(args...);
  c->ensure_built({r.x.shape()});
  c->weight().value.copy_from(abs_of(w));
  if (c->bias()) c->bias()->value.zero_();
  c->zero_grad();
  SavedState s;
  const RunContext rc = context(true, Device::cpu());
  AbsSums out;
  out.y = c->forward({abs_of(r.x)}, rc, s)[0];
  out.dx = c->backward({abs_of(r.dy)}, rc, s)[0];
  out.dw = c->weight().grad.clone();
  return out;
}

// A network's first Conv2D (need_input_grads false, as the graph sets it) on 3 input channels
// in `h`'s format. cuDNN may offer no backward-data algorithm for such a convolution (in
// deterministic mode especially), and this layer never needs one: forward and backward must
// run, return no dx, and match the f32 CPU engine (tolerances of the Conv2D case below).
void check_first_layer_conv(const HalfFormat& h) {
  INFO(dtype_name(h.dtype));
  const Shape xs{4, 3, 16, 16};
  const int64_t filters = 8, kernel = 3;
  const Conv2DOptions opts{.stride = 1, .padding = 1, .use_bias = true};
  auto [a, b] = twins<Conv2D>({xs}, filters, kernel, opts, "mp_first_conv");
  set_both(*a->bias(), *b->bias(), "mp_first_conv_bias", -0.5f, 0.5f);
  MixedRun r = run_mixed(*a, *b, test::random_tensor(xs, "mp_first_conv_x"), h.dtype, true, "mp_first_conv",
                         /*need_input_grads=*/false);
  AbsSums s = abs_sums<Conv2D>(r, a->weight().value, filters, kernel, opts, "mp_first_conv");
  const Shape& ys = r.y_cpu.shape();
  const int64_t k_fwd = xs[1] * kernel * kernel, k_filter = ys[0] * ys[2] * ys[3];
  require_within(r.y_gpu, r.y_cpu, h.tiny, h.u, s.y, 3 * h.u + k_fwd * kAccumulation, "y");
  require_within(b->weight().grad, a->weight().grad, h.tiny, kUlp, s.dw, 3 * h.u + k_filter * kAccumulation, "dW");
  require_close(b->bias()->grad, a->bias()->grad, dot_atol(k_filter, 1, 1, kUnitFp32), kUlp, "db");
}

}  // namespace

TEST_CASE("Dense on CUDA in f16 and bf16 matches the f32 CPU engine", "[gpu][mixed_precision]") {
  struct Case {
    Shape x;
    int64_t units;
  };
  for (const HalfFormat& h : kFormats) {
    for (const Case& c : {Case{{4, 33}, 10}, Case{{5, 7, 16}, 9}}) {
      INFO(dtype_name(h.dtype) << ", input " << shape_str(c.x) << ", units " << c.units);
      auto [a, b] = twins<Dense>({c.x}, c.units, DenseOptions{.use_bias = true}, "mp_dense");
      REQUIRE(a->weight().cast_for_compute);
      set_both(*a->bias(), *b->bias(), "mp_dense_bias", -0.5f, 0.5f);
      MixedRun r = run_mixed(*a, *b, test::random_tensor(c.x, "mp_dense_x"), h.dtype, true, "mp_dense");
      AbsSums s = abs_sums<Dense>(r, a->weight().value, c.units, DenseOptions{.use_bias = true}, "mp_dense");
      const int64_t in = c.x.back(), rows = r.x.numel() / in;
      // Half results: one rounding (u |y|), the f32 accumulation and the 2 u S allowance
      // (see the top).
      require_within(r.y_gpu, r.y_cpu, h.tiny, h.u, s.y, 3 * h.u + in * kAccumulation, "y");
      require_within(r.dx_gpu, r.dx_cpu, h.tiny, h.u, s.dx, 3 * h.u + c.units * kAccumulation, "dx");
      // dW goes from the half operands straight into the f32 gradient (cublasGemmEx with an
      // f32 C): only f32 accumulation and the f32 rounding of g + dW (2^-24 on each side).
      // A weight gradient rounded to the half format on the way would err by u |dW|, which
      // this bound does not allow.
      require_within(b->weight().grad, a->weight().grad, 0.0, kUlp, s.dw, rows * kAccumulation, "dW");
      // f32 channel sums of the same (half) dy values, in another order.
      require_close(b->bias()->grad, a->bias()->grad, dot_atol(rows, 1, 1, kUnitFp32), kUlp, "db");
    }
  }
}

TEST_CASE("Conv2D on CUDA in f16 and bf16 matches the f32 CPU engine", "[gpu][mixed_precision]") {
  struct Case {
    Shape x;
    int64_t filters, kernel, stride, padding;
    bool bias;
  };
  for (const HalfFormat& h : kFormats) {
    for (const Case& c : {Case{{2, 3, 9, 9}, 8, 3, 1, 1, true}, Case{{2, 4, 10, 11}, 5, 3, 2, 1, false},
                          Case{{2, 8, 8, 8}, 16, 3, 2, 1, true}, Case{{3, 16, 6, 6}, 8, 1, 1, 0, false}}) {
      INFO(dtype_name(h.dtype) << ", input " << shape_str(c.x) << ", filters " << c.filters << ", kernel "
                               << c.kernel << ", stride " << c.stride << ", padding " << c.padding
                               << (c.bias ? ", bias" : ""));
      const Conv2DOptions opts{.stride = c.stride, .padding = c.padding, .use_bias = c.bias};
      auto [a, b] = twins<Conv2D>({c.x}, c.filters, c.kernel, opts, "mp_conv");
      REQUIRE(a->weight().cast_for_compute);
      if (c.bias) set_both(*a->bias(), *b->bias(), "mp_conv_bias", -0.5f, 0.5f);
      MixedRun r = run_mixed(*a, *b, test::random_tensor(c.x, "mp_conv_x"), h.dtype, true, "mp_conv");
      AbsSums s = abs_sums<Conv2D>(r, a->weight().value, c.filters, c.kernel, opts, "mp_conv");
      const Shape& ys = r.y_cpu.shape();
      const int64_t k_fwd = c.x[1] * c.kernel * c.kernel;
      const int64_t k_data = c.filters * c.kernel * c.kernel;  // at most; fewer with stride > 1
      const int64_t k_filter = ys[0] * ys[2] * ys[3];
      require_within(r.y_gpu, r.y_cpu, h.tiny, h.u, s.y, 3 * h.u + k_fwd * kAccumulation, "y");
      require_within(r.dx_gpu, r.dx_cpu, h.tiny, h.u, s.dx, 3 * h.u + k_data * kAccumulation, "dx");
      // cuDNN writes the filter gradient in the half format (one rounding, u |dW| <= u S),
      // then it is added to the f32 gradient in float (2^-24 of the result on each side).
      require_within(b->weight().grad, a->weight().grad, h.tiny, kUlp, s.dw, 3 * h.u + k_filter * kAccumulation,
                     "dW");
      if (c.bias) {
        require_close(b->bias()->grad, a->bias()->grad, dot_atol(k_filter, 1, 1, kUnitFp32), kUlp, "db");
      }
    }
  }
}

TEST_CASE("Conv2D on CUDA in f16 and bf16 as a first layer: no input gradient, none planned",
          "[gpu][mixed_precision]") {
  for (const HalfFormat& h : kFormats) check_first_layer_conv(h);
}

// Run by the CTest entry train_mixed_precision_cuda_deterministic with TNT_DETERMINISTIC=1, where
// only deterministic algorithms count (fewer for half data with 3 channels).
TEST_CASE("Conv2D on CUDA in f16 and bf16 as a first layer, deterministic mode", "[.deterministic]") {
  REQUIRE(tnt::config().deterministic);
  for (const HalfFormat& h : kFormats) check_first_layer_conv(h);
}

TEST_CASE("BatchNorm on CUDA in f16 and bf16 (cuDNN's mixed mode) matches the f32 CPU engine",
          "[gpu][mixed_precision]") {
  for (const HalfFormat& h : kFormats) {
    for (const Shape& xs : {Shape{16, 6}, Shape{4, 5, 6, 7}}) {
      INFO(dtype_name(h.dtype) << ", input " << shape_str(xs));
      auto [a, b] = twins<BatchNorm>({xs}, BatchNormOptions{}, "mp_bn");
      auto pa = a->parameters(), pb = b->parameters();
      auto ba = a->buffers(), bb = b->buffers();
      for (size_t i = 0; i < pa.size(); ++i) set_both(*pa[i], *pb[i], "mp_bn_" + pa[i]->name, -0.5f, 0.5f);
      for (size_t i = 0; i < ba.size(); ++i) {
        // The statistics only: num_batches_tracked is an i64 count, left at 0 on both.
        if (ba[i]->value.dtype() != DType::f32) continue;
        const bool var = ba[i]->name == "running_var";
        set_both(*ba[i], *bb[i], "mp_bn_" + ba[i]->name, var ? 0.5f : -0.5f, var ? 2.0f : 0.5f);
      }
      for (Parameter* p : pb) REQUIRE(p->value.dtype() == DType::f32);  // f32 affine parameters
      MixedRun r = run_mixed(*a, *b, test::random_tensor(xs, "mp_bn_x", -2.0f, 3.0f), h.dtype, true, "mp_bn");
      const int64_t m = r.x.numel() / xs[1];  // values per channel
      // cuDNN reads the half x exactly and computes in float: the statistics differ from
      // the CPU's only by f32 summation order (1e-4 absolute, as in the f32 test of
      // test_layers_cuda.cpp), and y and dx are rounded once to the half format.
      require_within(r.y_gpu, r.y_cpu, h.tiny + 1e-4, h.u + 1e-4, Tensor(), 0.0, "y");
      require_within(r.dx_gpu, r.dx_cpu, h.tiny + 1e-4, h.u + 1e-4, Tensor(), 0.0, "dx");
      // f32 sums of identical half values into the f32 gradients: the f32 test's bounds.
      const double atol = static_cast<double>(m) * 4e-5 + dot_atol(m, 1, 4, kUnitFp32);
      require_close(b->weight()->grad, a->weight()->grad, atol, kUlp, "dgamma");
      require_close(b->bias()->grad, a->bias()->grad, dot_atol(m, 1, 1, kUnitFp32), kUlp, "dbeta");
      require_close(b->running_mean().value, a->running_mean().value, 1e-5, 1e-5, "running_mean");
      require_close(b->running_var().value, a->running_var().value, 1e-5, 1e-5, "running_var");
    }
  }
}

TEST_CASE("ReLU, MaxPool2D and GlobalAveragePool on CUDA in f16 and bf16 match the f32 CPU engines",
          "[gpu][mixed_precision]") {
  for (const HalfFormat& h : kFormats) {
    INFO(dtype_name(h.dtype));
    {
      auto [a, b] = twins<ReLU>({{3, 100}}, "mp_relu");
      Tensor x = test::random_tensor({3, 100}, "mp_relu_x");
      for (int i = 0; i < 300; i += 7) x.data<float>()[i] = 0.0f;  // the kink
      MixedRun r = run_mixed(*a, *b, x, h.dtype, true, "mp_relu");
      // A comparison and a copy of representable values: exact.
      require_equal(r.y_gpu, r.y_cpu, "relu y");
      require_equal(r.dx_gpu, r.dx_cpu, "relu dx");
    }
    struct Pool {
      Shape x;
      int64_t pool, stride, padding;
    };
    for (const Pool& c : {Pool{{2, 3, 8, 8}, 2, 0, 0}, Pool{{2, 3, 9, 9}, 3, 2, 1}}) {
      INFO("max pool " << c.pool << " stride " << c.stride << " on " << shape_str(c.x));
      auto [a, b] = twins<MaxPool2D>({c.x}, c.pool, c.stride, c.padding, "mp_maxpool");
      // Rounding makes ties likely; both engines send the gradient to the first maximum.
      MixedRun r = run_mixed(*a, *b, test::random_tensor(c.x, "mp_maxpool_x"), h.dtype, true, "mp_maxpool");
      require_equal(r.y_gpu, r.y_cpu, "maxpool y");  // a selection: exact
      // Overlapping windows add up to 4 values of |dy| <= 1 in float, then one rounding.
      require_within(r.dx_gpu, r.dx_cpu, h.tiny + 8 * 9 * kUnitFp32, h.u, Tensor(), 0.0, "maxpool dx");
    }
    {
      auto [a, b] = twins<GlobalAveragePool>({{2, 3, 7, 5}}, "mp_gap");
      MixedRun r = run_mixed(*a, *b, test::random_tensor({2, 3, 7, 5}, "mp_gap_x"), h.dtype, true, "mp_gap");
      // A float mean of 35 values in [-1, 1] (36 f32 roundings), then one half rounding.
      require_within(r.y_gpu, r.y_cpu, h.tiny + 36 * kUnitFp32, h.u, Tensor(), 0.0, "gap y");
      // dy * (1/35) in float, then one half rounding.
      require_within(r.dx_gpu, r.dx_cpu, h.tiny, h.u + 2 * kUlp, Tensor(), 0.0, "gap dx");
    }
  }
}

TEST_CASE("Softmax, Dropout and AvgPool2D on CUDA in f16 and bf16 match the f32 CPU engines",
          "[gpu][mixed_precision]") {
  for (const HalfFormat& h : kFormats) {
    INFO(dtype_name(h.dtype));
    {
      auto [a, b] = twins<Softmax>({{6, 10}}, -1, "mp_softmax");
      MixedRun r = run_mixed(*a, *b, test::random_tensor({6, 10}, "mp_softmax_x", -4.0f, 4.0f), h.dtype, true,
                             "mp_softmax");
      // The f32 test's relative error of y (exp and a sum of K = 10 terms), one rounding.
      const double rel = 1e-5 + 10 * kUnitFp32;
      require_within(r.y_gpu, r.y_cpu, h.tiny, h.u + rel, Tensor(), 0.0, "softmax y");
      // dx_i = y_i (dy_i - s), s = sum dy_j y_j, from the saved half y (relative error
      // u + rel): |dx error| <= (u + rel) y_i (|dy_i - s| + 1) <= 3 (u + rel) max y, and one
      // rounding of dx.
      require_within(r.dx_gpu, r.dx_cpu, h.tiny + 3 * (h.u + rel) * max_abs(r.y_cpu), h.u, Tensor(), 0.0,
                     "softmax dx");
    }
    {
      auto [a, b] = twins<Dropout>({{4, 50}}, 0.3, "mp_dropout");
      MixedRun r = run_mixed(*a, *b, test::random_tensor({4, 50}, "mp_dropout_x"), h.dtype, true, "mp_dropout");
      // The same Philox mask; x * (1 / 0.7) in float, rounded once to the half format.
      require_within(r.y_gpu, r.y_cpu, h.tiny, h.u, Tensor(), 0.0, "dropout y");
      require_within(r.dx_gpu, r.dx_cpu, h.tiny, h.u, Tensor(), 0.0, "dropout dx");
    }
    {
      auto [a, b] = twins<AvgPool2D>({{2, 2, 7, 7}}, 3, 2, 1, "mp_avgpool");
      MixedRun r =
          run_mixed(*a, *b, test::random_tensor({2, 2, 7, 7}, "mp_avgpool_x"), h.dtype, true, "mp_avgpool");
      // cuDNN does not document its accumulator for half pooling: allow the <= 9 window
      // values (|x| <= 1) to be summed in the half format (8 roundings of at most u times
      // the window's magnitude sum, divided by the count), plus the final rounding.
      require_within(r.y_gpu, r.y_cpu, h.tiny + 8 * h.u, h.u, Tensor(), 0.0, "avgpool y");
      // dx gathers dy / count from at most 4 overlapping windows: 4 roundings likewise.
      require_within(r.dx_gpu, r.dx_cpu, h.tiny + 4 * h.u, h.u, Tensor(), 0.0, "avgpool dx");
    }
  }
}

TEST_CASE("ops::has_non_finite over a list of CUDA tensors", "[gpu][mixed_precision]") {
  // Tensors of several dtypes and sizes (one large enough for a grid-stride loop with many
  // blocks, an empty one, an integer one that cannot hold a NaN).
  auto make = [](int64_t n, DType dtype, int64_t bad_at, float bad) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i % 17) - 8) * 0.25f;
    if (bad_at >= 0) v[static_cast<size_t>(bad_at)] = bad;
    return ops::cast(Tensor::from_vector(v, {n}), dtype).to(gpu());
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto list = [&](int64_t inf_in_third, int64_t nan_in_bf16) {
    return std::vector<Tensor>{make(1000, DType::f32, -1, 0), make(37, DType::bf16, nan_in_bf16, nan),
                               make(300007, DType::f16, inf_in_third, inf), Tensor::empty({0}, DType::f32, gpu()),
                               Tensor::zeros({5}, DType::i64, gpu()), make(3, DType::f32, -1, 0)};
  };
  CHECK_FALSE(ops::has_non_finite(std::vector<Tensor>{}));
  CHECK_FALSE(ops::has_non_finite(list(-1, -1)));
  {
    INFO("an infinity in the last element of the third tensor");
    std::vector<Tensor> xs = list(300006, -1);
    CHECK(ops::has_non_finite(xs));
    std::vector<Tensor> host;
    for (const Tensor& x : xs) host.push_back(x.to(Device::cpu()));
    CHECK(ops::has_non_finite(host));  // the CPU engine agrees
  }
  {
    INFO("a NaN in the bf16 tensor");
    CHECK(ops::has_non_finite(list(-1, 20)));
  }
  {
    INFO("a value beyond f16's range became an infinity on conversion");
    CHECK(ops::has_non_finite(std::vector<Tensor>{make(10, DType::f16, 4, 1e5f)}));
  }
  // The flag is reset for every call.
  CHECK_FALSE(ops::has_non_finite(list(-1, -1)));
}

TEST_CASE("accumulate_as_float adds half values to an f32 tensor exactly", "[gpu][mixed_precision]") {
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    INFO(dtype_name(dtype));
    // Multiples of 1/8 up to 32: exact in every format and in every f32 sum here.
    std::vector<float> src(1001), dst(1001), want(1001);
    for (size_t i = 0; i < src.size(); ++i) {
      src[i] = static_cast<float>(static_cast<int>(i % 257) - 128) / 8.0f;
      dst[i] = static_cast<float>(i % 13) * 0.5f;
      want[i] = dst[i] + src[i];
    }
    Tensor s = ops::cast(Tensor::from_vector(src, {7, 143}), dtype).to(gpu());
    Tensor d = Tensor::from_vector(dst, {1001}).to(gpu());
    cuda::accumulate_as_float(s, d);
    CHECK(d.to_vector() == want);
  }
  Tensor bad = Tensor::zeros({4}, DType::bf16, gpu());
  CHECK_THROWS_AS(cuda::accumulate_as_float(Tensor::zeros({4}, DType::f32, gpu()), bad), Error);
}

TEST_CASE("a bf16 network on CUDA tracks the f32 network on the CPU", "[gpu][mixed_precision]") {
  auto make = [] {
    return std::make_shared<Sequential>(
        // No conv bias (as in ResNet): BatchNorm removes it, so its exact gradient is 0 and
        // both sides would only compare rounding noise.
        std::vector<LayerPtr>{std::make_shared<Conv2D>(8, 3, Conv2DOptions{.stride = 1, .padding = 1, .use_bias = false},
                                                       "conv"),
                              std::make_shared<BatchNorm>("bn"), std::make_shared<ReLU>("relu"),
                              std::make_shared<GlobalAveragePool>("gap"),
                              std::make_shared<Dense>(5, DenseOptions{}, "fc")},
        "mixed");
  };
  const Shape xs{8, 3, 8, 8};
  auto ref = make();
  auto net = make();
  ref->build({3, 8, 8});
  net->build({3, 8, 8});
  net->to(gpu());
  ref->initialize(5);
  net->initialize(5);
  net->set_compute_dtype(DType::bf16);
  REQUIRE(net->compute_dtype() == DType::bf16);

  Tensor x = test::random_tensor(xs, "mpnet_x", -2.0f, 2.0f);
  Tensor dy = test::random_tensor({8, 5}, "mpnet_dy");
  std::vector<Tensor> y_ref = ref->forward({x}, context(true, Device::cpu()));
  std::vector<Tensor> y = net->forward({x.to(gpu())}, context(true, gpu()));
  REQUIRE(y.size() == 1);
  REQUIRE(y[0].dtype() == DType::f32);  // the loss sees f32
  REQUIRE(y[0].device() == gpu());
  ref->zero_grad();
  net->zero_grad();
  std::vector<Tensor> dx_ref = ref->backward({dy}, context(true, Device::cpu()));
  std::vector<Tensor> dx = net->backward({dy.to(gpu())}, context(true, gpu()));

  // Loose, stated: about 8 roundings of relative size u = 2^-8 lie on the path from the
  // input to the output (input, conv weight, conv output, bn output, pool output, fc
  // weight, fc output; ReLU is exact), each carried on with a gain of about 1: 16 u of the
  // largest output (a factor 2 of margin), about 6% (the CPU's bf16 emulation of this
  // network: 1 u). A wrong layer, index or dtype errs by the size of the output itself.
  const double u = kUnitBf16;
  require_close(y[0], y_ref[0], 16 * u * max_abs(y_ref[0]), 16 * u, "network output");
  // Gradients: the ReLU decides. Where its input lies within a few u of 0 the two sides
  // may disagree on the sign, and that element's gradient differs entirely; such elements
  // are a fraction of about u of the batch, so the gradients below the ReLU differ by about
  // sqrt(u) in norm rather than u (the CPU's own bf16 emulation of this network against
  // f32: 0.9 sqrt(u) for the input and conv weight gradients, 0.1 sqrt(u) or less for the
  // others; without the ReLU, about u everywhere). Bound: 3 sqrt(u) = 19% of each
  // gradient's norm. Loose, but a gradient that is missing, doubled, of the wrong sign or
  // in the wrong place errs by 100% or more.
  const double rel = 3 * std::sqrt(u);
  REQUIRE(dx.size() == 1);
  REQUIRE(dx_ref.size() == 1);
  require_norm_close(dx[0], dx_ref[0], rel, "input gradient");
  std::vector<NamedParameter> pr = ref->named_parameters(), pn = net->named_parameters();
  REQUIRE(pr.size() == pn.size());
  for (size_t i = 0; i < pr.size(); ++i) {
    INFO(pr[i].name);
    REQUIRE(pn[i].name == pr[i].name);
    REQUIRE(pn[i].param->value.dtype() == DType::f32);  // master weights
    REQUIRE(pn[i].param->grad.dtype() == DType::f32);
    if (pn[i].param->cast_for_compute) {
      REQUIRE(pn[i].param->compute.dtype() == DType::bf16);  // kept by the network
      // The copy is the master weight rounded to bf16.
      require_equal(pn[i].param->compute, rounded(pr[i].param->value, DType::bf16), "compute copy");
    }
    require_norm_close(pn[i].param->grad, pr[i].param->grad, rel, "gradient");
  }
  // Running statistics (momentum 0.1 from mean 0, var 1): cuDNN's f32 statistics of the
  // bf16 conv outputs. Each output carries a few roundings of relative size u (weights,
  // products, storage), so a channel's batch mean moves by a few u sigma and its variance
  // by a few u var; the means themselves are near 0 (zero-mean inputs), hence the scale is
  // the channel's standard deviation, not the mean. 4 u sigma and 8 u var, times 0.1.
  auto buffer = [](Network& n, const std::string& name) {
    for (auto& p : n.named_buffers())
      if (p.name == name) return p.param->value;
    FAIL("no buffer " << name);
    return Tensor();
  };
  const Tensor mean_ref = buffer(*ref, "bn.running_mean"), var_ref = buffer(*ref, "bn.running_var");
  double var_max = 0;  // the largest batch variance, from running_var = 0.9 + 0.1 var
  for (double v : var_ref.to_double_vector()) var_max = std::max(var_max, (v - 0.9) / 0.1);
  REQUIRE(var_max > 0);
  require_close(buffer(*net, "bn.running_mean"), mean_ref, 0.1 * 4 * u * std::sqrt(var_max), 0.0, "running_mean");
  require_close(buffer(*net, "bn.running_var"), var_ref, 0.1 * 8 * u * var_max, 0.0, "running_var");
}
