// Sigmoid, Tanh and LeakyReLU: the CUDA engines against the CPU engines on the same inputs,
// forward and backward, including NaN and infinities and half inputs (label gpu).
// The vectorised kernels of every element-wise activation: the 16-byte path (aligned
// tensors) and the scalar path (views at byte offsets 2, 4, 8) give the same bits, and
// ReLU and LeakyReLU equal host arithmetic; outputs keep the channels_last format.
#include "gpu_test_util.hpp"

#include "backend/cuda/elementwise_plan.hpp"
#include "core/half.hpp"
#include "layers/activation_math.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>

using namespace tnt;
using tnt::test::gpu;
using tnt::test::require_close;
using tnt::test::require_equal;

namespace {

RunContext context(Device device) {
  RunContext rc;
  rc.training = true;
  rc.seed = 99;
  rc.device = device;
  return rc;
}

struct Run {
  Tensor y_cpu, y_gpu, dx_cpu, dx_gpu;
};

// The same layer built twice (no parameters), one on each device; forward on x, backward
// with one random dy.
Run run_both(Layer& cpu, Layer& cuda, const Tensor& x, const std::string& key) {
  cuda.to(gpu());
  Run r;
  SavedState sc, sg;
  r.y_cpu = cpu.forward({x}, context(Device::cpu()), sc)[0];
  r.y_gpu = cuda.forward({x.to(gpu())}, context(gpu()), sg)[0];
  REQUIRE(r.y_gpu.device() == gpu());
  REQUIRE(r.y_gpu.shape() == r.y_cpu.shape());
  const Tensor dy = test::random_tensor(x.shape(), key + "_dy");
  r.dx_cpu = cpu.backward({dy}, context(Device::cpu()), sc)[0];
  r.dx_gpu = cuda.backward({dy.to(gpu())}, context(gpu()), sg)[0];
  REQUIRE(r.dx_gpu.shape() == r.dx_cpu.shape());
  return r;
}

// NaN, infinities, signed zeros and ordinary values, twice (so that a {2, 10} tensor has
// the specials at both ends).
Tensor specials() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {nan, -nan, inf, -inf, 0.0f, -0.0f, 0.5f, -0.5f, 30.0f, -30.0f};
  v.insert(v.end(), v.rbegin(), v.rend());
  return Tensor::from_vector(v, {2, 10});
}

}  // namespace

TEST_CASE("Sigmoid and Tanh: CUDA engines match the CPU engines", "[gpu][layers]") {
  const Tensor x = test::random_tensor({4, 1000}, "act_x", -12.0f, 12.0f);
  Sigmoid sa("sigmoid"), sb("sigmoid");
  Run s = run_both(sa, sb, x, "sigmoid");
  // The same float formula (activation_math.hpp) on both sides, with the device's expf and
  // division against the host's: each within 2 ulps, so a few ulps of O(1) values.
  require_close(s.y_gpu, s.y_cpu, 1e-7, 1e-6, "sigmoid y");
  // dy * y (1 - y): y's few ulps, amplified by the cancellation in 1 - y up to y / (1 - y);
  // with |x| <= 12, 1 - y >= 6e-6, so an absolute 1e-6 on |dx| <= 0.25 * |dy| holds it.
  require_close(s.dx_gpu, s.dx_cpu, 1e-6, 1e-5, "sigmoid dx");
  Tanh ta("tanh"), tb("tanh");
  Run t = run_both(ta, tb, x, "tanh");
  // tanhf on the device (2 ulps, CUDA's documented bound) against the host's.
  require_close(t.y_gpu, t.y_cpu, 1e-7, 1e-6, "tanh y");
  require_close(t.dx_gpu, t.dx_cpu, 1e-6, 1e-5, "tanh dx");
}

TEST_CASE("LeakyReLU: CUDA engine equals the CPU engine, gradient alpha at 0", "[gpu][layers]") {
  Tensor x = test::random_tensor({3, 100}, "leaky_x");
  for (int i = 0; i < 300; i += 7) x.data<float>()[i] = 0.0f;  // exact zeros: the kink
  LeakyReLU a(0.2, "leaky"), b(0.2, "leaky");
  Run r = run_both(a, b, x, "leaky");
  require_equal(r.y_gpu, r.y_cpu, "y");  // a comparison and one float product: exact
  require_equal(r.dx_gpu, r.dx_cpu, "dx");
}

