// A residual block's CUDA gradients checked on their own, against central differences of its
// forward on the same GPU (gradcheck.hpp), where nn_graph_cuda and nn_layer_fusion_cuda
// compare the GPU with the CPU or with itself. In view: the executor's sum of two gradients
// of one tensor (nn/executor_util.hpp, accumulate: on a GPU an axpy into the slot where
// nothing else holds its memory, else out of place) and Add's backward (dy itself to its
// first input, copies to the others), with the layers one by one and with layer fusion's
// chains (cuDNN's where it takes them, else layer by layer at the chain's place), in NCHW
// and channels_last. Three blocks (Shortcut below): the shortcut from inside (h feeds c2
// and the sum: the block of the CPU case in test_layer_fusion.cpp), from the input as the
// sum's second input (the input gradient is the in-place sum of two paths) and as its first
// (the sum passes the caller's output gradient itself on to x: c1's gradient must be added
// out of place and the caller's tensor left as it was).
//
// f32, step and tolerance: gradcheck.hpp's, as in the CPU case. h = 1e-2; each element
// within 5e-4 of its tensor's largest gradient G plus the rounding floor 4 u M / h (u =
// 2^-24, M = sum |w_i y_i|, about 6500 for the inner shortcut and 3200 for the others:
// floors of 0.16 and 0.08, 0.3% to 5% of G). The GPU's forward rounds as the CPU's does
// (in other orders, to the same unit), and the truncation h^2/6 |L'''| is the function's,
// so both terms carry over: on the CPU these blocks' worst errors were 0.2 u M / h (a
// twentieth of the floor) and 1.1e-3 G. That needs plain f32 products: cuDNN may run f32
// convolutions in TF32 (conv2d_cuda.cu), whose inputs rounded to 2^-11 would raise the
// floor 2^13-fold, far above G. NVIDIA_TF32_OVERRIDE=0 turns TF32 off in NVIDIA's libraries
// (set by CTest, and below unless the environment sets it); require_f32_products checks
// that it did.
//
// What fails it (faults planted on the CPU's branch of accumulate and in Add, which the GPU
// runs through the same slots and layer; the CUDA branch differs only in being an axpy):
// - the in-place sum dropped: the input, c1 and bn1 gradients of the inner-shortcut block
//   and the input gradient of the input-second block are off by a quarter to a third of G,
//   7 to 43 times the tolerance;
// - Add giving its inputs after the first no gradient: every block where Add's backward
//   runs (all but in a chain that an engine runs), by 25% to 100% of G, 8 to 141 times;
// - the in-place sum without its use_count() == 1 condition: the input-first block's c1
//   gradient is added into the caller's output gradient (the results are right), which the
//   check that the caller's tensor is unchanged catches.
// Add copying dy to its first input instead of passing it on changes no value; no check of
// values can see that.
//
// bf16 with the chains fused (cuDNN's BN_ACTIVATION and BN_ADD_ACTIVATION): finite
// differences mean nothing there (the objective rounds at 2^-8, a floor 2^16 times the f32
// one), so the gradients are compared with the f32 CPU's: functions that the f32 case checks
// on the GPU (the inner-shortcut block's also the CPU case). Each element within 8 u (u =
// 2^-8, so 3.1%) of its tensor's largest |gradient|. Between the layers every activation
// and gradient is rounded to bf16, and the filters' compute copies too; the CPU's emulation
// of those roundings (compute dtype bf16 with the filters rounded, CPU engines in f32)
// differs from f32 by at most 2.3 u of a tensor's largest gradient, so 8 u leaves 3.5 times
// that for cuDNN's own order and its fused call (which rounds less, not more). A lost path
// (a quarter of G or more) is 8 times beyond. The batch norms' biases of 4 keep every ReLU
// input at least 0.5 from its kink (checked), far beyond bf16's error: no ReLU mask differs
// from the CPU's (the flips nn_layer_fusion_cuda has to allow for). Measured on the CPU
// (2026-11-30); not yet run on a GPU.
#include <catch2/catch.hpp>

#include "gpu_test_util.hpp"
#include "gradcheck.hpp"
#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

using namespace tnt;

