// The optimizers' CUDA update kernels against their CPU loops: the same parameters and
// gradients on both devices, three steps, then bitwise equal parameters and state tensors.
// Both engines call the same rule per element (optim/update_rules.hpp) with the same
// precomputed scalars, rounding after every operation on both (no fused multiply-add on
// either), and sqrt and division are correctly rounded on both: any difference is a bug.
#include <catch2/catch.hpp>

#include "gpu_test_util.hpp"
#include "tarantella/optim.hpp"

#include <functional>
#include <memory>
#include <string>

using namespace tnt;

namespace {

void compare(const std::function<std::unique_ptr<Optimizer>()>& make, const std::string& what) {
  REQUIRE(cuda_available());
  // 100003 elements: a prime, above the CPU's parallel threshold, several grid strides.
  const Shape shape{100003};
  Parameter cpu, gpu;
  cpu.value = test::random_tensor(shape, what + ".p");
  cpu.grad = Tensor::zeros(shape);
  gpu.value = cpu.value.to(test::gpu());
  gpu.grad = Tensor::zeros(shape, DType::f32, test::gpu());
  auto opt_cpu = make();
  auto opt_gpu = make();
  for (int step = 0; step < 3; ++step) {
    Tensor g = test::random_tensor(shape, what + ".g" + std::to_string(step));
    cpu.grad.copy_from(g);
    gpu.grad.copy_from(g);
    opt_cpu->step({{"w", &cpu}});
    opt_gpu->step({{"w", &gpu}});
  }
  test::require_equal(gpu.value, cpu.value, what + " parameters");
  std::vector<NamedTensor> sc = opt_cpu->named_state(), sg = opt_gpu->named_state();
  REQUIRE(sc.size() == sg.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    CHECK(sg[i].name == sc[i].name);
    test::require_equal(sg[i].tensor, sc[i].tensor, what + " " + sc[i].name);
  }
  CHECK(sg[0].tensor.device() == (sg.size() > 1 ? test::gpu() : Device::cpu()));
}

}  // namespace

TEST_CASE("optim cuda: SGD kernels match the CPU") {
  compare([] { return std::make_unique<SGD>(0.1); }, "sgd");
  compare([] { return std::make_unique<SGD>(0.1, SgdOptions{.momentum = 0.9, .weight_decay = 1e-4, .nesterov = true}); },
          "sgd_nesterov");
  compare([] { return std::make_unique<SGD>(0.1, SgdOptions{.momentum = 0.9, .dampening = 0.1}); }, "sgd_dampening");
}

TEST_CASE("optim cuda: Adam and AdamW kernels match the CPU") {
  compare([] { return std::make_unique<Adam>(1e-2, AdamOptions{.weight_decay = 1e-2}); }, "adam");
  compare([] { return std::make_unique<AdamW>(1e-2); }, "adamw");
}

TEST_CASE("optim cuda: state follows a parameter moved to the GPU") {
  REQUIRE(cuda_available());
  Parameter p;
  p.value = test::random_tensor({17}, "move.p");
  p.grad = test::random_tensor({17}, "move.g");
  Adam opt(1e-3);
  opt.step({{"w", &p}});
  p.value = p.value.to(test::gpu());
  p.grad = p.grad.to(test::gpu());
  opt.step({{"w", &p}});
  CHECK(opt.named_state()[0].tensor.device() == test::gpu());
}

// Clipping on the GPU: the value kernel against the CPU loop, and the norms from the CUDA
// reduction (another summation order than the CPU's, so the factor may differ in its last
// f32 bit: within the rtol above). random_tensor's 100003 elements have norms far above
// these limits, so every step is clipped.
TEST_CASE("optim cuda: gradient clipping matches the CPU") {
  compare([] { return std::make_unique<SGD>(0.1, SgdOptions{.clipping = {.value = 0.25}}); }, "clip_value");
  compare([] { return std::make_unique<SGD>(0.1, SgdOptions{.momentum = 0.9, .clipping = {.norm = 1.0}}); },
          "clip_norm");
  compare([] { return std::make_unique<Adam>(1e-2, AdamOptions{.clipping = {.value = 0.5, .global_norm = 2.0}}); },
          "clip_global_norm");
}
