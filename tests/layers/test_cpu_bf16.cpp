// bf16 products on the CPU (TNT_CPU_BF16; runtime/src/backend/cpu/dnnl_context.hpp): Conv2D
// and Dense given bf16 activations multiply them by a bf16 copy of their weights in oneDNN,
// with f32 sums, and return bf16. Each is checked against its own f32 engine run on the same
// rounded values: the products of two bf16 values are exact in f32, so the two differ only
// by the rounding of each bf16 output (at most half a bf16 unit, 2^-9 relative) and by the
// order of the f32 sums. Also: the knob's decision, the network's executor handing the two
// layers bf16 (their weights' bf16 copies exist only then), and the refusal where oneDNN has
// no bf16 on the CPU (run under ONEDNN_MAX_CPU_ISA=AVX2 by layers_cpu_bf16_avx2).
#include "gradcheck.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

using namespace tnt;
using tnt::test::random_tensor;

namespace {

Tensor round_bf16(const Tensor& t) { return ops::cast(ops::cast(t, DType::bf16), DType::f32); }

// |a - ref| <= rel |ref| + abs for every element, a named failure otherwise. rel is 2^-8 for a
// bf16 output (twice its rounding's 2^-9: a margin for the sums' order); abs bounds the order
// of the f32 sums: k terms of magnitude m differ by at most about k * 2^-24 * k * m.
void check_close(const std::string& what, const Tensor& a, const Tensor& ref, double rel, double abs) {
  REQUIRE(a.shape() == ref.shape());
  const std::vector<double> x = a.to_double_vector(), y = ref.to_double_vector();
  int bad = 0;
  std::string first;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(std::fabs(x[i] - y[i]) <= rel * std::fabs(y[i]) + abs)) {
      if (bad++ == 0) first = std::to_string(i) + ": " + std::to_string(x[i]) + " against " + std::to_string(y[i]);
    }
  }
  INFO(what << ": " << bad << " of " << x.size() << " elements off, the first at " << first);
  CHECK(bad == 0);
}

void zero_grads(Layer& l) {
  for (Parameter* p : l.parameters()) p->grad.fill_(0.0);
}

// The network's bf16 copy of each weight that a bf16 engine multiplies by.
void give_bf16_copies(Layer& l) {
  for (Parameter* p : l.parameters()) {
    if (p->cast_for_compute) p->compute = ops::cast(p->value, DType::bf16);
  }
}

// A twin layer whose f32 weights are the bf16-rounded weights of `from`.
void copy_rounded(Layer& to, Layer& from) {
  std::vector<Parameter*> a = to.parameters(), b = from.parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i]->value.copy_from(b[i]->cast_for_compute ? round_bf16(b[i]->value) : b[i]->value);
  }
}

// Where they do not multiply in bf16 the layers refuse bf16 inputs, naming themselves.
void check_refused() {
  Conv2D conv(4, 3, Conv2DOptions{1, 1, true}, "stem");
  conv.ensure_built({{1, 3, 8, 8}});
  give_bf16_copies(conv);
  RunContext rc;
  SavedState s;
  CHECK_THROWS_WITH(conv.forward({ops::cast(random_tensor({1, 3, 8, 8}, 1, "x"), DType::bf16)}, rc, s),
                    Catch::Matchers::Contains("'stem' (Conv2D)"));
}

}  // namespace

TEST_CASE("TNT_CPU_BF16: the decision and the emulation's reason", "[cpu_bf16][decision]") {
  using M = AutoSwitch::Mode;
  CHECK(cpu::native_bf16_for(AutoSwitch(M::on), false));
  CHECK(cpu::native_bf16_for(AutoSwitch(M::on), true));
  CHECK_FALSE(cpu::native_bf16_for(AutoSwitch(M::off), true));
  CHECK_FALSE(cpu::native_bf16_for(AutoSwitch(M::off), false));
  CHECK(cpu::native_bf16_for(AutoSwitch(M::automatic), true));
  CHECK_FALSE(cpu::native_bf16_for(AutoSwitch(M::automatic), false));
  // f16 is always emulated on the CPU, and says why.
  CHECK(cpu::emulation_reason(DType::f16).find("bf16") != std::string::npos);
  const bool native = cpu::native_bf16();
  CHECK(cpu::emulation_reason(DType::bf16).empty() == native);
  INFO("oneDNN's instruction set: " << cpu::isa_name());
  CHECK(cpu::isa_name() != "unknown");
  if (config().cpu_bf16.automatic()) CHECK(native == cpu::has_bf16_instructions());
  Conv2D conv(2, 3);
  Dense dense(2);
  CHECK(conv.cpu_computes_in(DType::f32));
  CHECK(conv.cpu_computes_in(DType::bf16) == native);
  CHECK(dense.cpu_computes_in(DType::bf16) == native);
  CHECK_FALSE(conv.cpu_computes_in(DType::f16));
  CHECK_FALSE(dense.cpu_computes_in(DType::f16));
}

