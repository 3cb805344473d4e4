// Sigmoid, Tanh and LeakyReLU: the CUDA engines against the CPU engines on the same inputs,
// forward and backward, including NaN and infinities and half inputs (label gpu).
#include "gpu_test_util.hpp"

#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
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
