// The channels_last (NHWC) paths of the CUDA engines: the memory-format conversion kernel,
// and Conv2D, BatchNorm and the pooling layers with channels_last tensors against the CPU
// engine on the same logical data (the CPU side runs contiguous, so these tests do not
// depend on its own NHWC path); mixed formats; cuDNN autotuning (TNT_CUDNN_AUTOTUNE). Each
// tolerance says why it has its size.
#include "gpu_test_util.hpp"

#include "backend/cuda/layout.hpp"
#include "layers/conv2d_cuda.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>

using namespace tnt;
using tnt::test::dot_atol;
using tnt::test::gpu;
using tnt::test::kUlp;
using tnt::test::kUnitBf16;
using tnt::test::kUnitF16;
using tnt::test::kUnitFp32;
using tnt::test::kUnitTf32;
using tnt::test::max_abs;
using tnt::test::require_close;
using tnt::test::require_equal;

namespace {

constexpr MemoryFormat kNhwc = MemoryFormat::channels_last;
constexpr MemoryFormat kNchw = MemoryFormat::contiguous;

RunContext context(bool training, Device device, MemoryFormat format = kNchw) {
  RunContext rc = tnt::test::layer_context(training, device);
  rc.memory_format = format;
  return rc;
}

// Two copies of one layer (same name, so the same initial weights), one per device.
template <typename L, typename... Args>
std::pair<std::shared_ptr<L>, std::shared_ptr<L>> twins(const Shape& x, Args... args) {
  auto a = std::make_shared<L>(args...);
  auto b = std::make_shared<L>(args...);
  b->to(gpu());
  a->ensure_built({x});
  b->ensure_built({x});
  a->initialize(11);
  b->initialize(11);
  auto pa = a->parameters(), pb = b->parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) require_equal(pb[i]->value, pa[i]->value, "initial " + pa[i]->name);
  return {a, b};
}

// A host f32 tensor's values rounded to `dtype` (f32: unchanged), still f32 and contiguous:
// the CPU engine then sees exactly the numbers the GPU engine gets in `dtype`.
Tensor rounded(const Tensor& t, DType dtype) {
  return dtype == DType::f32 ? t : ops::cast(ops::cast(t, dtype), DType::f32);
}

// x (host f32, contiguous) on the GPU in `dtype` and `format` (cast first: casts are only
// ever given contiguous tensors here).
Tensor on_gpu(const Tensor& x, DType dtype, MemoryFormat format) {
  Tensor t = dtype == DType::f32 ? x : ops::cast(x, dtype);
  return t.to(gpu()).to_memory_format(format);
}

struct Run {
  Tensor y_cpu, y_gpu, dx_cpu, dx_gpu;
  std::vector<Tensor> grad_before;  // the parameter gradients both sides started from
};

struct Options {
  DType dtype = DType::f32;
  MemoryFormat x_format = kNhwc;   // the GPU input's format
  MemoryFormat rc_format = kNhwc;  // RunContext::memory_format on the GPU
  bool training = true;
  bool need_input_grads = true;
};

// The CPU engine (contiguous f32) and the CUDA engine (x in o.x_format and o.dtype, run in
// o.rc_format) on the same logical x; then backward with one random dy (given to the GPU in
// the format of its output), after setting every parameter gradient to the same random
// values on both sides (backward must ADD to them). x must already be rounded to o.dtype.
Run run_both(Layer& a, Layer& b, const Tensor& x, const Options& o, const std::string& key) {
  Run r;
  SavedState sa, sb;
  sa.need_input_grads = sb.need_input_grads = o.need_input_grads;
  r.y_cpu = a.forward({x}, context(o.training, Device::cpu()), sa).at(0);
  r.y_gpu = b.forward({on_gpu(x, o.dtype, o.x_format)}, context(o.training, gpu(), o.rc_format), sb).at(0);
  REQUIRE(r.y_gpu.device() == gpu());
  REQUIRE(r.y_gpu.shape() == r.y_cpu.shape());
  REQUIRE(r.y_gpu.dtype() == o.dtype);
  Tensor dy = rounded(test::random_tensor(r.y_cpu.shape(), key + "_dy"), o.dtype);
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!pa[i]->grad.defined()) continue;
    Tensor g = test::random_tensor(pa[i]->grad.shape(), key + "_grad_" + pa[i]->name, -0.5f, 0.5f);
    pa[i]->grad.copy_from(g);
    pb[i]->grad.copy_from(g);
    r.grad_before.push_back(g);
  }
  r.dx_cpu = a.backward({dy}, context(o.training, Device::cpu()), sa).at(0);
  r.dx_gpu = b.backward({on_gpu(dy, o.dtype, r.y_gpu.memory_format())}, context(o.training, gpu(), o.rc_format), sb)
                 .at(0);
  return r;
}