TEST_CASE("Conv2D in bf16 on the CPU: its f32 engine on the rounded values", "[cpu_bf16][conv]") {
  INFO("oneDNN's instruction set: " << cpu::isa_name());
  if (!cpu::native_bf16()) {  // no bf16 products here: bf16 refused (as layers_cpu_bf16_avx2 tests)
    check_refused();
    return;
  }
  struct Case {
    Shape x;
    int64_t filters, k, stride, pad;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{2, 5, 9, 7}, 6, 3, 1, 1, true},    // odd sizes, channels off oneDNN's blocks of 16
      {{2, 5, 9, 7}, 6, 3, 2, 1, false},   // strided, no bias
      {{3, 32, 6, 6}, 16, 1, 1, 0, true},  // a 1x1 convolution on whole channel blocks
      {{1, 3, 12, 10}, 8, 7, 2, 3, true},  // a stem: 3 channels, a 7x7 kernel
  };
  for (const MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& c = cases[ci];
      DYNAMIC_SECTION("case " << ci << (format == MemoryFormat::channels_last ? " channels_last" : " contiguous")) {
        Conv2DOptions o;
        o.stride = c.stride;
        o.padding = c.pad;
        o.use_bias = c.bias;
        Conv2D conv(c.filters, c.k, o, "conv");
        Conv2D twin(c.filters, c.k, o, "twin");
        conv.ensure_built({c.x});
        twin.ensure_built({c.x});
        conv.initialize(7);
        if (c.bias) conv.bias()->value.copy_from(random_tensor({c.filters}, 3, "b"));
        copy_rounded(twin, conv);
        give_bf16_copies(conv);
        zero_grads(conv);
        zero_grads(twin);
        RunContext rc;
        rc.training = true;
        rc.memory_format = format;
        const Tensor x = round_bf16(random_tensor(c.x, 1, "x")).to_memory_format(format);
        SavedState s, t;
        const Tensor y = conv.forward({ops::cast(x, DType::bf16)}, rc, s)[0];
        const Tensor yref = twin.forward({x}, rc, t)[0];
        REQUIRE(y.dtype() == DType::bf16);
        CHECK(y.memory_format() == format);
        const double terms = static_cast<double>(c.x[1] * c.k * c.k);
        check_close("y", y, yref, 1.0 / 256, terms * terms * 0x1p-24);
        const Tensor dy = round_bf16(random_tensor(yref.shape(), 2, "dy")).to_memory_format(format);
        const Tensor dx = conv.backward({ops::cast(dy, DType::bf16)}, rc, s)[0];
        const Tensor dxref = twin.backward({dy}, rc, t)[0];
        REQUIRE(dx.dtype() == DType::bf16);
        CHECK(dx.memory_format() == x.memory_format());
        const double back_terms = static_cast<double>(c.filters * c.k * c.k);
        check_close("dx", dx, dxref, 1.0 / 256, back_terms * back_terms * 0x1p-24);
        // The weight and bias gradients stay f32: sums over N * Ho * Wo products, in another order.
        const double wterms = static_cast<double>(yref.numel() / c.filters);
        REQUIRE(conv.weight().grad.dtype() == DType::f32);
        check_close("dw", conv.weight().grad, twin.weight().grad, 1e-5, wterms * wterms * 0x1p-24);
        if (c.bias) check_close("db", conv.bias()->grad, twin.bias()->grad, 1e-5, wterms * wterms * 0x1p-24);
      }
    }
  }
}

