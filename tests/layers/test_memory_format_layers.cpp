// The CPU engines that take channels_last tensors (Layer::supports_memory_format): each one
// run on channels_last inputs (and with rc.memory_format = channels_last) against the same
// layer on contiguous inputs. Outputs, input gradients, parameter gradients and buffers are
// compared in logical order; the formats of y and dx are checked against the contract
// (Conv2D: y in rc.memory_format; the others: y in the input's format; dx in x's format).
//
// Tolerances. The plain loops (max and global-average pooling, activations, Add) visit the
// same elements in the same order in both formats, so they must agree bitwise (tolerance 0).
// Conv2D runs one oneDNN primitive for both (its layouts are chosen with format_tag::any, so
// only the reorders at its edges differ) and BatchNorm and average pooling run oneDNN's NHWC
// implementations, which may sum in another order: there |a - b| <= 1e-5 + 1e-5 |b|. A sum
// of K f32 terms in another order differs by at most about K * 6e-8 * sum|terms|; here
// K <= 5*4*3 = 60 values per BatchNorm channel and 16*3*3 = 144 products per convolution
// output, all of magnitude <= ~3, so ~1e-5 absolute covers a reordering while a misplaced
// element (an O(1) error) does not pass.
#include "gradcheck.hpp"

#include "tarantella/layers.hpp"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

using namespace tnt;
using tnt::test::random_tensor;

namespace {

constexpr MemoryFormat kContiguous = MemoryFormat::contiguous;
constexpr MemoryFormat kChannelsLast = MemoryFormat::channels_last;

struct Run {
  std::vector<Tensor> y, dx, grads, buffers;
};

// A fresh layer from make(), inputs xs (contiguous) converted to in_formats, forward and
// backward with rc.memory_format = net; dy (contiguous, random) is handed over in the
// format of y, as the executor does.
Run run(const std::function<LayerPtr()>& make, const std::vector<Tensor>& xs,
        const std::vector<MemoryFormat>& in_formats, MemoryFormat net, bool training = true) {
  LayerPtr layer = make();
  RunContext rc;
  rc.training = training;
  rc.memory_format = net;
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < xs.size(); ++i) inputs.push_back(xs[i].to_memory_format(in_formats[i]));
  SavedState saved;
  Run r;
  r.y = layer->forward(inputs, rc, saved);
  REQUIRE(r.y.size() == 1);
  Tensor dy = random_tensor(r.y[0].shape(), 11, "dy").to_memory_format(r.y[0].memory_format());
  r.dx = layer->backward({dy}, rc, saved);
  REQUIRE(r.dx.size() == inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    INFO("input " << i);
    CHECK(r.dx[i].memory_format() == inputs[i].memory_format());
  }
  for (Parameter* p : layer->parameters()) r.grads.push_back(p->grad.clone());
  for (Parameter* p : layer->buffers()) r.buffers.push_back(p->value.clone());
  return r;
}

// Equal in logical order within atol + rtol |want| (0, 0: the same bits; NaN matches NaN).
void check_close(const std::string& what, const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                 double atol, double rtol) {
  REQUIRE(got.size() == want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    INFO(what << " " << t << ": " << got[t].str() << " against " << want[t].str());
    REQUIRE(got[t].shape() == want[t].shape());
    std::vector<double> g = got[t].to_double_vector(), w = want[t].to_double_vector();
    int bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const bool ok = (std::isnan(g[i]) && std::isnan(w[i])) || std::fabs(g[i] - w[i]) <= atol + rtol * std::fabs(w[i]);
      if (!ok && ++bad <= 5) FAIL_CHECK("element " << i << ": " << g[i] << " against " << w[i]);
    }
    CHECK(bad == 0);
  }
}

void check_same_run(const Run& got, const Run& want, double atol, double rtol) {
  check_close("output", got.y, want.y, atol, rtol);
  check_close("input gradient", got.dx, want.dx, atol, rtol);
  check_close("parameter gradient", got.grads, want.grads, atol, rtol);
  check_close("buffer", got.buffers, want.buffers, atol, rtol);
}

// Every combination of input format and network format against all-contiguous; y's format
// is the input's (keep = true) or the network's (Conv2D).
void check_formats(const std::function<LayerPtr()>& make, const Tensor& x, bool y_follows_network, double atol,
                   double rtol, bool training = true) {
  const Run ref = run(make, {x}, {kContiguous}, kContiguous, training);
  for (MemoryFormat in : {kContiguous, kChannelsLast}) {
    for (MemoryFormat net : {kContiguous, kChannelsLast}) {
      DYNAMIC_SECTION("input " << memory_format_name(in) << ", network " << memory_format_name(net)) {
        const Run r = run(make, {x}, {in}, net, training);
        const MemoryFormat want = y_follows_network ? net : (r.y[0].ndim() == 4 ? in : kContiguous);
        CHECK(r.y[0].memory_format() == want);
        check_same_run(r, ref, atol, rtol);
      }
    }
  }
}

}  // namespace