Parameter& param(Layer& l, const std::string& name) {
  for (Parameter* p : l.parameters())
    if (p->name == name) return *p;
  for (Parameter* p : l.buffers())
    if (p->name == name) return *p;
  FAIL("no parameter " << name);
  throw Error("unreachable");
}

// Gives the GPU twin of a Conv2D the weights rounded to `dtype` on both sides, and the
// half compute copy the network would keep (Network::set_compute_dtype).
void round_conv_weights(Conv2D& a, Conv2D& b, DType dtype) {
  if (dtype == DType::f32) return;
  Tensor w = rounded(a.weight().value, dtype);
  a.weight().value.copy_from(w);
  b.weight().value.copy_from(w);
  b.weight().compute = ops::cast(w, dtype).to(gpu());
}

// Host bytes of a tensor of any dtype: a pattern in which every element differs from its
// neighbours (raw bytes: no float arithmetic ever touches them).
Tensor pattern(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>((i * 131 + i / 7) % 251);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.nbytes() != b.nbytes()) return false;
  return a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("Memory-format conversion on CUDA: every element size, odd C and HW, both ways", "[gpu][layout]") {
  // Shapes around the 32 x 32 tile: smaller, equal, larger and not multiples of it; C = 1
  // and HW = 1 (the transpose of a vector); C = 3 (the images); several images.
  const std::vector<Shape> shapes = {{2, 3, 5, 7},   {1, 33, 17, 19}, {3, 64, 1, 1}, {2, 1, 31, 33},
                                     {1, 40, 40, 40}, {2, 32, 4, 8},  {1, 97, 3, 11}, {0, 5, 2, 2}};
  for (DType dt : {DType::u8, DType::f16, DType::bf16, DType::f32, DType::i32, DType::f64, DType::i64}) {
    for (const Shape& s : shapes) {
      INFO(dtype_name(dt) << " " << shape_str(s));
      Tensor host = pattern(s, dt);
      // The host loop of tensor.cpp is the reference: another implementation.
      Tensor want = host.to_memory_format(kNhwc);
      Tensor cl = host.to(gpu()).to_memory_format(kNhwc);
      REQUIRE(cl.is_channels_last());
      Tensor cl_host = cl.to(Device::cpu());
      REQUIRE(cl_host.is_channels_last());
      CHECK(same_bytes(cl_host, want));
      Tensor back = cl.to_memory_format(kNchw).to(Device::cpu());
      REQUIRE(!back.is_channels_last());
      CHECK(same_bytes(back, host));
      // And from a channels_last host tensor to contiguous on the GPU.
      Tensor back2 = want.to(gpu()).contiguous().to(Device::cpu());
      CHECK(same_bytes(back2, host));
    }
  }
}

TEST_CASE("accumulate_converted_as_float adds a KRSC gradient to a contiguous f32 one", "[gpu][layout]") {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape& s : {Shape{8, 3, 7, 7}, Shape{64, 64, 3, 3}, Shape{33, 17, 1, 1}}) {
      INFO(dtype_name(dt) << " " << shape_str(s));
      Tensor src = rounded(test::random_tensor(s, "acc_src"), dt);
      Tensor dst = test::random_tensor(s, "acc_dst");
      Tensor dst_gpu = dst.to(gpu());
      cuda::accumulate_converted_as_float(on_gpu(src, dt, kNhwc), dst_gpu);
      // One float addition of the same two floats on both sides: exact.
      std::vector<float> a = src.to_vector(), b = dst.to_vector();
      for (size_t i = 0; i < a.size(); ++i) b[i] += a[i];
      require_equal(dst_gpu, Tensor::from_vector(b, s), "dst");
    }
  }
}