TEST_CASE("Dense in bf16 on the CPU: its f32 engine on the rounded values", "[cpu_bf16][dense]") {
  INFO("oneDNN's instruction set: " << cpu::isa_name());
  if (!cpu::native_bf16()) {  // no bf16 products here: bf16 refused (as layers_cpu_bf16_avx2 tests)
    check_refused();
    return;
  }
  for (const bool relu : {false, true}) {
    for (const double rate : {0.0, 0.25}) {
      for (const bool bias : {true, false}) {
        DYNAMIC_SECTION("relu " << relu << " dropout " << rate << " bias " << bias) {
          DenseOptions o;
          o.use_bias = bias;
          if (relu) o.activation = DenseActivation::relu;
          o.dropout = rate;
          const Shape in{3, 7, 20};  // 21 rows of 20 features
          const int64_t units = 13;  // off every vector width
          Dense dense(units, o, "dense");
          Dense twin(units, o, "dense");  // the same name: the same dropout mask
          dense.ensure_built({in});
          twin.ensure_built({in});
          dense.initialize(5);
          if (bias) dense.bias()->value.copy_from(random_tensor({units}, 4, "b"));
          copy_rounded(twin, dense);
          give_bf16_copies(dense);
          zero_grads(dense);
          zero_grads(twin);
          RunContext rc;
          rc.training = true;
          rc.step = 3;
          const Tensor x = round_bf16(random_tensor(in, 1, "x"));
          SavedState s, t;
          const Tensor y = dense.forward({ops::cast(x, DType::bf16)}, rc, s)[0];
          const Tensor yref = twin.forward({x}, rc, t)[0];
          REQUIRE(y.dtype() == DType::bf16);
          check_close("y", y, yref, 1.0 / 256, 20.0 * 20.0 * 0x1p-24);
          const Tensor dy = round_bf16(random_tensor(yref.shape(), 2, "dy"));
          const Tensor dx = dense.backward({ops::cast(dy, DType::bf16)}, rc, s)[0];
          const Tensor dxref = twin.backward({dy}, rc, t)[0];
          REQUIRE(dx.dtype() == DType::bf16);
          // With dropout the f32 gradient behind it (dy / keep) is rounded to bf16 before the
          // products, adding up to 2^-9 of each of 13 terms of magnitude up to 1.34 * 1: 0.04.
          const double extra = rate > 0 ? 13 * 1.34 * 0x1p-9 : 0.0;
          check_close("dx", dx, dxref, 1.0 / 256, 13.0 * 13.0 * 0x1p-24 + extra);
          // Weight gradients: sums over 21 rows; with dropout each term carries that rounding too.
          const double wextra = rate > 0 ? 21 * 1.34 * 0x1p-9 : 0.0;
          check_close("dw", dense.weight().grad, twin.weight().grad, 1e-5, 21.0 * 21.0 * 0x1p-24 + wextra);
          // The bias gradient sums the f32 gradient itself (the epilogue's, before rounding).
          if (bias) check_close("db", dense.bias()->grad, twin.bias()->grad, 1e-5, 21.0 * 21.0 * 0x1p-24);
        }
      }
    }
  }
}

TEST_CASE("bf16 without weight copies is refused by name", "[cpu_bf16][refused]") {
  Dense dense(4, DenseOptions{}, "lonely");
  dense.ensure_built({{2, 3}});
  RunContext rc;
  SavedState s;
  const Tensor x = ops::cast(random_tensor({2, 3}, 1, "x"), DType::bf16);
  // Where Dense multiplies in bf16 the missing copy is named; elsewhere bf16 is refused first.
  const char* why = cpu::native_bf16() ? "set_compute_dtype" : "computes in f32";
  CHECK_THROWS_WITH(dense.forward({x}, rc, s),
                    Catch::Matchers::Contains("'lonely'") && Catch::Matchers::Contains(why));
}

// What the executor does: with bf16 products on, Conv2D and Dense are handed bf16 and their
// weights get bf16 copies; with them off (TNT_CPU_BF16=0: layers_cpu_bf16_off), no layer has
// a copy and the network's outputs are the emulation's. Either way a bf16 network follows the
// f32 one.
TEST_CASE("a bf16 network on the CPU: which layers multiply in bf16", "[cpu_bf16][network]") {
  auto make = [] {
    auto net = std::make_shared<Sequential>("net");
    net->add(std::make_shared<Conv2D>(8, 3, Conv2DOptions{1, 1, true}, "conv"));
    net->add(std::make_shared<ReLU>("relu"));
    net->add(std::make_shared<Flatten>("flatten"));
    net->add(std::make_shared<Dense>(5, DenseOptions{}, "dense"));
    net->build({3, 6, 6});
    net->initialize(11);
    return net;
  };
  auto f32 = make();
  auto half = make();
  half->set_compute_dtype(DType::bf16);
  f32->zero_grad();
  half->zero_grad();
  RunContext rc;
  rc.training = true;
  // bf16 values, so that the cast on entry leaves them as they are: no ReLU below the
  // convolution sees its input's sign flipped by the input's rounding.
  const Tensor x = round_bf16(random_tensor({2, 3, 6, 6}, 1, "x"));
  const Tensor y32 = f32->forward({x}, rc)[0];
  const Tensor y16 = half->forward({x}, rc)[0];
  const Tensor dy = random_tensor(y32.shape(), 2, "dy");
  f32->backward({dy}, rc);
  half->backward({dy}, rc);
  const bool native = cpu::native_bf16();
  INFO("bf16 products: " << native << " (instruction set " << cpu::isa_name() << ")");
  for (auto& np : half->named_parameters()) {
    if (!np.param->cast_for_compute) continue;
    INFO(np.name);
    CHECK(np.param->compute.defined() == native);
    if (native) CHECK(np.param->compute.dtype() == DType::bf16);
  }
  // Every value is rounded to bf16 a few times on its way (input, conv output, ReLU output,
  // weights when native): a few 2^-9 relative each, over sums of 27 and 288 terms.
  check_close("y", y16, y32, 0.02, 0.02);
  auto g32 = f32->named_parameters();
  auto g16 = half->named_parameters();
  for (size_t i = 0; i < g32.size(); ++i) {
    check_close(g16[i].name + " grad", g16[i].param->grad, g32[i].param->grad, 0.03, 0.05);
  }
  if (const char* want = std::getenv("TNT_CPU_BF16_EXPECT")) {  // set by the CTest entries
    CHECK(native == (std::string(want) == "native"));
  }
}