TEST_CASE("Sigmoid, Tanh and LeakyReLU on CUDA: NaN and infinities as on the CPU", "[gpu][layers]") {
  const Tensor x = specials();
  std::vector<std::pair<std::shared_ptr<Layer>, std::shared_ptr<Layer>>> layers = {
      {std::make_shared<Sigmoid>("s"), std::make_shared<Sigmoid>("s")},
      {std::make_shared<Tanh>("t"), std::make_shared<Tanh>("t")},
      {std::make_shared<LeakyReLU>(0.5, "l"), std::make_shared<LeakyReLU>(0.5, "l")}};
  for (auto& [cpu, cuda] : layers) {
    INFO(cpu->type());
    Run r = run_both(*cpu, *cuda, x, "special_" + cpu->type());
    std::vector<float> yc = r.y_cpu.to_vector(), yg = r.y_gpu.to_vector();
    std::vector<float> dc = r.dx_cpu.to_vector(), dg = r.dx_gpu.to_vector();
    for (size_t i = 0; i < yc.size(); ++i) {
      INFO("element " << i);
      // NaN where the CPU has NaN, the same saturated value at the infinities.
      CHECK(std::isnan(yg[i]) == std::isnan(yc[i]));
      if (!std::isnan(yc[i])) CHECK(yg[i] == Approx(yc[i]).margin(1e-6));
      CHECK(std::isnan(dg[i]) == std::isnan(dc[i]));
      if (!std::isnan(dc[i])) CHECK(dg[i] == Approx(dc[i]).margin(1e-6));
    }
  }
}

TEST_CASE("Sigmoid, Tanh and LeakyReLU on CUDA: f16 and bf16 inputs against the f32 CPU engine", "[gpu][layers]") {
  for (DType dt : {DType::f16, DType::bf16}) {
    // u: the half type's unit roundoff. The device computes in float from the half x and
    // rounds y once to the half type; the CPU engine gets the same half values widened, so
    // y differs by that rounding: u relative (plus float ulps, far smaller).
    const double u = dt == DType::f16 ? test::kUnitF16 : test::kUnitBf16;
    INFO(dtype_name(dt));
    const Tensor x_half = ops::cast(test::random_tensor({4, 300}, "act_half_x", -6.0f, 6.0f), dt);
    const Tensor dy_half = ops::cast(test::random_tensor({4, 300}, "act_half_dy"), dt);
    const Tensor x = ops::cast(x_half, DType::f32), dy = ops::cast(dy_half, DType::f32);
    struct Case {
      std::shared_ptr<Layer> cpu, cuda;
      double dx_atol;  // see below
    };
    // Backward on the device starts from the half y (Sigmoid, Tanh), off by u |y| <= u: the
    // derivative y (1 - y) moves by at most |1 - 2y| <= 1 times that, 1 - y^2 by |2y| <= 2
    // times; times |dy| <= 1, plus dx's own rounding (the rtol). LeakyReLU's branch and
    // factor are exact.
    std::vector<Case> cases = {{std::make_shared<Sigmoid>("s"), std::make_shared<Sigmoid>("s"), 2 * u},
                               {std::make_shared<Tanh>("t"), std::make_shared<Tanh>("t"), 3 * u},
                               {std::make_shared<LeakyReLU>(0.3, "l"), std::make_shared<LeakyReLU>(0.3, "l"), 0.0}};
    for (Case& c : cases) {
      INFO(c.cpu->type());
      c.cuda->to(gpu());
      SavedState sc, sg;
      const Tensor y_cpu = c.cpu->forward({x}, context(Device::cpu()), sc)[0];
      const Tensor y_gpu = c.cuda->forward({x_half.to(gpu())}, context(gpu()), sg)[0];
      REQUIRE(y_gpu.dtype() == dt);
      require_close(ops::cast(y_gpu, DType::f32), y_cpu, 1e-6, 2 * u, "y");
      const Tensor dx_cpu = c.cpu->backward({dy}, context(Device::cpu()), sc)[0];
      const Tensor dx_gpu = c.cuda->backward({dy_half.to(gpu())}, context(gpu()), sg)[0];
      REQUIRE(dx_gpu.dtype() == dt);
      require_close(ops::cast(dx_gpu, DType::f32), dx_cpu, c.dx_atol + 1e-6, 2 * u, "dx");
    }
  }
}

// ---- Vector and scalar paths of the element-wise activations ----