namespace {

struct ConvCase {
  Shape x;
  int64_t filters, kernel, stride, padding;
  bool bias, need_input_grads;
};

// One Conv2D case on both engines (the GPU input in x_format, the network channels_last),
// every result compared with its tolerance.
void run_conv_case(const ConvCase& c, DType dt, MemoryFormat x_format = kNhwc) {
  INFO(dtype_name(dt) << " input " << shape_str(c.x) << " (" << memory_format_name(x_format) << "), filters "
                      << c.filters << ", kernel " << c.kernel << ", stride " << c.stride << ", padding " << c.padding
                      << (c.need_input_grads ? "" : ", no input gradient"));
  auto [a, b] = twins<Conv2D>(c.x, c.filters, c.kernel,
                              Conv2DOptions{.stride = c.stride, .padding = c.padding, .use_bias = c.bias}, "conv");
  round_conv_weights(*a, *b, dt);
  Tensor x = rounded(test::random_tensor(c.x, "conv_x"), dt);
  Options o;
  o.dtype = dt;
  o.x_format = x_format;
  o.need_input_grads = c.need_input_grads;
  Run r = run_both(*a, *b, x, o, "conv");
  CHECK(r.y_gpu.is_channels_last());
  const Shape& ys = r.y_cpu.shape();
  const double xmax = max_abs(x), wmax = max_abs(a->weight().value), dymax = 1.0;
  // f32: cuDNN may use TF32 tensor cores (conv2d_cuda.cu), products err by 2^-10 (as in
  // test_layers_cuda.cpp). bf16: inputs and weights are the same bf16 numbers on both
  // sides, products are exact in f32 for implicit-GEMM kernels, but a transform-based
  // algorithm may round its transformed operands to bf16: 2^-8 per product, and the
  // result is rounded to bf16 once (twice with a bias): 2 * 2^-8 relative. f16 alike
  // with its own unit, 2^-11. Zero channels added by padding add exact zeros: the same
  // bounds.
  const double half_unit = dt == DType::f16 ? kUnitF16 : kUnitBf16;
  const double unit = dt == DType::f32 ? kUnitTf32 : half_unit;
  const double rtol = dt == DType::f32 ? 0.0 : 2 * half_unit;
  const int64_t k_fwd = c.x[1] * c.kernel * c.kernel;
  require_close(r.y_gpu, r.y_cpu, dot_atol(k_fwd, xmax, wmax, unit), rtol, "y");
  if (c.need_input_grads) {
    REQUIRE(r.dx_gpu.defined());
    CHECK(r.dx_gpu.memory_format() == x_format);
    CHECK(r.dx_gpu.shape() == c.x);
    const int64_t k_data = c.filters * c.kernel * c.kernel;
    require_close(r.dx_gpu, r.dx_cpu, dot_atol(k_data, dymax, wmax, unit), rtol, "dx");
  } else {
    CHECK(!r.dx_gpu.defined());
  }
  // The weight gradient: a KRSC part (rounded to bf16 in bf16: covered by the 2^-8 unit,
  // as |part| <= k_filter * xmax * dymax) added in float to the contiguous master.
  const int64_t k_filter = ys[0] * ys[2] * ys[3];
  CHECK(!b->weight().grad.is_channels_last());
  CHECK(b->weight().grad.shape() == a->weight().grad.shape());
  require_close(b->weight().grad, a->weight().grad, dot_atol(k_filter, xmax, dymax, unit), kUlp, "dW");
  // Bias gradients are our f32 column sums of the same dy values.
  if (c.bias) require_close(b->bias()->grad, a->bias()->grad, dot_atol(k_filter, 1, dymax, kUnitFp32), kUlp, "db");
}

}  // namespace

TEST_CASE("Conv2D in channels_last matches the CPU engine (f32 with TF32, bf16, f16)", "[gpu][layout]") {
  // 3x3 stride 1 and 2 with padding, 1x1 (plain and strided, the bottleneck's shapes), 7x7
  // stride 2 on 3 channels without the input gradient (ResNet's first layer), 5x5, odd sizes.
  // The 1-3 channel inputs go through the timed channel padding choice
  // (TNT_CONV_PAD_CHANNELS=auto), whichever count it takes.
  const std::vector<ConvCase> cases = {
      {{2, 3, 9, 9}, 8, 3, 1, 1, true, true},      {{2, 4, 10, 11}, 5, 3, 2, 1, false, true},
      {{1, 2, 7, 7}, 3, 1, 1, 0, true, true},      {{2, 16, 9, 9}, 32, 1, 2, 0, false, true},
      {{2, 3, 23, 21}, 16, 7, 2, 3, false, false}, {{3, 8, 8, 8}, 4, 5, 2, 2, true, true},
      {{2, 32, 7, 7}, 24, 3, 1, 1, true, true}};
  // f16: the mixed-precision path of ResNet-50's --dtype fp16 (cuDNN's pseudo-half
  // configuration, tensor-op math), including the 3-channel first layer.
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const ConvCase& c : cases) run_conv_case(c, dt);
  }
}

TEST_CASE("Conv2D through cuDNN's graphs (TNT_CUDNN_CONV_GRAPH) matches the CPU engine", "[gpu][layout]") {
  REQUIRE(tnt::config().cudnn_conv_graph);
  REQUIRE(tnt::config().cudnn_autotune);
  // Every timed direction takes a graph that agrees with its algorithm, whatever its speed;
  // shapes no other case uses (batch 3), so that each direction is timed here.
  cuda::conv2d_force_graphs(true);
  struct Reset {
    ~Reset() { cuda::conv2d_force_graphs(false); }
  } reset;
  const std::vector<ConvCase> cases = {{{3, 16, 9, 9}, 8, 3, 1, 1, true, true},
                                       {{3, 32, 8, 8}, 16, 1, 2, 0, false, true},
                                       {{3, 8, 12, 12}, 8, 5, 2, 2, false, true},
                                       {{3, 3, 17, 15}, 8, 7, 2, 3, false, false}};
  for (DType dt : {DType::bf16, DType::f16}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const int64_t before = cuda::conv2d_graph_runs();
      run_conv_case(cases[i], dt);
      // The plain shapes: forward, data and filter gradients all through a graph (the
      // others too, where cuDNN plans one: the comparison above holds either way).
      if (i < 2) CHECK(cuda::conv2d_graph_runs() - before == 3);
    }
  }
}