// The executor's choice seen in the numbers: a weight of 1 + 3 * 2^-9 is 1 + 2^-7 in bf16, so
// x = (1, -1) gives 2^-7 where the layer multiplies by the bf16 copy and 3 * 2^-9 (a bf16
// value, so the output's rounding keeps it) where the layer computes in f32.
TEST_CASE("a bf16 network on the CPU: the bf16 weights are the ones multiplied", "[cpu_bf16][network]") {
  const bool native = cpu::native_bf16();
  const double want = native ? 0x1p-7 : 3 * 0x1p-9;
  const std::vector<float> w{static_cast<float>(1 + 3 * 0x1p-9), 1.0f};
  SECTION("Dense") {
    Sequential net("net");
    net.add(std::make_shared<Dense>(1, DenseOptions{.use_bias = false}, "dense"));
    net.build({2});
    net.named_parameters()[0].param->value.copy_from(Tensor::from_vector(w, {1, 2}));
    net.set_compute_dtype(DType::bf16);
    RunContext rc;
    const Tensor y = net.forward({Tensor::from_vector({1.0f, -1.0f}, {1, 2})}, rc)[0];
    CHECK(y.to_vector()[0] == want);
  }
  SECTION("Conv2D") {
    for (const MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      Sequential net("net");
      net.add(std::make_shared<Conv2D>(1, 1, Conv2DOptions{1, 0, false}, "conv"));
      net.build({2, 1, 1});
      net.set_memory_format(format);
      net.named_parameters()[0].param->value.copy_from(Tensor::from_vector(w, {1, 2, 1, 1}));
      net.set_compute_dtype(DType::bf16);
      RunContext rc;
      const Tensor y = net.forward({Tensor::from_vector({1.0f, -1.0f}, {1, 2, 1, 1})}, rc)[0];
      CHECK(y.to_vector()[0] == want);
    }
  }
}

// Under ONEDNN_MAX_CPU_ISA=AVX2 (layers_cpu_bf16_avx2*): bf16 given to the layers where
// oneDNN has none fails naming the layer and the instruction set, and the knob when it asked
// for bf16 (TNT_CPU_BF16=1: a bf16 network fails at its first forward); auto emulates
// ([network] in the same entry).
TEST_CASE("no bf16 in oneDNN on this CPU", "[.][cpu_bf16_none]") {
  REQUIRE_FALSE(cpu::has_bf16_instructions());
  const std::string isa = cpu::isa_name();  // avx2, or lower on an older CPU
  const bool forced = config().cpu_bf16.on();
  CHECK(cpu::native_bf16() == forced);
  using Catch::Matchers::Contains;
  Conv2D conv(4, 3, Conv2DOptions{1, 1, true}, "stem");
  conv.ensure_built({{1, 3, 8, 8}});
  give_bf16_copies(conv);
  RunContext rc;
  SavedState s;
  const Tensor x = ops::cast(random_tensor({1, 3, 8, 8}, 1, "x"), DType::bf16);
  if (forced) CHECK_THROWS_AS(conv.forward({x}, rc, s), InputError);  // a knob's choice: the user's error
  CHECK_THROWS_WITH(conv.forward({x}, rc, s), Contains("stem") && Contains("Conv2D") && Contains(isa));
  Dense dense(4, DenseOptions{}, "head");
  dense.ensure_built({{2, 3}});
  give_bf16_copies(dense);
  const Tensor h = ops::cast(random_tensor({2, 3}, 1, "h"), DType::bf16);
  CHECK_THROWS_WITH(dense.forward({h}, rc, s), Contains("head") && Contains("Dense") && Contains(isa));
  if (forced) {
    CHECK_THROWS_WITH(conv.forward({x}, rc, s), Contains("TNT_CPU_BF16=1"));
    Sequential net("net");
    net.add(std::make_shared<Conv2D>(8, 3, Conv2DOptions{1, 1, true}, "conv"));
    net.build({3, 6, 6});
    net.set_compute_dtype(DType::bf16);
    CHECK_THROWS_WITH(net.forward({random_tensor({2, 3, 6, 6}, 1, "x")}, rc),
                      Contains("Conv2D 'conv'") && Contains("TNT_CPU_BF16=1"));
  }
}
