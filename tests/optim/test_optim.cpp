// Optimizer updates against values computed by hand (one step) and by PyTorch 1.13
// (three steps, torch.optim with the same hyperparameters, f32; numbers pasted below).
// A parameter p = (1, -2, 3) receives the gradients g1, g2, g3 below.
#include <catch2/catch.hpp>

#include "tarantella/optim.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

using namespace tnt;


namespace {

const std::vector<float> kP0 = {1.0f, -2.0f, 3.0f};
const std::vector<std::vector<float>> kGrads = {{0.5f, 1.0f, -1.0f}, {-0.25f, 2.0f, 0.5f}, {1.0f, -1.0f, 0.125f}};

struct Param {
  Parameter p;
  explicit Param(const std::vector<float>& value = kP0) {
    p.name = "weight";
    p.value = Tensor::from_vector(value, {static_cast<int64_t>(value.size())});
    p.grad = Tensor::zeros(p.value.shape());
  }
  std::vector<NamedParameter> named() { return {{"fc.weight", &p}}; }
  void set_grad(const std::vector<float>& g) { p.grad.copy_from(Tensor::from_vector(g, p.value.shape())); }
};

// |ours - torch| <= 2e-6: both run the same formula in f32 with a different operation order
// (PyTorch lerps m and divides by sqrt(bc2)); after three steps on values of magnitude <= 3
// that is a few ulps (ulp(3) = 2.4e-7).
void check_close(const std::vector<float>& got, const std::vector<float>& want, double tol = 2e-6) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(static_cast<double>(got[i]) == Approx(static_cast<double>(want[i])).margin(tol));
  }
}

std::vector<float> run_three_steps(Optimizer& opt, Param& param) {
  for (const auto& g : kGrads) {
    param.set_grad(g);
    opt.step(param.named());
  }
  return param.p.value.to_vector();
}

// lr(step) = step + 1: shows which step each update used.
class CountingSchedule : public LearningRateSchedule {
 public:
  double lr(int64_t step) const override { return static_cast<double>(step + 1); }
  std::string describe() const override { return "Counting"; }
};

}  // namespace

TEST_CASE("optim: SGD by hand") {
  SECTION("plain") {
    Param param;
    SGD opt(0.1);
    param.set_grad(kGrads[0]);
    opt.step(param.named());
    check_close(param.p.value.to_vector(), {0.95f, -2.1f, 3.1f}, 1e-7);
    CHECK(opt.step_count() == 1);
    CHECK(opt.named_state().size() == 1);  // only "fc.weight.step"
  }
  SECTION("momentum: b1 = g, b2 = 0.9 g + g, so p2 = p - 0.1 g - 0.19 g") {
    Param param;
    SGD opt(0.1, {.momentum = 0.9});
    param.set_grad(kGrads[0]);
    opt.step(param.named());
    opt.step(param.named());
    check_close(param.p.value.to_vector(), {1.0f - 0.145f, -2.29f, 3.29f}, 1e-6);
  }
  SECTION("nesterov: steps 1.9 g then 2.71 g") {
    Param param;
    SGD opt(0.1, {.momentum = 0.9, .nesterov = true});
    param.set_grad(kGrads[0]);
    opt.step(param.named());
    check_close(param.p.value.to_vector(), {1.0f - 0.095f, -2.19f, 3.19f}, 1e-6);
    opt.step(param.named());
    check_close(param.p.value.to_vector(), {1.0f - 0.2305f, -2.461f, 3.461f}, 1e-6);
  }
  SECTION("weight decay: p - lr (g + wd p)") {
    Param param;
    SGD opt(0.1, {.weight_decay = 0.01});
    param.set_grad(kGrads[0]);
    opt.step(param.named());
    check_close(param.p.value.to_vector(), {0.949f, -2.098f, 3.097f}, 1e-6);
  }
}