namespace {

const std::vector<int64_t> kCounts = {0, 1, 7, 8, 9, 1023, 4096 + 3};

// The values of `host` in a GPU buffer at `offset` bytes past a 16-byte aligned address
// (offset 0: the vector path; 2, 4, 8: the scalar path). The buffer lives as long as the view.
Tensor place(const Tensor& host, size_t offset) {
  Tensor buffer = Tensor::empty({static_cast<int64_t>(host.nbytes() + 32)}, DType::u8, gpu());
  const auto base = reinterpret_cast<std::uintptr_t>(buffer.raw());
  Tensor view = buffer.view(host.shape(), host.dtype(), (16 - base % 16) % 16 + offset);
  if (host.numel() > 0) view.copy_from(host);
  REQUIRE(cuda::aligned_for_vectors(view.raw()) == (offset == 0));
  return view;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  const auto* b = static_cast<const uint8_t*>(h.raw());
  return std::vector<uint8_t>(b, b + h.nbytes());
}

float get(const Tensor& h, int64_t i) {
  switch (h.dtype()) {
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(h.raw())[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(h.raw())[i]);
    default: return static_cast<const float*>(h.raw())[i];
  }
}

void put(const Tensor& h, int64_t i, float v) {
  switch (h.dtype()) {
    case DType::f16: static_cast<uint16_t*>(h.raw())[i] = float_to_f16(v); break;
    case DType::bf16: static_cast<uint16_t*>(h.raw())[i] = float_to_bf16(v); break;
    default: static_cast<float*>(h.raw())[i] = v; break;
  }
}

// Values of dt on the host with exact zeros of both signs sprinkled in (ReLU's kink).
Tensor inputs_of(DType dt, int64_t n, const std::string& key) {
  Tensor f = test::random_tensor({1, n}, key, -4.0f, 4.0f);
  for (int64_t i = 0; i < n; i += 5) static_cast<float*>(f.raw())[i] = (i % 10 == 0) ? 0.0f : -0.0f;
  return dt == DType::f32 ? f : ops::cast(f, dt);
}

struct Result {
  Tensor y, dx;
};

// Forward on x and backward with dy, both placed at `offset`, on a fresh layer.
Result run_at(const std::function<std::shared_ptr<Layer>()>& make, const Tensor& x, const Tensor& dy, size_t offset) {
  std::shared_ptr<Layer> layer = make();
  layer->to(gpu());
  SavedState saved;
  Result r;
  r.y = layer->forward({place(x, offset)}, context(gpu()), saved)[0];
  r.dx = layer->backward({place(dy, offset)}, context(gpu()), saved)[0];
  return r;
}

// Value equality (NaN equal to NaN, -0 equal to +0: the host reference and the device may
// pick different zeros for "0" and "x <= 0 ? 0 : x", which compare equal).
void require_same_values(const Tensor& gpu_result, const Tensor& expected, const std::string& what) {
  INFO(what);
  REQUIRE(gpu_result.numel() == expected.numel());
  Tensor g = gpu_result.to(Device::cpu());
  int64_t bad = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const float a = get(g, i), b = get(expected, i);
    if (!(a == b || (std::isnan(a) && std::isnan(b)))) ++bad;
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("Element-wise activations on CUDA: vector and scalar paths give the same bits", "[gpu][layers][vector]") {
  const std::vector<std::pair<std::string, std::function<std::shared_ptr<Layer>()>>> layers = {
      {"ReLU", [] { return std::make_shared<ReLU>("relu"); }},
      {"LeakyReLU", [] { return std::make_shared<LeakyReLU>(0.2, "leaky"); }},
      {"GELU tanh", [] { return std::make_shared<GELU>(true, "gelu"); }},
      {"GELU erf", [] { return std::make_shared<GELU>(false, "gelu"); }},
      {"Sigmoid", [] { return std::make_shared<Sigmoid>("sigmoid"); }},
      {"Tanh", [] { return std::make_shared<Tanh>("tanh"); }}};
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (int64_t n : kCounts) {
      const Tensor x = inputs_of(dt, n, "vec_act_x");
      const Tensor dy = inputs_of(dt, n, "vec_act_dy");
      for (const auto& [name, make] : layers) {
        const Result aligned = run_at(make, x, dy, 0);
        REQUIRE(aligned.y.dtype() == dt);
        for (size_t offset : {size_t{2}, size_t{4}, size_t{8}}) {
          if (offset % dtype_size(dt) != 0) continue;  // an f32 view must stay 4-byte aligned
          INFO(name << " " << dtype_name(dt) << " n " << n << " offset " << offset);
          const Result scalar = run_at(make, x, dy, offset);
          CHECK(bytes_of(scalar.y) == bytes_of(aligned.y));
          CHECK(bytes_of(scalar.dx) == bytes_of(aligned.dx));
        }
      }
    }
  }
}

TEST_CASE("ReLU and LeakyReLU on CUDA equal host arithmetic on both paths", "[gpu][layers][vector]") {
  const float alpha = 0.2f;
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (int64_t n : kCounts) {
      const Tensor x = inputs_of(dt, n, "relu_host_x");
      const Tensor dy = inputs_of(dt, n, "relu_host_dy");
      // The device lines, on the host: a comparison, and for LeakyReLU one float product,
      // rounded to dt as from_float does (to nearest even).
      Tensor relu_y = x.clone(), relu_dx = x.clone(), leaky_y = x.clone(), leaky_dx = x.clone();
      for (int64_t i = 0; i < n; ++i) {
        const float xv = get(x, i), dyv = get(dy, i);
        put(relu_y, i, xv > 0.0f ? xv : 0.0f);
        put(relu_dx, i, xv > 0.0f ? dyv : 0.0f);
        put(leaky_y, i, act::leaky_relu(xv, alpha));
        put(leaky_dx, i, dyv * act::leaky_relu_derivative(xv, alpha));
      }
      for (size_t offset : {size_t{0}, size_t{4}, size_t{8}}) {
        INFO(dtype_name(dt) << " n " << n << " offset " << offset);
        const Result relu = run_at([] { return std::make_shared<ReLU>("relu"); }, x, dy, offset);
        require_same_values(relu.y, relu_y, "ReLU y");
        require_same_values(relu.dx, relu_dx, "ReLU dx");
        const Result leaky = run_at([&] { return std::make_shared<LeakyReLU>(alpha, "leaky"); }, x, dy, offset);
        require_same_values(leaky.y, leaky_y, "LeakyReLU y");
        require_same_values(leaky.dx, leaky_dx, "LeakyReLU dx");
      }
    }
  }
}

