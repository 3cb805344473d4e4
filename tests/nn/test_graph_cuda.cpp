// A residual network on the GPU against the same network on the CPU: Network::to() moves
// every layer, the graph sums the fan-out gradients of the residual input with the CUDA
// engine of ops::add, and the hooks fire in the same order. Tolerances: cuDNN may run f32
// convolutions in TF32 (inputs rounded to 10 mantissa bits, relative error 2^-10 ~ 1e-3 per
// product) and sums in another order than oneDNN; through two convolutions and a batch
// norm that stays below rtol 1e-2, while a wiring mistake (a missing branch, a gradient not
// summed) changes results by O(1). Values near zero err by the rounding of their terms,
// not of themselves, so each tensor's atol is 1e-2 of its own largest entry (a gradient of
// size 2e-6 is not compared with an allowance of 1e-3). conv2's bias feeds a batch norm,
// which removes any constant per channel: its gradient is 0 in exact arithmetic and only
// rounding noise in float, so it is checked as such, below 1e-3 of the largest gradient.
#include <catch2/catch.hpp>

#include "gpu_test_util.hpp"
#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"

using namespace tnt;

namespace {

std::unique_ptr<Network> residual_net() {
  Conv2DOptions same;
  same.padding = 1;
  SymTensor x = Input({3, 8, 8});
  SymTensor h = (*std::make_shared<ReLU>("relu"))((*std::make_shared<Conv2D>(4, 3, same, "conv1"))(x));
  SymTensor r = (*std::make_shared<BatchNorm>("bn"))((*std::make_shared<Conv2D>(4, 3, same, "conv2"))(h));
  SymTensor y = (*std::make_shared<Add>("add"))({h, r});
  y = (*std::make_shared<Dense>(5, "fc"))((*std::make_shared<GlobalAveragePool>("pool"))(y));
  return std::make_unique<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "residual");
}

}  // namespace

TEST_CASE("graph cuda: a residual network on the GPU matches the CPU") {
  REQUIRE(cuda_available());
  auto cpu = residual_net();
  auto gpu = residual_net();
  cpu->initialize(3);
  gpu->initialize(3);
  gpu->to(test::gpu());
  CHECK(gpu->device() == test::gpu());
  for (const NamedParameter& p : gpu->named_parameters()) CHECK(p.param->value.device() == test::gpu());

  RunContext rc;
  rc.training = true;
  Tensor x = test::random_tensor({4, 3, 8, 8}, "x");
  Tensor g = test::random_tensor({4, 5}, "g");
  Tensor y_cpu = cpu->forward({x}, rc)[0];
  rc.device = test::gpu();
  Tensor y_gpu = gpu->forward({x.to(test::gpu())}, rc)[0];
  test::require_close(y_gpu, y_cpu, 1e-2 * test::max_abs(y_cpu), 1e-2, "outputs");

  std::vector<size_t> order_cpu, order_gpu;
  cpu->zero_grad();
  gpu->zero_grad();
  rc.device = Device::cpu();
  Tensor dx_cpu = cpu->backward({g}, rc, [&](size_t i, Parameter&) { order_cpu.push_back(i); })[0];
  rc.device = test::gpu();
  Tensor dx_gpu = gpu->backward({g.to(test::gpu())}, rc, [&](size_t i, Parameter&) { order_gpu.push_back(i); })[0];
  CHECK(order_cpu == order_gpu);
  test::require_close(dx_gpu, dx_cpu, 1e-2 * test::max_abs(dx_cpu), 1e-2, "input gradient");
  std::vector<NamedParameter> pc = cpu->named_parameters(), pg = gpu->named_parameters();
  REQUIRE(pc.size() == pg.size());
  double largest = 0;
  for (const NamedParameter& p : pc) largest = std::max(largest, test::max_abs(p.param->grad));
  REQUIRE(largest > 0);
  bool saw_cancelled_bias = false;
  for (size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i].name);
    CHECK(pg[i].name == pc[i].name);
    if (pc[i].name.find("conv2") != std::string::npos && pc[i].name.find("bias") != std::string::npos) {
      saw_cancelled_bias = true;
      CHECK(test::max_abs(pc[i].param->grad) <= 1e-3 * largest);
      CHECK(test::max_abs(pg[i].param->grad.to(Device::cpu())) <= 1e-3 * largest);
      continue;
    }
    const double scale = test::max_abs(pc[i].param->grad);
    CHECK(scale > 1e-3 * largest);  // a gradient that vanished on the CPU would compare trivially
    test::require_close(pg[i].param->grad, pc[i].param->grad, 1e-2 * scale, 1e-2, pc[i].name);
  }
  CHECK(saw_cancelled_bias);
}