TEST_CASE("memory format: every supporting layer says so, the others do not", "[memory_format]") {
  for (const LayerPtr& l : std::vector<LayerPtr>{
           std::make_shared<Conv2D>(2, 3), std::make_shared<BatchNorm>(), std::make_shared<MaxPool2D>(2),
           std::make_shared<AvgPool2D>(2), std::make_shared<GlobalAveragePool>(), std::make_shared<ReLU>(),
           std::make_shared<GELU>(), std::make_shared<Sigmoid>(), std::make_shared<Tanh>(),
           std::make_shared<LeakyReLU>(), std::make_shared<Add>()}) {
    INFO(l->type());
    CHECK(l->supports_memory_format(kChannelsLast));
    CHECK(l->supports_memory_format(kContiguous));
  }
  // Dropout keys its mask on the logical index; Flatten reshapes; Dense and Softmax index
  // logically: contiguous only.
  for (const LayerPtr& l : std::vector<LayerPtr>{std::make_shared<Dropout>(0.5), std::make_shared<Flatten>(),
                                                 std::make_shared<Dense>(3), std::make_shared<Softmax>()}) {
    INFO(l->type());
    CHECK_FALSE(l->supports_memory_format(kChannelsLast));
    CHECK(l->supports_memory_format(kContiguous));
  }
}

TEST_CASE("memory format: Conv2D in channels_last equals contiguous", "[memory_format]") {
  struct Case {
    int64_t c, f, k, s, p, h, w;
    bool bias;
  };
  // Uneven sizes, stride 2 (with a dropped row and column), padding, a 1x1 kernel, and 16
  // channels (oneDNN's blocked layouts).
  for (Case t : {Case{3, 4, 3, 1, 1, 5, 5, true}, Case{2, 3, 3, 2, 0, 7, 6, false}, Case{5, 7, 1, 2, 0, 9, 7, true},
                 Case{16, 16, 3, 2, 1, 7, 5, true}}) {
    DYNAMIC_SECTION("C" << t.c << " F" << t.f << " k" << t.k << " s" << t.s << " p" << t.p << " " << t.h << "x"
                        << t.w) {
      auto make = [t] {
        auto conv = std::make_shared<Conv2D>(t.f, t.k, Conv2DOptions{.stride = t.s, .padding = t.p, .use_bias = t.bias},
                                             "conv");
        conv->ensure_built({{2, t.c, t.h, t.w}});
        conv->initialize(3);
        if (t.bias) conv->bias()->value.copy_from(random_tensor({t.f}, 3, "b"));
        return conv;
      };
      check_formats(make, random_tensor({2, t.c, t.h, t.w}, 5, "x"), true, 1e-5, 1e-5);
    }
  }
}

TEST_CASE("memory format: BatchNorm in channels_last equals contiguous", "[memory_format]") {
  auto make = [] {
    auto bn = std::make_shared<BatchNorm>(BatchNormOptions{}, "bn");
    bn->ensure_built({{5, 3, 4, 3}});
    bn->initialize(1);
    bn->weight()->value.copy_from(random_tensor({3}, 4, "gamma", 0.5, 1.5));
    bn->bias()->value.copy_from(random_tensor({3}, 4, "beta"));
    // Running statistics away from (0, 1), for the inference case.
    bn->buffers()[0]->value.copy_from(random_tensor({3}, 4, "mean"));
    bn->buffers()[1]->value.copy_from(random_tensor({3}, 4, "var", 0.5, 2.0));
    return bn;
  };
  // Values around 1.5 with spread 1: a mean far from 0 makes a summation-order bug visible.
  const Tensor x = random_tensor({5, 3, 4, 3}, 6, "x", 1.0, 2.0);
  SECTION("training (batch statistics; running statistics updated)") { check_formats(make, x, false, 1e-5, 1e-5); }
  SECTION("inference (running statistics)") { check_formats(make, x, false, 1e-5, 1e-5, false); }
}