TEST_CASE("Channel padding on CUDA: pad, unpad and the filter gradient's sum against the host", "[gpu][layout]") {
  // Images (1-3 channels) and filters (F, C, k, k); odd sizes; no images at all.
  const std::vector<Shape> shapes = {{2, 3, 5, 7}, {1, 1, 9, 4}, {3, 2, 1, 1}, {64, 3, 7, 7}, {0, 3, 2, 2}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t cp : {4, 8}) {
      for (const Shape& s : shapes) {
        for (MemoryFormat f : {kNchw, kNhwc}) {
          INFO(dtype_name(dt) << " " << shape_str(s) << " " << memory_format_name(f) << " -> " << cp << " channels");
          Tensor host = rounded(test::random_tensor(s, "pad_src"), dt);  // exact in dt
          Tensor src = on_gpu(host, dt, f);
          Tensor padded = cuda::pad_channels(src, cp);
          REQUIRE(padded.is_channels_last());
          REQUIRE(padded.shape() == Shape({s[0], cp, s[2], s[3]}));
          Tensor got = padded.to(Device::cpu()).contiguous();
          if (dt != DType::f32) got = ops::cast(got, DType::f32);
          // The reference: the same values in the first channels, zeros after. Exact.
          std::vector<float> want(static_cast<size_t>(shape_numel(got.shape())), 0.0f);
          const std::vector<float> h = host.to_vector();
          const int64_t hw = s[2] * s[3];
          for (int64_t n = 0; n < s[0]; ++n)
            for (int64_t c = 0; c < s[1]; ++c)
              for (int64_t q = 0; q < hw; ++q)
                want[static_cast<size_t>((n * cp + c) * hw + q)] = h[static_cast<size_t>((n * s[1] + c) * hw + q)];
          require_equal(got, Tensor::from_vector(want, got.shape()), "padded");
          // Back: the first channels, in the format asked for, bit for bit.
          Tensor back = Tensor::empty(s, dt, gpu(), f);
          cuda::unpad_channels(padded, back);
          CHECK(back.memory_format() == f);
          CHECK(same_bytes(back.to(Device::cpu()).contiguous(), src.to(Device::cpu()).contiguous()));
          // The filter gradient's sum: one float addition of the same two floats, exact.
          if (f == kNchw) {
            Tensor dst = test::random_tensor(s, "pad_dst");
            Tensor dst_gpu = dst.to(gpu());
            cuda::accumulate_unpadded_as_float(padded, dst_gpu);
            std::vector<float> sum = dst.to_vector();
            for (size_t i = 0; i < sum.size(); ++i) sum[i] += h[i];
            require_equal(dst_gpu, Tensor::from_vector(sum, s), "accumulated");
          }
        }
      }
    }
  }
}

// Run by the CTest entries layers_layout_cuda_pad4 and _pad8 under TNT_CONV_PAD_CHANNELS=4
// or 8: every 1-3 channel input of a channels_last Conv2D runs padded (the counter says it
// did), with the same results as the CPU engine; images in either format, with and
// without the input gradient, a 1x1 filter, one channel.
TEST_CASE("TNT_CONV_PAD_CHANNELS=4 or 8: padded convolutions match the CPU engine", "[.conv_pad]") {
  const char* env = std::getenv("TNT_CONV_PAD_CHANNELS");
  INFO("TNT_CONV_PAD_CHANNELS=" << (env ? env : "(unset)"));
  REQUIRE(env != nullptr);
  REQUIRE((std::string(env) == "4" || std::string(env) == "8"));
  // f16/bf16: through a cuDNN graph too wherever one is planned and agrees with its
  // algorithm, whatever its speed (this process times every problem afresh), so that the
  // padded operands (KRSC filters of 4 or 8 channels) meet the graph API here, not only
  // when a graph happens to be faster.
  cuda::conv2d_force_graphs(true);
  struct Reset {
    ~Reset() { cuda::conv2d_force_graphs(false); }
  } reset;
  const int64_t graph_runs_before = cuda::conv2d_graph_runs();
  const std::vector<ConvCase> cases = {{{2, 3, 23, 21}, 16, 7, 2, 3, false, false},
                                       {{2, 3, 23, 21}, 16, 7, 2, 3, true, true},
                                       {{2, 3, 9, 9}, 8, 3, 1, 1, true, true},
                                       {{1, 2, 7, 7}, 3, 1, 1, 0, true, true},
                                       {{2, 1, 10, 11}, 5, 3, 2, 1, false, true}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (MemoryFormat f : {kNchw, kNhwc}) {
      for (const ConvCase& c : cases) {
        const int64_t before = cuda::conv2d_padded_forwards();
        run_conv_case(c, dt, f);
        CHECK(cuda::conv2d_padded_forwards() == before + 1);
      }
    }
  }
  // How many directions ran through a graph: cuDNN decides which it plans, so not checked.
  std::printf("[conv_pad] TNT_CONV_PAD_CHANNELS=%s: %lld convolution directions ran through a cuDNN graph\n", env,
              static_cast<long long>(cuda::conv2d_graph_runs() - graph_runs_before));
  // 4 channels and more are never padded.
  const int64_t before = cuda::conv2d_padded_forwards();
  run_conv_case({{2, 4, 10, 11}, 5, 3, 2, 1, false, true}, DType::bf16);
  CHECK(cuda::conv2d_padded_forwards() == before);
}