TEST_CASE("optim: SGD against PyTorch") {
  SECTION("nesterov with weight decay") {
    Param param;
    SGD opt(0.1, {.momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
    check_close(run_three_steps(opt, param), {0.698189199f, -2.67807865f, 3.15969586f});
    std::vector<NamedTensor> state = opt.named_state();
    REQUIRE(state.size() == 2);
    CHECK(state[0].name == "fc.weight.momentum_buffer");
    check_close(state[0].tensor.to_vector(), {1.20530367f, 1.54770982f, -0.150423124f});
    CHECK(state[1].name == "fc.weight.step");
    CHECK(state[1].tensor.to_double_vector() == std::vector<double>{3});
  }
  SECTION("dampening") {
    Param param;
    SGD opt(0.1, {.momentum = 0.9, .dampening = 0.5, .weight_decay = 0.01});
    check_close(run_three_steps(opt, param), {0.834180892f, -2.40244436f, 3.20459914f});
    check_close(opt.named_state()[0].tensor.to_vector(), {0.809446096f, 1.17293322f, -0.468474776f});
  }
}

TEST_CASE("optim: Adam and AdamW") {
  SECTION("Adam's first step moves each weight by lr against the sign of its gradient") {
    // m_hat = g, v_hat = g^2 after bias correction, so the step is lr * g / (|g| + eps).
    Param param;
    Adam opt(0.1);
    param.set_grad(kGrads[0]);
    opt.step(param.named());
    check_close(param.p.value.to_vector(), {0.9f, -2.1f, 3.1f}, 1e-6);
  }
  SECTION("AdamW's first step also decays: p (1 - lr wd) - lr sign(g)") {
    Param param;
    AdamW opt(0.1, {.weight_decay = 0.1});
    param.set_grad(kGrads[0]);
    opt.step(param.named());
    check_close(param.p.value.to_vector(), {0.99f - 0.1f, -1.98f - 0.1f, 2.97f + 0.1f}, 1e-6);
  }
  SECTION("Adam with L2 against PyTorch") {
    Param param;
    Adam opt(0.1, {.weight_decay = 0.01});
    check_close(run_three_steps(opt, param), {0.804614425f, -2.23720288f, 3.1316998f});
    std::vector<NamedTensor> state = opt.named_state();
    REQUIRE(state.size() == 3);
    CHECK(state[0].name == "fc.weight.exp_avg");
    CHECK(state[1].name == "fc.weight.exp_avg_sq");
    CHECK(state[2].name == "fc.weight.step");
    check_close(state[0].tensor.to_vector(), {0.120491229f, 0.155293554f, -0.0151569778f});
    // v is ~1e-3: compare relatively, within a few f32 ulps (2^-23 = 1.2e-7).
    std::vector<float> v = state[1].tensor.to_vector();
    std::vector<float> want = {0.00133510353f, 0.00591541594f, 0.00124510622f};
    for (size_t i = 0; i < 3; ++i) CHECK(static_cast<double>(v[i]) == Approx(static_cast<double>(want[i])).epsilon(1e-6));
  }
  SECTION("AdamW against PyTorch") {
    Param param;
    AdamW opt(0.1, {.weight_decay = 0.1});
    CHECK(opt.type() == "AdamW");
    check_close(run_three_steps(opt, param), {0.780110538f, -2.17617011f, 3.04863048f});
    check_close(opt.named_state()[0].tensor.to_vector(), {0.118000001f, 0.160999984f, -0.0234999955f});
  }
}

TEST_CASE("optim: the schedule is read at the optimizer's step counter") {
  Param param({0.0f});
  SGD opt(std::make_shared<CountingSchedule>());
  param.set_grad({1.0f});
  CHECK(opt.learning_rate() == 1.0);
  opt.step(param.named());  // lr 1
  opt.step(param.named());  // lr 2
  CHECK(param.p.value.to_vector()[0] == -3.0f);
  CHECK(opt.learning_rate() == 3.0);
  opt.set_learning_rate(0.5);  // a callback's override replaces the schedule
  opt.step(param.named());
  CHECK(param.p.value.to_vector()[0] == -3.5f);
  CHECK(opt.step_count() == 3);
  opt.set_step_count(10);
  opt.set_schedule(std::make_shared<CountingSchedule>());
  CHECK(opt.learning_rate() == 11.0);
}

TEST_CASE("optim: frozen parameters, missing gradients and the decay filter") {
  Param frozen, plain, no_decay;
  frozen.p.trainable = false;
  plain.set_grad({1.0f, 1.0f, 1.0f});
  no_decay.set_grad({1.0f, 1.0f, 1.0f});
  frozen.set_grad({1.0f, 1.0f, 1.0f});
  SGD opt(1.0, {.weight_decay = 0.5, .decay_filter = [](const std::string& name) {
                  return name.find("bn") == std::string::npos;
                }});
  opt.step({{"frozen.weight", &frozen.p}, {"fc.weight", &plain.p}, {"bn.weight", &no_decay.p}});
  CHECK(frozen.p.value.to_vector() == kP0);
  check_close(plain.p.value.to_vector(), {1 - 1 - 0.5f, -2 - 1 + 1.0f, 3 - 1 - 1.5f}, 1e-7);
  check_close(no_decay.p.value.to_vector(), {0.0f, -3.0f, 2.0f}, 1e-7);
  CHECK(opt.named_state().size() == 2);  // the frozen parameter has no state
}

TEST_CASE("optim: state round trip for checkpoints") {
  Param a, b;
  Adam first(0.01);
  a.set_grad(kGrads[0]);
  first.step(a.named());
  first.step(a.named());

  // A fresh optimizer: make the state, load the saved one, then both continue identically.
  b.p.value.copy_from(a.p.value);
  Adam second(0.01);
  CHECK(second.named_state().empty());
  second.init_state(b.named());
  REQUIRE(second.named_state().size() == 3);
  for (const NamedTensor& t : first.named_state()) second.load_state(t.name, t.tensor);
  second.set_step_count(first.step_count());
  a.set_grad(kGrads[1]);
  b.set_grad(kGrads[1]);
  first.step(a.named());
  second.step(b.named());
  CHECK(a.p.value.to_vector() == b.p.value.to_vector());  // bitwise: the same arithmetic

  CHECK_THROWS_AS(second.load_state("fc.bias.exp_avg", Tensor::zeros({3})), InputError);
  CHECK_THROWS_WITH(second.load_state("fc.weight.exp_avg", Tensor::zeros({4})), Catch::Contains("3 elements"));
  // A step count saved as f32 (PyTorch's habit) is accepted.
  second.load_state("fc.weight.step", Tensor::full({1}, 7.0));
  CHECK(second.named_state()[2].tensor.to_double_vector() == std::vector<double>{7});
}

TEST_CASE("optim: bad hyperparameters are reported") {
  CHECK_THROWS_WITH(SGD(0.1, {.momentum = 0.0, .nesterov = true}), Catch::Contains("nesterov"));
  CHECK_THROWS_WITH(Adam(0.1, {.beta1 = 1.0}), Catch::Contains("betas"));
  CHECK_THROWS(SGD(-1.0));
}

namespace {

// splitmix64: inputs of the pinned-bits test that depend on nothing in the library.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-scale, scale) times a magnitude from 1e-3 to 10, so that weight decay, eps
// and the momentum terms all reach the low bits. Plain float arithmetic on exact values:
// the same inputs on every machine.
std::vector<float> pinned_values(int64_t n, uint64_t stream, float scale) {
  constexpr float kMagnitude[] = {1e-3f, 1e-2f, 0.1f, 1.0f, 10.0f};
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t b = mix(stream * 0x100000000ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(b >> 40) * 0x1p-24f;  // [0, 1), exact
    v[static_cast<size_t>(i)] = (2.0f * u - 1.0f) * scale * kMagnitude[i % 5];
  }
  return v;
}

// FNV-1a over the float bits of the parameter and of every state slot.
uint64_t fnv1a(uint64_t h, const std::vector<float>& values) {
  for (float f : values) {
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    for (int byte = 0; byte < 4; ++byte) {
      h ^= (bits >> (8 * byte)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

uint64_t pinned_hash(Optimizer& opt) {
  // 100003: a prime (the vector loop's remainder runs) above the CPU loops' parallel
  // threshold (sgd.cpp, adam.cpp: 2^15), so the threaded path is the one pinned.
  const int64_t n = 100003;
  Parameter p;
  p.value = Tensor::from_vector(pinned_values(n, 1, 0.3f), {n});
  p.grad = Tensor::zeros({n});
  for (uint64_t step = 0; step < 3; ++step) {
    p.grad.copy_from(Tensor::from_vector(pinned_values(n, 2 + step, 0.1f), {n}));
    opt.step({{"w", &p}});
  }
  uint64_t h = fnv1a(0xcbf29ce484222325ull, p.value.to_vector());
  for (const NamedTensor& t : opt.named_state()) {
    if (t.tensor.dtype() == DType::f32) h = fnv1a(h, t.tensor.to_vector());
  }
  return h;
}

}  // namespace

// The exact bits of every CPU update rule, pinned, so that a change of any rule's
// arithmetic (an operation order, a float that was a double, a scalar rounded differently)
// fails here even far below the tolerances of the checks above. Recorded when the rules
// began to round after every multiply and add on both engines (no FMA: the optimizer files
// are built with -ffp-contract=off, the device uses __fmul_rn/__fadd_rn), which changed
// the bits that GCC's contractions under -march=x86-64-v3 had given; the PyTorch checks
// above passed before and after. Another compiler may still change the bits with no rule
// changed; re-record them only once the PyTorch checks pass and the rules' source is known
// to be unchanged.
TEST_CASE("optim: the CPU update rules' bits are pinned") {
  SECTION("SGD") {
    SGD plain(0.1);
    CHECK(pinned_hash(plain) == 0x741ac7b881b3a961ull);
    SGD damped(0.05, {.momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-4});
    CHECK(pinned_hash(damped) == 0x409600350888c761ull);
    SGD nesterov(0.1, {.momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
    CHECK(pinned_hash(nesterov) == 0xa8c9238857b1e75dull);
  }
  SECTION("Adam and AdamW") {
    Adam adam(1e-2, {.weight_decay = 1e-2});
    CHECK(pinned_hash(adam) == 0xe0403a2b0f0ce92bull);
    AdamW adamw(3e-3, {.beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1});
    CHECK(pinned_hash(adamw) == 0x26d530f582a8c4b5ull);
  }
}

TEST_CASE("optim: state below the smallest normal float is kept as 0 (no subnormals)") {
  // Loaded moments just above the smallest normal float (2^-126), then steps with no
  // gradient (a unit that stopped firing): a multiply by beta1 or the momentum would make
  // them subnormal, and each later step would read a subnormal (slow on x86). They become 0;
  // the smallest normal stays; a NaN stays a NaN for the loss scaler to see.
  const float min_normal = 0x1p-126f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> start = {1.05f * min_normal, -1.05f * min_normal, nan};
  auto state_of = [](Optimizer& opt, const std::string& name) {
    for (const NamedTensor& t : opt.named_state())
      if (t.name == name) return t.tensor.to_vector();
    FAIL("no optimizer state " << name);
    return std::vector<float>{};
  };
  SECTION("Adam: m and v") {
    Param p;
    Adam adam(1e-3);
    adam.init_state(p.named());
    adam.load_state("fc.weight.exp_avg", Tensor::from_vector(start, {3}));
    adam.load_state("fc.weight.exp_avg_sq", Tensor::from_vector({min_normal, 1.0005f * min_normal, 1.0f}, {3}));
    adam.step(p.named());  // grad 0: m = 0.9 m, v = 0.999 v
    const std::vector<float> m = state_of(adam, "fc.weight.exp_avg"), v = state_of(adam, "fc.weight.exp_avg_sq");
    CHECK(m[0] == 0.0f);
    CHECK(m[1] == 0.0f);
    CHECK(std::isnan(m[2]));
    CHECK(v[0] == 0.0f);  // 0.999 * 2^-126 is subnormal
    CHECK(v[1] == 0.0f);
    CHECK(v[2] == 0.999f);
    for (float x : m) CHECK(std::fpclassify(x) != FP_SUBNORMAL);
    CHECK(p.p.value.to_vector()[0] == kP0[0]);  // a zero moment moves nothing
  }
  SECTION("Adam with eps 0: no infinity or NaN from a flushed v") {
    // v = 0.001 * (1e-19)^2 is subnormal while m = 1e-20 is not: v is kept (a flushed v
    // would divide by 0). Then m decays to 0 and v with it: the step is 0, not 0 / 0.
    Param p({0.5f, 0.5f, 0.5f});
    Adam adam(1e-3, {.eps = 0.0});
    p.set_grad({1e-19f, 1e-3f, 0.0f});
    adam.step(p.named());
    const std::vector<float> v = state_of(adam, "fc.weight.exp_avg_sq");
    CHECK(std::fpclassify(v[0]) == FP_SUBNORMAL);
    p.set_grad({0.0f, 0.0f, 0.0f});
    for (int i = 0; i < 900; ++i) adam.step(p.named());  // m: 0.9^900 of its start, flushed
    for (float x : p.p.value.to_vector()) CHECK(std::isfinite(x));
    for (float x : state_of(adam, "fc.weight.exp_avg")) CHECK(x == 0.0f);
    CHECK(p.p.value.to_vector()[2] == 0.5f);  // never a gradient: m = v = 0 from the start
  }
  SECTION("a NaN denominator under a zero m still reaches the parameter, as in PyTorch") {
    // beta2 = 0: v = g^2 = inf at the first step, then 0 * inf = NaN with m back at 0.
    Param p({1.0f, 1.0f, 1.0f});
    Adam adam(1e-3, {.beta1 = 0.0, .beta2 = 0.0, .eps = 1e-8});
    p.set_grad({1e20f, 1.0f, 1.0f});
    adam.step(p.named());
    p.set_grad({0.0f, 0.0f, 0.0f});
    adam.step(p.named());
    CHECK(std::isnan(p.p.value.to_vector()[0]));
  }
  SECTION("the sign of a zero is kept") {
    Param p({-0.0f, 1.0f, 1.0f});
    SGD sgd(0.1, {.momentum = 0.9});
    p.set_grad({-0.0f, 0.0f, 0.0f});
    sgd.step(p.named());
    CHECK(std::signbit(state_of(sgd, "fc.weight.momentum_buffer")[0]));
    CHECK_FALSE(std::signbit(p.p.value.to_vector()[0]));  // -0 - 0.1 * -0 = +0, as torch.optim
  }
  SECTION("SGD: the momentum buffer") {
    Param p;
    SGD sgd(0.1, {.momentum = 0.9});
    p.set_grad({1.0f, 1.0f, 1.0f});
    sgd.step(p.named());  // the buffer starts as the gradient
    sgd.load_state("fc.weight.momentum_buffer",
                   Tensor::from_vector({1.05f * min_normal, 1.2f * min_normal, min_normal / 0.9f * 1.001f}, {3}));
    p.set_grad({0.0f, 0.0f, 0.0f});
    sgd.step(p.named());
    const std::vector<float> b = state_of(sgd, "fc.weight.momentum_buffer");
    CHECK(b[0] == 0.0f);
    CHECK(b[1] == 0.9f * (1.2f * min_normal));  // 1.08 * 2^-126 is still normal
    CHECK(b[2] >= min_normal);
  }
}