TEST_CASE("Activations on CUDA keep channels_last and refuse a gradient in the other format", "[gpu][layers][format]") {
  const Tensor x = test::random_tensor({2, 3, 4, 5}, "cl_act_x", -3.0f, 3.0f);
  const Tensor dy = test::random_tensor({2, 3, 4, 5}, "cl_act_dy");
  const Tensor xc = x.to(gpu()).to_memory_format(MemoryFormat::channels_last);
  const Tensor dyc = dy.to(gpu()).to_memory_format(MemoryFormat::channels_last);
  REQUIRE(xc.is_channels_last());
  const std::vector<std::pair<std::shared_ptr<Layer>, std::shared_ptr<Layer>>> layers = {
      {std::make_shared<ReLU>("r"), std::make_shared<ReLU>("r")},
      {std::make_shared<LeakyReLU>(0.1, "l"), std::make_shared<LeakyReLU>(0.1, "l")},
      {std::make_shared<GELU>(true, "g"), std::make_shared<GELU>(true, "g")},
      {std::make_shared<Sigmoid>("s"), std::make_shared<Sigmoid>("s")},
      {std::make_shared<Tanh>("t"), std::make_shared<Tanh>("t")}};
  for (auto& [cpu, cuda] : layers) {
    INFO(cpu->type());
    cuda->to(gpu());
    SavedState sc, sg;
    const Tensor y_cpu = cpu->forward({x}, context(Device::cpu()), sc)[0];
    const Tensor y_gpu = cuda->forward({xc}, context(gpu()), sg)[0];
    CHECK(y_gpu.is_channels_last());
    // Element-wise: the same float function of each element as in the contiguous tests
    // (here and test_transformer_layers_cuda.cpp's GELU): the device's expf/tanhf/erff
    // against the host's, a few float ulps of O(1) values; ReLU and LeakyReLU exact.
    require_close(y_gpu.contiguous(), y_cpu, 1e-6, 1e-5, "y");
    const Tensor dx_cpu = cpu->backward({dy}, context(Device::cpu()), sc)[0];
    const Tensor dx_gpu = cuda->backward({dyc}, context(gpu()), sg)[0];
    CHECK(dx_gpu.is_channels_last());
    require_close(dx_gpu.contiguous(), dx_cpu, 1e-6, 1e-5, "dx");
    // dy contiguous for a channels_last forward: element i would not be element i.
    CHECK_THROWS_WITH(cuda->backward({dy.to(gpu())}, context(gpu()), sg), Catch::Contains("memory formats"));
  }
}