namespace {

// Plain f32 products in cuDNN and cuBLAS for this process (see the top) unless its
// environment says otherwise: set before main, hence before the runtime starts cuDNN. CTest
// sets it as well (tests/nn/CMakeLists.txt), in case a library reads it when it is loaded.
const bool kTf32Off = [] { return ::setenv("NVIDIA_TF32_OVERRIDE", "0", 0) == 0; }();

// Where the block's sum takes its shortcut from, and so how the gradients meet.
enum class Shortcut {
  // h = relu(bn1(c1(x))), y = relu(bn2(c2(h)) + h): the sum passes dy itself on to bn2 and a
  // copy to h, to which c2's gradient of h is then added in place.
  hidden,
  // y = bn2(c2(h)) + x: x's gradient is the sum's copy of dy plus c1's, added in place.
  input,
  // y = x + bn2(c2(h)): the sum passes the caller's dy itself on to x, which the caller
  // still holds: c1's gradient of x is added out of place.
  input_first,
};

const char* shortcut_name(Shortcut s) {
  if (s == Shortcut::hidden) return "h, relu(bn2(c2(h)) + h)";
  return s == Shortcut::input ? "x, bn2(c2(h)) + x" : "x, x + bn2(c2(h))";
}
int64_t in_channels(Shortcut s) { return s == Shortcut::hidden ? 8 : 16; }
int64_t chains_of(Shortcut s) { return s == Shortcut::hidden ? 2 : 1; }

// The block on the CPU, in f32; h is a second output, so that the margin of ReLU r1 can be
// seen. Shortcut::hidden is the block, weights and data of the CPU case.
std::shared_ptr<Network> block(Shortcut s, MemoryFormat format, LayerFusion fusion) {
  SymTensor in = Input({in_channels(s), 5, 5}, DType::f32, "x");
  SymTensor h = test::relu(test::bn(test::conv(in, 16, 3, 1, "c1"), "bn1"), "r1");
  SymTensor r = test::bn(test::conv(h, 16, 3, 1, "c2"), "bn2");
  SymTensor y = s == Shortcut::hidden ? test::relu(test::add(r, h, "sum"), "r2")
                : s == Shortcut::input ? test::add(r, in, "sum")
                                       : test::add(in, r, "sum");
  auto net = std::make_shared<Network>(std::vector<SymTensor>{in}, std::vector<SymTensor>{y, h}, "residual");
  net->initialize(13);
  for (auto& np : net->named_parameters()) {
    if (np.name == "bn1.bias" || np.name == "bn2.bias") np.param->value.fill_(4.0);
  }
  net->set_memory_format(format);
  net->set_layer_fusion(fusion);
  return net;
}

Tensor input_of(Shortcut s) { return test::random_tensor({4, in_channels(s), 5, 5}, uint64_t{3}, "x"); }
Tensor weights_of() { return test::random_tensor({4, 16, 5, 5}, uint64_t{4}, "w"); }

RunContext training_on(Device device) {
  RunContext rc;
  rc.training = true;
  rc.device = device;
  return rc;
}

// One training step's results, on the host.
struct Step {
  std::vector<float> y, h;         // the outputs
  std::vector<std::string> names;  // "input", then every parameter's
  std::vector<Tensor> grads;       // in that order
  double magnitude = 0;            // sum |w_i y_i|: the objective's rounding scales with it
};

// Forward and backward with output gradient w for y (none for h) on the network's device.
// Checks that the ReLUs are clear of their kinks and that the backward left the caller's
// gradient as it was.
Step step(Network& net, Shortcut s, Device device) {
  const RunContext train = training_on(device);
  const Tensor w = weights_of();
  const Tensor w_given = w.to(device);
  net.zero_grad();
  const std::vector<Tensor> out = net.forward({input_of(s).to(device)}, train);
  Step st;
  st.y = out[0].to_vector();
  st.h = out[1].to_vector();
  REQUIRE(st.y == st.y);  // no NaN
  // Every input of r1 (h where positive), and of r2 for the hidden shortcut, is above 0.5:
  // far beyond the steps below (1e-2 in an input or weight moves them by less than 0.1).
  CHECK(*std::min_element(st.h.begin(), st.h.end()) > 0.5f);
  if (s == Shortcut::hidden) CHECK(*std::min_element(st.y.begin(), st.y.end()) > 0.5f);
  st.names.push_back("input");
  st.grads.push_back(net.backward({w_given, Tensor()}, train)[0].to(Device::cpu()));
  {
    // Shortcut::input_first: the sum passed the caller's gradient itself on to x, where c1's
    // gradient may only be added out of place.
    const bool untouched = w_given.to_vector() == w.to_vector();
    INFO("the output gradient given to backward is as it was");
    CHECK(untouched);
  }
  for (auto& np : net.named_parameters()) {
    st.names.push_back(np.name);
    st.grads.push_back(np.param->grad.to(Device::cpu()));
  }
  const std::vector<float> wv = w.to_vector();
  for (size_t i = 0; i < st.y.size(); ++i) st.magnitude += std::fabs(static_cast<double>(st.y[i]) * wv[i]);
  return st;
}

// The input's and every parameter's gradient of w . y against central differences of the
// forward on the network's device (gradcheck.hpp's step and tolerance, see the top).
void check_against_differences(Network& net, Shortcut s, Device device) {
  const Step st = step(net, s, device);
  const RunContext train = training_on(device);
  const Tensor w = weights_of();
  Tensor x = input_of(s);  // compare() moves its elements
  auto objective = [&] {
    return test::dot(net.forward({x.to(device)}, train, false)[0].to(Device::cpu()), w);
  };
  test::GradCheck opt;
  opt.every = 5;  // coprime to the filters' 3 x 3 and the 16 channels: every tap and channel is visited
  test::compare("input", x, st.grads[0], objective, opt, true, st.magnitude);
  size_t k = 1;
  for (auto& np : net.named_parameters()) {
    REQUIRE(st.names[k] == np.name);
    Tensor& on_device = np.param->value;
    Tensor value = on_device.to(Device::cpu());  // compare() moves its elements, we copy them over
    auto moved = [&] {
      on_device.copy_from(value);
      return objective();
    };
    test::compare(np.name, value, st.grads[k++], moved, opt, true, st.magnitude);
    on_device.copy_from(value);  // compare() restored value; the device holds its last step
  }
}

// The GPU's forward against the CPU's in f32: within 1e-5 of the largest output. CPU engines
// that sum in other orders (oneDNN's NCHW and NHWC kernels) differ by 1.5e-7 of it here;
// rounding only x and the filters to TF32 moves y by 1.2e-4 to 1.7e-4 of it (TF32 rounds h
// as well). Fails where cuDNN computes in TF32 (see the top).
void require_f32_products(Network& on_gpu, Shortcut s, MemoryFormat format, LayerFusion fusion) {
  auto on_cpu = block(s, format, fusion);
  const Tensor want = on_cpu->forward({input_of(s)}, training_on(Device::cpu()), false)[0];
  const Tensor got = on_gpu.forward({input_of(s).to(test::gpu())}, training_on(test::gpu()), false)[0];
  const double diff = test::max_abs_diff(got, want), scale = test::max_abs(want);
  const char* tf32 = std::getenv("NVIDIA_TF32_OVERRIDE");
  INFO("f32 forward, GPU against CPU: max |difference| " << diff << ", max |y| " << scale
                                                        << " (TF32? NVIDIA_TF32_OVERRIDE is " << (tf32 ? tf32 : "unset")
                                                        << "; it must be 0)");
  REQUIRE(diff <= 1e-5 * scale);
}

const char* fusion_name(LayerFusion fusion) { return fusion == LayerFusion::off ? "off" : "on"; }

}  // namespace