TEST_CASE("Conv2D on CUDA with mixed formats: the input is converted, dx comes back in its format", "[gpu][layout]") {
  const Shape xs{2, 3, 11, 10};
  for (auto [x_format, rc_format] : {std::pair{kNchw, kNhwc}, std::pair{kNhwc, kNchw}}) {
    INFO("input " << memory_format_name(x_format) << ", network " << memory_format_name(rc_format));
    auto [a, b] = twins<Conv2D>(xs, 8, 3, Conv2DOptions{.stride = 2, .padding = 1}, "conv_mixed");
    Tensor x = test::random_tensor(xs, "conv_mixed_x");
    Options o;
    o.x_format = x_format;
    o.rc_format = rc_format;
    Run r = run_both(*a, *b, x, o, "conv_mixed");
    CHECK(r.y_gpu.memory_format() == rc_format);
    CHECK(r.dx_gpu.memory_format() == x_format);
    const double xmax = max_abs(x), wmax = max_abs(a->weight().value);
    // TF32 products, as above.
    require_close(r.y_gpu, r.y_cpu, dot_atol(3 * 9, xmax, wmax, kUnitTf32), 0, "y");
    require_close(r.dx_gpu, r.dx_cpu, dot_atol(8 * 9, 1.0, wmax, kUnitTf32), 0, "dx");
    const Shape& ys = r.y_cpu.shape();
    require_close(b->weight().grad, a->weight().grad, dot_atol(ys[0] * ys[2] * ys[3], xmax, 1.0, kUnitTf32), kUlp,
                  "dW");
  }
}

TEST_CASE("CUDA engines refuse an output gradient in the other memory format", "[gpu][layout]") {
  const Shape xs{2, 4, 6, 6};
  Tensor x = test::random_tensor(xs, "wrong_x").to(gpu()).to_memory_format(kNhwc);
  RunContext rc = context(true, gpu(), kNhwc);
  auto expect_refusal = [](const std::function<void()>& run, const std::string& layer) {
    try {
      run();
      FAIL(layer << " accepted a contiguous gradient for a channels_last output");
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(layer) != std::string::npos);
      CHECK(msg.find("channels_last") != std::string::npos);
    }
  };
  Conv2D conv(4, 3, Conv2DOptions{.padding = 1}, "wrong_conv");
  conv.to(gpu());
  SavedState sc;
  Tensor y = conv.forward({x}, rc, sc).at(0);
  REQUIRE(y.is_channels_last());
  expect_refusal([&] { conv.backward({y.contiguous()}, rc, sc); }, "wrong_conv");
  BatchNorm bn("wrong_bn");
  bn.to(gpu());
  SavedState sb;
  y = bn.forward({x}, rc, sb).at(0);
  REQUIRE(y.is_channels_last());
  expect_refusal([&] { bn.backward({y.contiguous()}, rc, sb); }, "wrong_bn");
  MaxPool2D pool(2, 2, 0, "wrong_pool");
  pool.to(gpu());
  SavedState sp;
  y = pool.forward({x}, rc, sp).at(0);
  REQUIRE(y.is_channels_last());
  expect_refusal([&] { pool.backward({y.contiguous()}, rc, sp); }, "wrong_pool");
}

