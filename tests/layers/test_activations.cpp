// Sigmoid, Tanh and LeakyReLU on the CPU: values against double-precision formulas, the
// finite-difference gradient check, NaN and infinities (the rule in layers/activation.hpp),
// and make_activation's names.
#include "gradcheck.hpp"

#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"

#include <cmath>
#include <functional>
#include <limits>

using namespace tnt;

namespace {

RunContext training() {
  RunContext rc;
  rc.training = true;
  rc.seed = 7;
  rc.step = 3;
  return rc;
}

struct Pass {
  std::vector<float> y, dx;
};

// Forward on x, then backward with dy = 1 everywhere (dx is the derivative itself).
Pass run(Layer& layer, const std::vector<float>& x) {
  SavedState s;
  const Shape shape{static_cast<int64_t>(x.size())};
  Pass p;
  p.y = layer.forward({Tensor::from_vector(x, shape)}, training(), s)[0].to_vector();
  p.dx = layer.backward({Tensor::full(shape, 1.0)}, training(), s)[0].to_vector();
  return p;
}

// Inputs from -30 to 30 (both sigmoid tails deep in saturation, and the region around 0).
std::vector<float> sweep() {
  std::vector<float> x;
  for (int i = -300; i <= 300; ++i) x.push_back(static_cast<float>(i) * 0.1f);
  for (float v : {1e-6f, -1e-6f, 1e-30f, 80.0f, -80.0f, 100.0f, -100.0f}) x.push_back(v);
  return x;
}

// The tolerance of a float result against the exact value: a few float ulps, relative.
// Sigmoid rounds expf (<= 1 ulp in glibc), one addition and one division, each half an ulp;
// tanhf is within 2 ulps. 8 ulps (8 * 2^-24 ~ 4.8e-7) covers either with room, and a wrong
// formula (a missing factor, the other tail's branch) is off by far more.
constexpr double kRel = 8.0 / 16777216.0;

void check_against(const std::vector<float>& x, const std::vector<float>& got,
                   const std::function<double(double)>& exact, const std::string& what) {
  REQUIRE(got.size() == x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = exact(static_cast<double>(x[i]));
    INFO(what << "(" << x[i] << "): got " << got[i] << ", want " << want);
    // The smallest normal float as an absolute floor: sigmoid(-100) ~ 3.7e-44 is a float
    // denormal, whose relative precision is lower.
    CHECK(std::fabs(got[i] - want) <= kRel * std::fabs(want) + 1.2e-38);
  }
}

// The message of the InputError that f throws (a failure when it throws nothing or another type).
std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError");
  return "";
}

}  // namespace

TEST_CASE("Sigmoid and Tanh values and derivatives against double-precision formulas", "[activations]") {
  const std::vector<float> x = sweep();
  Sigmoid sigmoid("sig");
  Pass s = run(sigmoid, x);
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  check_against(x, s.y, sig, "sigmoid");
  // dx = y (1 - y) from the float y: 1 - y cancels where y is near 1, so the derivative is
  // compared with the same formula on the float y (exact in double), not with sig' of x.
  std::vector<float> y = s.y;
  check_against(y, s.dx, [](double v) { return v * (1.0 - v); }, "sigmoid'");
  for (size_t i = 0; i < x.size(); ++i) {
    // No overflow in either tail, and the value is in [0, 1] everywhere.
    CHECK(s.y[i] >= 0.0f);
    CHECK(s.y[i] <= 1.0f);
  }

  Tanh tanh_layer("tanh");
  Pass t = run(tanh_layer, x);
  check_against(x, t.y, [](double v) { return std::tanh(v); }, "tanh");
  check_against(t.y, t.dx, [](double v) { return 1.0 - v * v; }, "tanh'");
  // Where 1 - y^2 does not cancel (|x| <= 1), against the exact derivative of x as well.
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) > 1.0f) continue;
    const double c = std::cosh(static_cast<double>(x[i]));
    INFO("tanh'(" << x[i] << ")");
    CHECK(t.dx[i] == Approx(1.0 / (c * c)).epsilon(1e-6));  // y's 2 ulps, times |2y| <= 1.6, over 1 - y^2 >= 0.42
  }
}