TEST_CASE("memory format: MaxPool2D in channels_last gives the same bits", "[memory_format]") {
  struct Case {
    int64_t k, s, p, h, w;
  };
  // The 2x2/2 fast path of the NCHW loop (runs of 8 windows, a row's last run masked: 3
  // windows of 6 and 7 columns, 2 runs and 3 of 38, 2 runs of 33, 1 run and 6 of 28, 7 of
  // 15, so every mask width of both halves of a run's 16 columns), 3x3/2 with padding
  // (ResNet's stem), stride 1, and sizes that leave rows and columns out.
  for (Case t : {Case{2, 2, 0, 6, 6}, Case{2, 2, 0, 5, 7}, Case{2, 2, 0, 4, 38}, Case{2, 2, 0, 5, 33},
                 Case{2, 2, 0, 3, 28}, Case{2, 2, 0, 2, 15}, Case{2, 2, 0, 2, 11}, Case{3, 2, 1, 7, 5},
                 Case{3, 1, 1, 4, 6}, Case{3, 3, 0, 8, 7}}) {
    DYNAMIC_SECTION("k" << t.k << " s" << t.s << " p" << t.p << " " << t.h << "x" << t.w) {
      auto make = [t] { return std::make_shared<MaxPool2D>(t.k, t.s, t.p, "pool"); };
      SECTION("distinct values") { check_formats(make, test::distinct_values({2, 3, t.h, t.w}, 7, 0.01), false, 0, 0); }
      SECTION("ties (values from {-1, 0, 1}: the first maximum in row-major order wins)") {
        Tensor x = random_tensor({2, 3, t.h, t.w}, 8, "ties");
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::round(x.data<float>()[i]);
        check_formats(make, x, false, 0, 0);
      }
      SECTION("NaN (a NaN in a window wins; the first NaN takes the gradient)") {
        Tensor x = test::distinct_values({2, 3, t.h, t.w}, 9, 0.01);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (int64_t i : {int64_t{0}, int64_t{5}, int64_t{6}, int64_t{17}, x.numel() - 1}) x.data<float>()[i] = nan;
        check_formats(make, x, false, 0, 0);
        // The NaN really comes through: element 0 of x is in the first window.
        Run r = run(make, {x}, {kChannelsLast}, kChannelsLast);
        CHECK(std::isnan(r.y[0].to_vector()[0]));
      }
      SECTION("NaNs and ties everywhere (each window position, alone and together)") {
        // Values from {-1, 0, 1, NaN}, and signed zeros: every combination of the four
        // elements of a window comes up in the wider planes.
        Tensor x = random_tensor({2, 3, t.h, t.w}, 13, "mixed");
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (int64_t i = 0; i < x.numel(); ++i) {
          float& v = x.data<float>()[i];
          const float u = v;
          v = u < -0.6f ? nan : u < -0.55f ? -0.0f : std::round(u);
        }
        check_formats(make, x, false, 0, 0);
      }
    }
  }
}

TEST_CASE("memory format: AvgPool2D and GlobalAveragePool in channels_last", "[memory_format]") {
  SECTION("AvgPool2D 3x3/2 padding 1 on 7x5") {
    auto make = [] { return std::make_shared<AvgPool2D>(3, 2, 1, "pool"); };
    check_formats(make, random_tensor({2, 3, 7, 5}, 10, "x"), false, 1e-5, 1e-5);
  }
  SECTION("AvgPool2D 2x2/2 on 6x5") {
    auto make = [] { return std::make_shared<AvgPool2D>(2, 2, 0, "pool"); };
    check_formats(make, random_tensor({2, 4, 6, 5}, 11, "x"), false, 1e-5, 1e-5);
  }
  SECTION("GlobalAveragePool: (N, C) out, the same bits") {
    auto make = [] { return std::make_shared<GlobalAveragePool>("gap"); };
    check_formats(make, random_tensor({3, 5, 4, 3}, 12, "x"), false, 0, 0);
  }
}

TEST_CASE("memory format: element-wise activations keep the format, same bits", "[memory_format]") {
  std::vector<std::function<LayerPtr()>> makers{
      [] { return std::make_shared<ReLU>("a"); },      [] { return std::make_shared<GELU>(true, "a"); },
      [] { return std::make_shared<GELU>(false, "a"); }, [] { return std::make_shared<Sigmoid>("a"); },
      [] { return std::make_shared<Tanh>("a"); },      [] { return std::make_shared<LeakyReLU>(0.1, "a"); }};
  const Tensor x = random_tensor({2, 3, 5, 4}, 13, "x", -2.0, 2.0);
  for (size_t i = 0; i < makers.size(); ++i) {
    DYNAMIC_SECTION(makers[i]()->type() << " " << i) { check_formats(makers[i], x, false, 0, 0); }
  }
}

TEST_CASE("memory format: Add of mixed formats", "[memory_format]") {
  auto make = [] { return std::make_shared<Add>("add"); };
  const Tensor a = random_tensor({2, 3, 4, 5}, 14, "a"), b = random_tensor({2, 3, 4, 5}, 14, "b"),
               c = random_tensor({2, 3, 4, 5}, 14, "c");
  const Run ref2 = run(make, {a, b}, {kContiguous, kContiguous}, kContiguous);
  const Run ref3 = run(make, {a, b, c}, {kContiguous, kContiguous, kContiguous}, kContiguous);
  for (MemoryFormat fa : {kContiguous, kChannelsLast}) {
    for (MemoryFormat fb : {kContiguous, kChannelsLast}) {
      DYNAMIC_SECTION(memory_format_name(fa) << " + " << memory_format_name(fb)) {
        // The sum takes the first input's format; each gradient its input's (run checks it).
        Run r2 = run(make, {a, b}, {fa, fb}, kChannelsLast);
        CHECK(r2.y[0].memory_format() == fa);
        check_same_run(r2, ref2, 0, 0);
        Run r3 = run(make, {a, b, c}, {fa, fb, kChannelsLast}, kChannelsLast);
        CHECK(r3.y[0].memory_format() == fa);
        check_same_run(r3, ref3, 0, 0);
      }
    }
  }
}