TEST_CASE("BatchNorm in channels_last matches the CPU engine", "[gpu][layout]") {
  struct Case {
    Shape x;
    bool training, affine;
    DType dtype;
  };
  // C = 64 and 32 where cuDNN's NHWC kernels apply; odd C and sizes; inference (ours).
  const std::vector<Case> cases = {{{4, 5, 6, 7}, true, true, DType::f32},   {{4, 3, 5, 5}, true, false, DType::f32},
                                   {{4, 64, 6, 7}, true, true, DType::f32},  {{4, 5, 6, 7}, false, true, DType::f32},
                                   {{3, 32, 5, 3}, false, true, DType::f32}, {{4, 32, 6, 6}, true, true, DType::bf16},
                                   {{2, 64, 5, 5}, false, true, DType::bf16}, {{4, 32, 6, 6}, true, true, DType::f16}};
  for (const Case& c : cases) {
    INFO(dtype_name(c.dtype) << " input " << shape_str(c.x) << (c.training ? ", training" : ", inference")
                             << (c.affine ? "" : ", no affine"));
    auto [a, b] = twins<BatchNorm>(c.x, BatchNormOptions{.affine = c.affine}, "bn");
    const int64_t ch = c.x[1];
    for (const char* name : {"weight", "bias", "running_mean", "running_var"}) {
      if (!c.affine && (std::string(name) == "weight" || std::string(name) == "bias")) continue;
      const bool var = std::string(name) == "running_var";
      Tensor v = test::random_tensor({ch}, std::string("bn_") + name, var ? 0.5f : -0.5f, var ? 2.0f : 0.5f);
      param(*a, name).value.copy_from(v);
      param(*b, name).value.copy_from(v);
    }
    Tensor x = rounded(test::random_tensor(c.x, "bn_x", -2.0f, 3.0f), c.dtype);
    Options o;
    o.dtype = c.dtype;
    o.training = c.training;
    Run r = run_both(*a, *b, x, o, "bn");
    CHECK(r.y_gpu.is_channels_last());
    CHECK(r.dx_gpu.is_channels_last());
    const int64_t m = x.numel() / ch;  // values per channel
    REQUIRE(m <= 168);                 // the bound below
    // f32 (as in test_layers_cuda.cpp): mean and variance are float sums of m values computed
    // differently on the two sides, relative error <= m * 2^-24 ~ 1e-5, which moves a
    // normalised value (|xhat| <= 4 here, |gamma| <= 0.5) by well under 1e-4.
    // bf16: y and dx are rounded to bf16 once more: 2^-8 relative, doubled for slack (f16,
    // 2^-11, takes the same looser bound).
    const double stat = 1e-4;
    const double rtol = c.dtype == DType::f32 ? 1e-4 : 2 * kUnitBf16;
    require_close(r.y_gpu, r.y_cpu, stat, rtol, "y");
    require_close(r.dx_gpu, r.dx_cpu, stat, rtol, "dx");
    if (c.affine) {
      // Sums over m of dy * xhat (|dy| <= 1, |xhat| <= 4) with xhat off by `stat` at worst.
      const double atol = static_cast<double>(m) * stat + dot_atol(m, 1, 4, kUnitFp32);
      require_close(param(*b, "weight").grad, param(*a, "weight").grad, atol, kUlp, "dgamma");
      require_close(param(*b, "bias").grad, param(*a, "bias").grad, dot_atol(m, 1, 1, kUnitFp32), kUlp, "dbeta");
    }
    // Running statistics: 0.9 * old + 0.1 * batch (unbiased variance), the same 1e-5 argument
    // (inputs are the same numbers on both sides in bf16 too).
    require_close(param(*b, "running_mean").value, param(*a, "running_mean").value, 1e-5, 1e-5, "running_mean");
    require_close(param(*b, "running_var").value, param(*a, "running_var").value, 1e-5, 1e-5, "running_var");
  }
}

TEST_CASE("MaxPool2D and AvgPool2D in channels_last match the CPU engines", "[gpu][layout]") {
  struct Case {
    Shape x;
    int64_t pool, stride, padding;
  };
  const std::vector<Case> cases = {{{2, 3, 8, 8}, 2, 0, 0}, {{2, 3, 9, 9}, 3, 2, 1}, {{1, 2, 7, 6}, 3, 1, 1},
                                   {{2, 64, 11, 11}, 3, 2, 1}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " input " << shape_str(c.x) << ", pool " << c.pool << ", stride " << c.stride
                          << ", padding " << c.padding);
      Tensor x = rounded(test::random_tensor(c.x, "pool_x"), dt);  // no ties: the argmax is unique
      Options o;
      o.dtype = dt;
      {
        auto [a, b] = twins<MaxPool2D>(c.x, c.pool, c.stride, c.padding, "maxpool");
        Run r = run_both(*a, *b, x, o, "maxpool");
        CHECK(r.y_gpu.is_channels_last());
        CHECK(r.dx_gpu.is_channels_last());
        require_equal(r.y_gpu, r.y_cpu, "max y");  // a selection: exact
        // Overlapping windows add up to 9 values of |dy| <= 1: 8 float roundings of at most
        // 2^-24 * 9; bf16 rounds that sum once more (2^-8 relative, doubled for slack).
        require_close(r.dx_gpu, r.dx_cpu, 8 * 9 * kUnitFp32, dt == DType::f32 ? 0 : 2 * kUnitBf16, "max dx");
      }
      {
        auto [a, b] = twins<AvgPool2D>(c.x, c.pool, c.stride, c.padding, "avgpool");
        Run r = run_both(*a, *b, x, o, "avgpool");
        CHECK(r.y_gpu.is_channels_last());
        CHECK(r.dx_gpu.is_channels_last());
        // A mean of at most 9 values in [-1, 1]: 10 roundings in f32. cuDNN's internal
        // precision on bf16 is not documented: allow bf16 accumulation, 9 roundings of 2^-8.
        const double atol = dt == DType::f32 ? 10 * kUnitFp32 : 10 * kUnitBf16;
        const double rtol = dt == DType::f32 ? kUlp : 2 * kUnitBf16;
        require_close(r.y_gpu, r.y_cpu, atol, rtol, "avg y");
        require_close(r.dx_gpu, r.dx_cpu, atol, rtol, "avg dx");
      }
    }
  }
}