TEST_CASE("LeakyReLU: values, default alpha 0.3, the gradient at 0 is alpha", "[activations]") {
  LeakyReLU def("lr");
  CHECK(def.alpha() == 0.3);
  const std::vector<float> x = {-2.0f, -0.5f, 0.0f, -0.0f, 0.25f, 3.0f};
  Pass p = run(def, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const float alpha = 0.3f;
    INFO("x = " << x[i]);
    CHECK(p.y[i] == (x[i] > 0 ? x[i] : alpha * x[i]));  // one float product: exact equality
    CHECK(p.dx[i] == (x[i] > 0 ? 1.0f : alpha));
  }
  LeakyReLU torch_like(0.01, "lr_torch");
  Pass q = run(torch_like, {-100.0f, 7.0f});
  CHECK(q.y == std::vector<float>{-100.0f * 0.01f, 7.0f});
  // alpha 0 is ReLU on finite inputs (values and gradient).
  LeakyReLU zero(0.0, "lr0");
  ReLU relu("relu_ref");
  Pass z = run(zero, x), r = run(relu, x);
  CHECK(z.y == r.y);
  CHECK(z.dx == r.dx);
}

TEST_CASE("LeakyReLU rejects a negative or non-finite alpha, naming it", "[activations]") {
  const std::string m = input_error([] { LeakyReLU(-0.1, "bad"); });
  CHECK_THAT(m, Catch::Contains("'bad'") && Catch::Contains("alpha") && Catch::Contains("-0.1"));
  CHECK_THROWS_AS(LeakyReLU(std::numeric_limits<double>::quiet_NaN()), InputError);
  CHECK_THROWS_AS(LeakyReLU(std::numeric_limits<double>::infinity()), InputError);
}

TEST_CASE("gradient: Sigmoid, Tanh and LeakyReLU", "[grad][activations]") {
  Sigmoid sigmoid("sigmoid");
  test::check_layer(sigmoid, {test::random_tensor({3, 4, 5}, 1, "x", -4, 4)}, training());
  Tanh tanh_layer("tanh");
  test::check_layer(tanh_layer, {test::random_tensor({3, 4, 5}, 2, "x", -3, 3)}, training());
  for (double alpha : {0.3, 0.01, 0.0}) {
    INFO("alpha " << alpha);
    LeakyReLU leaky(alpha, "leaky");
    // |x| >= 0.05 > h = 0.01: no perturbation crosses the kink at 0.
    test::check_layer(leaky, {test::away_from_zero({3, 4, 5}, 3, "x", 0.05)}, training());
  }
}

TEST_CASE("NaN and infinities: the smooth activations propagate NaN and saturate, LeakyReLU's branch",
          "[activations]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {nan, -nan, inf, -inf};
  Sigmoid sigmoid("s_nan");
  Pass s = run(sigmoid, x);
  CHECK(std::isnan(s.y[0]));
  CHECK(std::isnan(s.y[1]));
  CHECK(s.y[2] == 1.0f);
  CHECK(s.y[3] == 0.0f);
  CHECK(std::isnan(s.dx[0]));
  CHECK(std::isnan(s.dx[1]));
  CHECK(s.dx[2] == 0.0f);  // saturated: 0, not NaN
  CHECK(s.dx[3] == 0.0f);

  Tanh tanh_layer("t_nan");
  Pass t = run(tanh_layer, x);
  CHECK(std::isnan(t.y[0]));
  CHECK(std::isnan(t.y[1]));
  CHECK(t.y[2] == 1.0f);
  CHECK(t.y[3] == -1.0f);
  CHECK(std::isnan(t.dx[0]));
  CHECK(t.dx[2] == 0.0f);
  CHECK(t.dx[3] == 0.0f);

  // x > 0 picks the branch, as in ReLU: a NaN takes alpha * x (still NaN) and gradient alpha.
  LeakyReLU leaky(0.5, "l_nan");
  Pass l = run(leaky, x);
  CHECK(std::isnan(l.y[0]));
  CHECK(std::isnan(l.y[1]));
  CHECK(l.y[2] == inf);
  CHECK(l.y[3] == -inf);
  CHECK(l.dx == std::vector<float>{0.5f, 0.5f, 1.0f, 0.5f});
}