TEST_CASE("Softmax on CUDA along any axis of a channels_last tensor", "[gpu][layers][format]") {
  const Tensor x = test::random_tensor({2, 3, 4, 5}, "cl_softmax_x", -4.0f, 4.0f);
  const Tensor dy = test::random_tensor({2, 3, 4, 5}, "cl_softmax_dy");
  for (int64_t axis : {int64_t{1}, int64_t{-1}, int64_t{2}, int64_t{0}}) {
    INFO("axis " << axis);
    Softmax cpu(axis, "softmax"), cuda(axis, "softmax");
    cuda.to(gpu());
    SavedState sc, sg;
    const Tensor y_cpu = cpu.forward({x}, context(Device::cpu()), sc)[0];
    const Tensor y_gpu = cuda.forward({x.to(gpu()).to_memory_format(MemoryFormat::channels_last)}, context(gpu()), sg)[0];
    CHECK(y_gpu.is_channels_last());
    // The tolerance of the contiguous Softmax test (test_layers_cuda.cpp): exp's few ulps
    // (1e-5 relative with margin) plus K * 2^-24 for the sum of K <= 5 terms.
    const double rel = 1e-5 + 5.0 * 5.9604644775390625e-08;
    require_close(y_gpu.contiguous(), y_cpu, 1e-9, rel, "y");
    const Tensor dx_cpu = cpu.backward({dy}, context(Device::cpu()), sc)[0];
    const Tensor dx_gpu =
        cuda.backward({dy.to(gpu()).to_memory_format(MemoryFormat::channels_last)}, context(gpu()), sg)[0];
    CHECK(dx_gpu.is_channels_last());
    require_close(dx_gpu.contiguous(), dx_cpu, 4.0 * rel, 4.0 * rel, "dx");
  }
}

TEST_CASE("Softmax on CUDA: f16 and bf16 inputs against the f32 CPU engine", "[gpu][layers]") {
  // cuDNN's softmax on half data (the transformer's and any mixed-precision network's): the
  // same half x on both sides, widened for the CPU. cuDNN does not document its internal
  // precision on half data: allow half arithmetic throughout, K + 2 roundings of the half
  // unit u for y (the K-term sum, exp, the division), twice that for dx.
  for (DType dt : {DType::f16, DType::bf16}) {
    const double u = dt == DType::f16 ? test::kUnitF16 : test::kUnitBf16;
    for (const auto& [shape, axis] : {std::pair{Shape{6, 10}, int64_t{-1}}, std::pair{Shape{3, 37, 4}, int64_t{1}}}) {
      INFO(dtype_name(dt) << " " << shape_str(shape) << " axis " << axis);
      const Tensor x_half = ops::cast(test::random_tensor(shape, "softmax_half_x", -4.0f, 4.0f), dt);
      const Tensor dy_half = ops::cast(test::random_tensor(shape, "softmax_half_dy"), dt);
      const Tensor x = ops::cast(x_half, DType::f32), dy = ops::cast(dy_half, DType::f32);
      const int64_t k = shape[static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(shape.size()) : axis)];
      const double rel = static_cast<double>(k + 2) * u;
      Softmax cpu(axis, "softmax"), cuda(axis, "softmax");
      cuda.to(gpu());
      SavedState sc, sg;
      const Tensor y_cpu = cpu.forward({x}, context(Device::cpu()), sc)[0];
      const Tensor y_gpu = cuda.forward({x_half.to(gpu())}, context(gpu()), sg)[0];
      REQUIRE(y_gpu.dtype() == dt);
      require_close(ops::cast(y_gpu, DType::f32), y_cpu, rel, rel, "y");
      const Tensor dx_cpu = cpu.backward({dy}, context(Device::cpu()), sc)[0];
      const Tensor dx_gpu = cuda.backward({dy_half.to(gpu())}, context(gpu()), sg)[0];
      REQUIRE(dx_gpu.dtype() == dt);
      require_close(ops::cast(dx_gpu, DType::f32), dx_cpu, 2 * rel, 2 * rel, "dx");
    }
  }
}