TEST_CASE("MaxPool2D in channels_last: a NaN anywhere in a window wins, first maximum otherwise", "[gpu][layout]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  {
    // One window per channel: channel 0 has its NaN third, channel 1 a tie (the first of the
    // two equal maxima gets the gradient), channel 2 all equal.
    Tensor x = Tensor::from_vector({1.0f, 2.0f, nan, 3.0f, 5.0f, 1.0f, 5.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
                                   {1, 3, 2, 2});
    MaxPool2D pool(2, 2, 0, "nan_nhwc");
    pool.to(gpu());
    SavedState s;
    RunContext rc = context(true, gpu(), kNhwc);
    Tensor y = pool.forward({x.to(gpu()).to_memory_format(kNhwc)}, rc, s).at(0);
    REQUIRE(y.is_channels_last());
    std::vector<float> yv = y.to_vector();
    REQUIRE(yv.size() == 3);
    CHECK(std::isnan(yv[0]));
    CHECK(yv[1] == 5.0f);
    CHECK(yv[2] == 0.0f);
    Tensor dy = Tensor::from_vector({3.0f, 4.0f, 5.0f}, {1, 3, 1, 1}).to(gpu()).to_memory_format(kNhwc);
    Tensor dx = pool.backward({dy}, rc, s).at(0);
    CHECK(dx.is_channels_last());
    CHECK(dx.to_vector() == std::vector<float>{0, 0, 3, 0, 4, 0, 0, 0, 5, 0, 0, 0});
  }
  // Against the CPU engine with NaNs spread over the windows (several in some).
  for (int64_t every : {5, 7, 1}) {
    INFO("a NaN every " << every << " elements");
    const Shape xs{2, 6, 9, 9};
    auto [a, b] = twins<MaxPool2D>(xs, 3, 2, 1, "maxpool_nan");
    Tensor x = test::random_tensor(xs, "maxpool_nan_x");
    float* xp = x.data<float>();
    for (int64_t i = every / 2; i < x.numel(); i += every) xp[i] = nan;
    Options o;
    Run r = run_both(*a, *b, x, o, "maxpool_nan");
    int64_t nans = 0;
    for (float v : r.y_cpu.to_vector()) nans += std::isnan(v);
    REQUIRE(nans > 0);  // the case tests something
    require_equal(r.y_gpu, r.y_cpu, "y");  // NaN where the CPU has NaN, the rest equal
    require_close(r.dx_gpu, r.dx_cpu, 8 * 9 * kUnitFp32, 0, "dx");  // as in the case without NaN
  }
}

TEST_CASE("GlobalAveragePool on CUDA: channels_last, and the contiguous word-sized path", "[gpu][layout]") {
  struct Case {
    Shape x;
    MemoryFormat format;
    DType dtype;
  };
  // 8 x 8 planes: 16-byte words for f32 (4) and bf16 (8); 7 x 5 and 3 x 3: the element path.
  const std::vector<Case> cases = {{{2, 3, 7, 5}, kNhwc, DType::f32},    {{4, 64, 7, 7}, kNhwc, DType::f32},
                                   {{2, 40, 3, 3}, kNhwc, DType::bf16},  {{2, 3, 8, 8}, kNchw, DType::f32},
                                   {{3, 5, 8, 8}, kNchw, DType::bf16},   {{2, 3, 7, 5}, kNchw, DType::f32},
                                   {{2, 3, 3, 3}, kNchw, DType::bf16}};
  for (const Case& c : cases) {
    INFO(dtype_name(c.dtype) << " " << shape_str(c.x) << " " << memory_format_name(c.format));
    auto [a, b] = twins<GlobalAveragePool>(c.x, "gap");
    Tensor x = rounded(test::random_tensor(c.x, "gap_x"), c.dtype);
    Options o;
    o.dtype = c.dtype;
    o.x_format = c.format;
    Run r = run_both(*a, *b, x, o, "gap");
    CHECK(!r.y_gpu.is_channels_last());
    CHECK(r.dx_gpu.memory_format() == c.format);
    const int64_t hw = c.x[2] * c.x[3];
    // A float sum of hw values in [-1, 1], then a division: hw + 1 roundings; bf16 rounds the
    // mean and dy / hw once more (2^-8 relative, doubled for slack).
    const double rtol = c.dtype == DType::f32 ? 2 * kUlp : 2 * kUnitBf16;
    require_close(r.y_gpu, r.y_cpu, static_cast<double>(hw + 1) * kUnitFp32, rtol, "y");
    require_close(r.dx_gpu, r.dx_cpu, 0, rtol, "dx");
  }
}