TEST_CASE("GELU named by a string literal keeps the name (not taken for approximate)", "[activations]") {
  CHECK(std::make_shared<GELU>("my_gelu")->name() == "my_gelu");
  CHECK(std::make_shared<GELU>("my_gelu")->approximate());
  CHECK(GELU(std::string("g2")).name() == "g2");
  CHECK(GELU(false, "g3").name() == "g3");
  CHECK_FALSE(GELU(false, "g3").approximate());
}

TEST_CASE("make_activation: every name gives its layer, an unknown one is an InputError", "[activations]") {
  CHECK(make_activation("relu")->type() == "ReLU");
  CHECK(make_activation("sigmoid")->type() == "Sigmoid");
  CHECK(make_activation("tanh")->type() == "Tanh");
  CHECK(make_activation("softmax")->type() == "Softmax");
  auto gelu = std::dynamic_pointer_cast<GELU>(make_activation("gelu"));
  REQUIRE(gelu);
  CHECK(gelu->approximate());
  auto exact = std::dynamic_pointer_cast<GELU>(make_activation("gelu_exact"));
  REQUIRE(exact);
  CHECK(!exact->approximate());
  auto leaky = std::dynamic_pointer_cast<LeakyReLU>(make_activation("leaky_relu", "act3"));
  REQUIRE(leaky);
  CHECK(leaky->alpha() == LeakyReLU::kDefaultAlpha);
  CHECK(leaky->name() == "act3");
  auto softmax = std::dynamic_pointer_cast<Softmax>(make_activation("softmax"));
  REQUIRE(softmax);
  CHECK(softmax->axis() == -1);
  CHECK_THAT(input_error([] { make_activation("swish"); }), Catch::Contains("'swish'") && Catch::Contains("leaky_relu"));
}

TEST_CASE("default names of the new activations", "[activations]") {
  Sigmoid s;
  Tanh t;
  LeakyReLU l;
  CHECK(s.name().rfind("sigmoid", 0) == 0);
  CHECK(t.name().rfind("tanh", 0) == 0);
  CHECK(l.name().rfind("leaky_relu", 0) == 0);
}

namespace {
// A program's own element-wise layer: only its type and passes.
class Doubling : public ElementwiseLayer {
 public:
  explicit Doubling(std::string name) : ElementwiseLayer(std::move(name)) {}
  std::string type() const override { return "Doubling"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState&) override {
    Tensor y = in.at(0).clone();
    ops::scale(y, 2.0);
    return {y};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& dy, const RunContext&, SavedState&) override {
    Tensor dx = dy.at(0).clone();
    ops::scale(dx, 2.0);
    return {dx};
  }
};
}  // namespace

TEST_CASE("ElementwiseLayer gives its activations the input's shape and format", "[activation][elementwise]") {
  Doubling d("twice");
  CHECK(d.output_shapes({{2, 3, 4, 5}}) == std::vector<Shape>{{2, 3, 4, 5}});
  CHECK(d.supports_memory_format(MemoryFormat::channels_last));
  CHECK_THROWS_WITH(d.output_shapes({{2, 3}, {2, 3}}), Catch::Contains("Doubling 'twice': expects one input"));
  // The built-in ones share it.
  ReLU relu("r");
  CHECK(dynamic_cast<ElementwiseLayer*>(&relu) != nullptr);
  CHECK_THROWS_WITH(relu.output_shapes({{1}, {1}}), Catch::Contains("ReLU 'r': expects one input"));
}
