// A residual network on the GPU against the same network on the CPU: Network::to() moves
// every layer, the graph sums the fan-out gradients of the residual input with the CUDA
// engine of ops::add, and the hooks fire in the same order. Tolerances: cuDNN may run f32
// convolutions in TF32 (inputs rounded to 10 mantissa bits, relative error 2^-10 ~ 1e-3 per
// product) and sums in another order than oneDNN; through two convolutions and a batch
// norm that stays below rtol 1e-2 with atol 1e-3 for values near zero, while a wiring
// mistake (a missing branch, a gradient not summed) changes results by O(1).
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
  test::require_close(y_gpu, y_cpu, 1e-3, 1e-2, "outputs");

  std::vector<size_t> order_cpu, order_gpu;
  cpu->zero_grad();
  gpu->zero_grad();
  rc.device = Device::cpu();
  Tensor dx_cpu = cpu->backward({g}, rc, [&](size_t i, Parameter&) { order_cpu.push_back(i); })[0];
  rc.device = test::gpu();
  Tensor dx_gpu = gpu->backward({g.to(test::gpu())}, rc, [&](size_t i, Parameter&) { order_gpu.push_back(i); })[0];
  CHECK(order_cpu == order_gpu);
  test::require_close(dx_gpu, dx_cpu, 1e-3, 1e-2, "input gradient");
  std::vector<NamedParameter> pc = cpu->named_parameters(), pg = gpu->named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) test::require_close(pg[i].param->grad, pc[i].param->grad, 1e-3, 1e-2, pc[i].name);
}