namespace {

// One forward and backward of a fresh Conv2D (12 filters, 3x3, padding 1) on both engines,
// compared as in the cases above; returns how many problems this process has timed after.
int64_t autotune_step(const Shape& xs, const std::string& name) {
  auto [a, b] = twins<Conv2D>(xs, 12, 3, Conv2DOptions{.stride = 1, .padding = 1}, name);
  Tensor x = test::random_tensor(xs, name + "_x");
  Options o;
  Run r = run_both(*a, *b, x, o, name);
  const double xmax = max_abs(x), wmax = max_abs(a->weight().value);
  // TF32 products, as in the cases above.
  require_close(r.y_gpu, r.y_cpu, dot_atol(xs[1] * 9, xmax, wmax, kUnitTf32), 0, "y");
  require_close(r.dx_gpu, r.dx_cpu, dot_atol(12 * 9, 1.0, wmax, kUnitTf32), 0, "dx");
  require_close(b->weight().grad, a->weight().grad, dot_atol(xs[0] * xs[2] * xs[3], xmax, 1.0, kUnitTf32), kUlp,
                "dW");
  return cuda::conv2d_autotune_searches();
}

}  // namespace

TEST_CASE("Conv2D autotuning: each problem timed once per direction, shared by equal layers", "[gpu][layout]") {
  const char* env = std::getenv("TNT_CUDNN_AUTOTUNE");
  INFO("TNT_CUDNN_AUTOTUNE=" << (env ? env : "(unset)"));
  REQUIRE((env == nullptr || std::string(env) == "1"));  // on, the default
  // A shape no other case uses, so the process-wide cache has no entry for it yet.
  const int64_t start = cuda::conv2d_autotune_searches();
  CHECK(autotune_step({3, 7, 13, 12}, "tuned_a") - start == 3);  // forward, backward data, backward filter
  // A second layer with the same problem (another name and weights, the same shapes):
  // nothing timed again.
  CHECK(autotune_step({3, 7, 13, 12}, "tuned_b") - start == 3);
  // Another shape is another problem.
  CHECK(autotune_step({3, 7, 13, 11}, "tuned_c") - start == 6);
}

// Run by the CTest entry layers_layout_cuda_autotune_off with TNT_CUDNN_AUTOTUNE=0.
TEST_CASE("TNT_CUDNN_AUTOTUNE=0: cuDNN's heuristics, nothing timed, the same results", "[.autotune_off]") {
  const char* env = std::getenv("TNT_CUDNN_AUTOTUNE");
  REQUIRE(env != nullptr);
  REQUIRE(std::string(env) == "0");
  CHECK(autotune_step({3, 7, 13, 12}, "heuristic_a") == 0);
  CHECK(autotune_step({2, 5, 9, 9}, "heuristic_b") == 0);
}

// Run by the CTest entry layout_cuda_deterministic with TNT_DETERMINISTIC=1 and
// TNT_CUDNN_AUTOTUNE=1: a channels_last Conv2D -> BatchNorm -> MaxPool2D step twice, from the
// same weights; every gradient bitwise equal (the algorithms are timed in the first run and
// only deterministic ones qualify).
TEST_CASE("deterministic mode with autotuning: channels_last gradients repeat bitwise", "[.layout_deterministic]") {
  REQUIRE(tnt::config().deterministic);
  const char* env = std::getenv("TNT_CUDNN_AUTOTUNE");
  REQUIRE(env != nullptr);
  REQUIRE(std::string(env) == "1");
  const Shape xs{8, 16, 14, 14};
  Tensor x = test::random_tensor(xs, "det_x");
  const int64_t searches_before = cuda::conv2d_autotune_searches();
  auto grads = [&] {
    Conv2D conv(32, 3, Conv2DOptions{.stride = 1, .padding = 1}, "det_conv");
    BatchNorm bn("det_bn");
    MaxPool2D pool(3, 2, 1, "det_pool");
    for (Layer* l : std::initializer_list<Layer*>{&conv, &bn, &pool}) l->to(gpu());
    RunContext rc = context(true, gpu(), kNhwc);
    SavedState s1, s2, s3;
    Tensor h = conv.forward({x.to(gpu())}, rc, s1).at(0);  // a contiguous input: converted
    h = bn.forward({h}, rc, s2).at(0);
    h = pool.forward({h}, rc, s3).at(0);
    Tensor dh = pool.backward({h}, rc, s3).at(0);  // dy = y: data-dependent, repeatable
    dh = bn.backward({dh}, rc, s2).at(0);
    Tensor dx = conv.backward({dh}, rc, s1).at(0);
    return std::vector<Tensor>{dx, conv.weight().grad.clone(), conv.bias()->grad.clone(), bn.weight()->grad.clone(),
                               bn.bias()->grad.clone()};
  };
  std::vector<Tensor> first = grads(), second = grads();
  CHECK(cuda::conv2d_autotune_searches() - searches_before == 3);  // timed in the first run only
  for (size_t i = 0; i < first.size(); ++i) require_equal(second[i], first[i], "gradient " + std::to_string(i));
}