TEST_CASE("gradcheck cuda: a residual block's f32 gradients against finite differences on the GPU", "[gpu]") {
  REQUIRE(cuda_available());
  REQUIRE(kTf32Off);  // setenv succeeded
  for (Shortcut s : {Shortcut::hidden, Shortcut::input, Shortcut::input_first}) {
    for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      for (LayerFusion fusion : {LayerFusion::off, LayerFusion::on}) {
        INFO("shortcut " << shortcut_name(s) << ", format " << memory_format_name(format) << ", layer fusion "
                         << fusion_name(fusion));
        auto net = block(s, format, fusion);
        net->to(test::gpu());
        require_f32_products(*net, s, format, fusion);
        check_against_differences(*net, s, test::gpu());
        // cuDNN's fused batch norm is for half types and NHWC: where it declines, the chains
        // run layer by layer at their place (nn/fusion.cpp). Either way they were checked.
        CHECK(net->fused_chains() == (fusion == LayerFusion::off ? 0 : chains_of(s)));
        CHECK(net->fused_engine_runs() <= net->fused_chains());
      }
    }
  }
}

// bf16, channels_last, the chains fused: the gradients against the f32 CPU's (see the top).
TEST_CASE("gradcheck cuda: a residual block in bf16 with fused batch norm chains against the f32 CPU",
          "[gpu][fusion]") {
  REQUIRE(cuda_available());
  for (Shortcut s : {Shortcut::hidden, Shortcut::input, Shortcut::input_first}) {
    INFO("shortcut " << shortcut_name(s));
    auto reference = block(s, MemoryFormat::contiguous, LayerFusion::off);
    auto net = block(s, MemoryFormat::channels_last, LayerFusion::on);
    net->to(test::gpu());
    net->set_compute_dtype(DType::bf16);
    CHECK(net->fused_chains() == chains_of(s));
    const Step want = step(*reference, s, Device::cpu());
    const Step got = step(*net, s, test::gpu());
    const int64_t runs = net->fused_engine_runs();
    INFO("chains run by cuDNN: " << runs << " of " << chains_of(s));
    if (runs == 0) WARN("cuDNN declined the fused batch norm in bf16: the chains ran layer by layer");
    REQUIRE(got.names == want.names);
    for (size_t i = 0; i < got.grads.size(); ++i) {
      const double largest = test::max_abs(want.grads[i]);
      REQUIRE(largest > 0);
      test::check_all_close(got.grads[i], want.grads[i], 8 * test::kUnitBf16 * largest, got.names[i] + " gradient");
    }
  }
}
