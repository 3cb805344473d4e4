// Layer fusion in the executor (nn/fusion.hpp), on the CPU: which chains are found, that the
// BatchNorm chains' CPU engine (and a chain run layer by layer at its last member's place)
// gives bitwise the results of the unfused run (outputs, input and parameter gradients,
// BatchNorm statistics, in both memory formats), that an engine's chain call gets the right
// inputs and hands its gradients to the right producers, and that gradient hooks fire in the
// same order. The cuDNN engine of the BatchNorm chains is checked against the unfused layers
// on a GPU (nn_layer_fusion_cuda).
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "nn/fusion.hpp"
#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace tnt;

namespace {

using test::add;
using test::bn;
using test::conv;
using test::relu;

// The graph of test::resnet_like (small_nets.hpp) on (N, 3, 9, 7) images.
std::shared_ptr<Network> resnet_like() { return test::resnet_like(9, 7, 8, 12); }

Tensor random(const Shape& shape, uint64_t seed, const std::string& name) {
  Tensor t = Tensor::empty(shape);
  CounterRng rng(seed, name);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(2 * rng.uniform(i) - 1);
  return t;
}

struct Pass {
  std::vector<Tensor> tensors;  // output, input gradient, parameter gradients, buffers
  std::vector<size_t> hooks;    // trainable indices in the order the hook saw them
};

// Two training passes: the second starts from the statistics the first updated.
Pass train_pass(Network& net, const Shape& in_shape, const Shape& out_shape) {
  RunContext rc;
  rc.training = true;
  Pass p;
  for (int step = 0; step < 2; ++step) {
    net.zero_grad();
    p.hooks.clear();
    const Tensor x = random(in_shape, 1 + step, "x");
    p.tensors = {net.forward({x}, rc)[0]};
    p.tensors.push_back(net.backward({random(out_shape, 1 + step, "dy")}, rc,
                                     [&](size_t index, Parameter&) { p.hooks.push_back(index); })[0]);
  }
  for (auto& np : net.named_parameters()) p.tensors.push_back(np.param->grad.clone());
  for (auto& nb : net.named_buffers()) p.tensors.push_back(nb.param->value.clone());
  return p;
}

void check_bitwise(const Pass& got, const Pass& want) {
  REQUIRE(got.tensors.size() == want.tensors.size());
  for (size_t i = 0; i < got.tensors.size(); ++i) {
    INFO("tensor " << i << " of the pass");
    REQUIRE(got.tensors[i].shape() == want.tensors[i].shape());
    CHECK(got.tensors[i].to_double_vector() == want.tensors[i].to_double_vector());
  }
  CHECK(got.hooks == want.hooks);
}

}  // namespace

TEST_CASE("layer fusion: the chains of a ResNet-like graph", "[fusion]") {
  auto net = resnet_like();
  CHECK(net->fused_chains() == 5);  // automatic: the BatchNorm chains have a CPU engine
  net->set_layer_fusion(LayerFusion::on);
  CHECK(net->fused_chains() == 5);
  net->set_layer_fusion(LayerFusion::off);
  CHECK(net->fused_chains() == 0);
}

TEST_CASE("layer fusion: no chain where an intermediate tensor is seen outside it", "[fusion]") {
  SymTensor x = Input({4, 5, 5}, DType::f32, "x");
  SymTensor a = bn(x, "a");  // a network output too: not fused
  SymTensor ra = relu(a, "ra");
  SymTensor b = bn(x, "b");  // two uses: not fused
  SymTensor rb = relu(b, "rb");
  SymTensor b2 = add(b, rb, "b2");
  SymTensor c = bn(x, "c");  // Add's output used twice: BatchNorm -> ReLU does not apply either
  SymTensor s = add(c, x, "s");
  SymTensor rs = relu(s, "rs");
  SymTensor out = add(add(rs, s, "o1"), b2, "o2");
  SymTensor d = relu(bn(x, "d"), "rd");  // the one chain
  Network net({x}, {a, ra, out, d}, "exposed");
  net.set_layer_fusion(LayerFusion::on);
  CHECK(net.fused_chains() == 1);
  // And it runs: results as without fusion.
  net.initialize(3);
  RunContext rc;
  rc.training = true;
  const Tensor in = random({2, 4, 5, 5}, 9, "in");
  const std::vector<Tensor> fused = net.forward({in}, rc);
  net.set_layer_fusion(LayerFusion::off);
  const std::vector<Tensor> plain = net.forward({in}, rc);
  for (size_t i = 0; i < plain.size(); ++i) CHECK(fused[i].to_double_vector() == plain[i].to_double_vector());
}

TEST_CASE("layer fusion: the BatchNorm chains' CPU engine gives the unfused results bitwise", "[fusion]") {
  // The second block's 12 or 16 channels (the first's are 8): in NHWC with 16 oneDNN runs
  // its JIT kernels with the ReLU flag as without it, and the chain uses the flag; in NHWC
  // with 12 the flag would take another kernel (one whose backward sums in another order),
  // and in NCHW oneDNN's C++ kernels, so there the chain applies ReLU in a pass of its own.
  for (int64_t c2 : {12, 16}) {
    for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      INFO("format " << memory_format_name(format) << ", " << c2 << " channels");
      auto plain = test::resnet_like(9, 7, 8, c2);
      auto fused = test::resnet_like(9, 7, 8, c2);  // the same weights (one seed)
      plain->set_memory_format(format);
      fused->set_memory_format(format);
      plain->set_layer_fusion(LayerFusion::off);
      const Pass want = train_pass(*plain, {4, 3, 9, 7}, {4, 5});
      const Pass got = train_pass(*fused, {4, 3, 9, 7}, {4, 5});
      CHECK(fused->fused_engine_runs() == 5);
      check_bitwise(got, want);
      // Inference: the running statistics, ReLU by the flag or the pass as in training.
      RunContext eval;
      const Tensor x = random({4, 3, 9, 7}, 7, "x");
      CHECK(fused->forward({x}, eval)[0].to_double_vector() == plain->forward({x}, eval)[0].to_double_vector());
      CHECK(fused->fused_engine_runs() == 5);
    }
  }
  SECTION("(N, C) inputs: BatchNorm over features") {
    auto make = [](LayerFusion mode) {
      SymTensor x = Input({16}, DType::f32, "x");
      SymTensor h = relu(bn(call(std::make_shared<Dense>(16, DenseOptions{}, "d1"), x), "bn1"), "r1");
      SymTensor y = relu(add(bn(call(std::make_shared<Dense>(16, DenseOptions{}, "d2"), h), "bn2"), h, "sum"), "r2");
      auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "features");
      net->initialize(12);
      net->set_layer_fusion(mode);
      return net;
    };
    auto plain = make(LayerFusion::off), fused = make(LayerFusion::automatic);
    const Pass want = train_pass(*plain, {6, 16}, {6, 16});
    const Pass got = train_pass(*fused, {6, 16}, {6, 16});
    CHECK(fused->fused_engine_runs() == 2);
    check_bitwise(got, want);
  }
}

TEST_CASE("layer fusion: the BatchNorm chains' CPU engine keeps ReLU's rule for NaN and infinities", "[fusion]") {
  // ReLU gives x > 0 ? x : 0: a NaN becomes 0 and stops its gradient. oneDNN's C++ kernels
  // take ReLU as v <= 0 ? 0 : v and would pass the NaN, so the chain must not use their flag.
  // Inference (the running statistics) keeps a NaN to its pixel; in training an infinity
  // makes its channel's statistics NaN. Compared bit for bit, NaN payloads and signs too.
  for (int64_t c : {8, 12, 16}) {
    for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      INFO("format " << memory_format_name(format) << ", " << c << " channels");
      auto make = [&](LayerFusion mode) {
        SymTensor x = Input({c, 5, 4}, DType::f32, "x");
        SymTensor r = relu(bn(conv(x, c, 1, 1, "c1"), "bn1"), "r1");
        SymTensor y = relu(add(bn(conv(r, c, 1, 1, "c2"), "bn2"), r, "sum"), "r2");
        auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "nan");
        net->initialize(11);
        net->set_memory_format(format);
        net->set_layer_fusion(mode);
        return net;
      };
      auto plain = make(LayerFusion::off), fused = make(LayerFusion::automatic);
      auto same_bits = [](const Tensor& a, const Tensor& b) {
        const std::vector<float> u = a.to_vector(), v = b.to_vector();
        return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
      };
      RunContext train;
      train.training = true;
      Tensor x = random({3, c, 5, 4}, 5, "x");
      for (Network* net : {plain.get(), fused.get()}) net->forward({x}, train);  // running statistics
      x.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
      x.data<float>()[2 * 5 * 4 + 3] = -std::numeric_limits<float>::quiet_NaN();
      x.data<float>()[c * 5 * 4 + 11] = std::numeric_limits<float>::infinity();
      RunContext eval;
      CHECK(same_bits(fused->forward({x}, eval)[0], plain->forward({x}, eval)[0]));
      CHECK(fused->fused_engine_runs() == 2);
      const Tensor dy = random({3, c, 5, 4}, 6, "dy");
      std::vector<Tensor> got, want;
      for (auto [net, out] : {std::pair{fused.get(), &got}, std::pair{plain.get(), &want}}) {
        net->zero_grad();
        out->push_back(net->forward({x}, train)[0]);
        out->push_back(net->backward({dy}, train)[0]);
        for (auto& np : net->named_parameters()) out->push_back(np.param->grad.clone());
        for (auto& nb : net->named_buffers()) out->push_back(nb.param->value.clone());
      }
      CHECK(fused->fused_engine_runs() == 2);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("tensor " << i);
        CHECK(same_bits(got[i], want[i]));
      }
    }
  }
}

TEST_CASE("layer fusion: the BatchNorm chains' CPU engine against finite differences", "[fusion]") {
  // The bitwise tests compare the engine with the layers, through the same executor (the
  // Add's gradient passed on, sums into a gradient in place). This checks the whole residual
  // step against central differences of its forward alone (gradcheck.hpp): conv, BatchNorm ->
  // ReLU, conv, BatchNorm -> Add -> ReLU, with h used twice (by c2 and by the sum). The
  // BatchNorm biases are 4 so that every ReLU input is at least about 1 away from its kink
  // (|x - mean| / std stays under 3 over 100 values a channel); ReLU's mask itself is
  // checked bit for bit above.
  for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    INFO("format " << memory_format_name(format));
    SymTensor in = Input({8, 5, 5}, DType::f32, "x");
    SymTensor h = relu(bn(conv(in, 16, 3, 1, "c1"), "bn1"), "r1");
    SymTensor y = relu(add(bn(conv(h, 16, 3, 1, "c2"), "bn2"), h, "sum"), "r2");
    Network net({in}, {y}, "residual");
    net.initialize(13);
    net.set_memory_format(format);
    for (auto& np : net.named_parameters()) {
      if (np.name == "bn1.bias" || np.name == "bn2.bias") np.param->value.fill_(4.0);
    }
    RunContext train;
    train.training = true;
    Tensor x = test::random_tensor({4, 8, 5, 5}, 3, "x");
    const Tensor w = test::random_tensor({4, 16, 5, 5}, 4, "w");
    net.zero_grad();
    const Tensor out = net.forward({x}, train)[0];
    REQUIRE(out.to_vector() == out.to_vector());  // no NaN
    const std::vector<float> values = out.to_vector();
    CHECK(*std::min_element(values.begin(), values.end()) > 0.5f);  // every ReLU passed, with margin
    const Tensor dx = net.backward({w}, train)[0].clone();
    CHECK(net.fused_engine_runs() == 2);
    double magnitude = 0;  // sum |w_i y_i|: the objective's rounding scales with it
    const std::vector<float> wv = w.to_vector();
    for (size_t i = 0; i < values.size(); ++i) magnitude += std::fabs(static_cast<double>(values[i]) * wv[i]);
    auto objective = [&] { return test::dot(net.forward({x}, train, false)[0], w); };
    test::GradCheck opt;
    opt.every = 5;
    test::compare("input", x, dx, objective, opt, true, magnitude);
    for (auto& np : net.named_parameters()) {
      test::compare(np.name, np.param->value, np.param->grad.clone(), objective, opt, true, magnitude);
    }
  }
}

TEST_CASE("layer fusion: a chain whose CPU engine declines runs layer by layer, the unfused bits", "[fusion]") {
  // An NHWC network whose Add takes the images as they come (NCHW) beside the BatchNorm's
  // NHWC output: the engine declines tensors of two formats, and the executor runs the three
  // layers at the chain's place.
  auto make = [](LayerFusion mode) {
    SymTensor x = Input({4, 5, 6}, DType::f32, "x");
    SymTensor y = relu(add(bn(conv(x, 4, 3, 1, "conv"), "bn"), x, "sum"), "relu");
    auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "declined");
    net->initialize(4);
    net->set_memory_format(MemoryFormat::channels_last);
    net->set_layer_fusion(mode);
    return net;
  };
  auto plain = make(LayerFusion::off), fused = make(LayerFusion::automatic);
  CHECK(fused->fused_chains() == 1);
  const Pass want = train_pass(*plain, {3, 4, 5, 6}, {3, 4, 5, 6});
  const Pass got = train_pass(*fused, {3, 4, 5, 6}, {3, 4, 5, 6});
  CHECK(fused->fused_engine_runs() == 0);
  check_bitwise(got, want);
}

TEST_CASE("layer fusion: a subclass of a member type runs as a layer", "[fusion]") {
  // A user's ReLU that overrides forward: the engine computes ReLU's own math, so the chain is
  // not planned and the override runs.
  struct Counting : ReLU {
    using ReLU::ReLU;
    std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext& rc, SavedState& saved) override {
      ++calls;
      return ReLU::forward(in, rc, saved);
    }
    int calls = 0;
  };
  SymTensor x = Input({4, 5, 5}, DType::f32, "x");
  auto counting = std::make_shared<Counting>("counting");
  SymTensor a = call(counting, bn(conv(x, 4, 3, 1, "c1"), "bn1"));
  SymTensor y = relu(bn(conv(a, 4, 3, 1, "c2"), "bn2"), "relu");  // the one chain
  Network net({x}, {y}, "subclass");
  net.initialize(2);
  CHECK(net.fused_chains() == 1);
  RunContext rc;
  rc.training = true;
  net.forward({random({2, 4, 5, 5}, 3, "x")}, rc);
  CHECK(counting->calls == 1);
  CHECK(net.fused_engine_runs() == 1);
}

namespace {

// An engine for Sigmoid -> Add -> Tanh that runs the three layers itself, in its own saved
// state, and counts its calls: the executor's side of an engine call (inputs in order, the
// side input's gradient to its producer) is then checked by the results staying bitwise.
struct SigAddTanhState {
  SavedState s0, s1, s2;
};
int engine_forwards = 0, engine_backwards = 0;

const detail::FusionRegistration kTestPattern(detail::FusionPattern{
    "test_sigmoid_add_tanh",
    {"Sigmoid", "Add", "Tanh"},
    [](const std::vector<Layer*>&) { return true; },
    [](const std::vector<Layer*>& layers, const std::vector<Tensor>& in, const RunContext& rc, SavedState& saved,
       std::vector<Tensor>& out) {
      REQUIRE(in.size() == 2);  // the Sigmoid's input, then the Add's other input
      auto st = std::make_shared<SigAddTanhState>();
      const Tensor s = layers[0]->forward({in[0]}, rc, st->s0)[0];
      const Tensor a = layers[1]->forward({s, in[1]}, rc, st->s1)[0];
      out = layers[2]->forward({a}, rc, st->s2);
      saved.extra = st;
      ++engine_forwards;
      return true;
    },
    [](const std::vector<Layer*>& layers, const std::vector<Tensor>& g, const RunContext& rc, SavedState& saved) {
      auto& st = *static_cast<SigAddTanhState*>(saved.extra.get());
      const Tensor ga = layers[2]->backward(g, rc, st.s2)[0];
      const std::vector<Tensor> gs = layers[1]->backward({ga}, rc, st.s1);
      const Tensor gx = layers[0]->backward({gs[0]}, rc, st.s0)[0];
      ++engine_backwards;
      return std::vector<Tensor>{gx, gs[1]};
    }});

std::shared_ptr<Network> sig_add_tanh() {
  SymTensor x = Input({6}, DType::f32, "x");
  SymTensor h = call(std::make_shared<Dense>(6, DenseOptions{}, "d0"), x);
  SymTensor s = call(std::make_shared<Sigmoid>("sig"), h);
  // The side input is made after the head (a later node) from the head's own input.
  SymTensor z = call(std::make_shared<Dense>(6, DenseOptions{}, "d1"), h);
  SymTensor t = call(std::make_shared<Tanh>("tanh"), add(z, s, "sum"));  // the chain's input second
  SymTensor y = call(std::make_shared<Dense>(3, DenseOptions{}, "d2"), t);
  auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "sat");
  net->initialize(8);
  return net;
}

}  // namespace

TEST_CASE("layer fusion: an engine's chain call gets its inputs and gives gradients back", "[fusion]") {
  auto plain = sig_add_tanh();
  auto fused = sig_add_tanh();
  plain->set_layer_fusion(LayerFusion::off);
  fused->set_layer_fusion(LayerFusion::on);
  CHECK(fused->fused_chains() == 1);
  const Pass want = train_pass(*plain, {5, 6}, {5, 3});
  engine_forwards = engine_backwards = 0;
  const Pass got = train_pass(*fused, {5, 6}, {5, 3});
  CHECK(engine_forwards == 2);
  CHECK(engine_backwards == 2);
  CHECK(fused->fused_engine_runs() == 1);  // in the last training forward
  check_bitwise(got, want);
  // Inference runs the engine too (it decides for itself what applies).
  RunContext eval;
  const Tensor x = random({5, 6}, 4, "x");
  CHECK(fused->forward({x}, eval)[0].to_double_vector() == plain->forward({x}, eval)[0].to_double_vector());
}

namespace {

// A Transformer's residual blocks in miniature: y = x + dropout(dense(x)), twice, and a
// Dropout whose output has a second use (no chain).
std::shared_ptr<Network> residual_net() {
  SymTensor x = Input({4, 6}, DType::f32, "x");
  SymTensor h1 = call(std::make_shared<Dropout>(0.3, "drop1"), call(std::make_shared<Dense>(6, DenseOptions{}, "d1"), x));
  SymTensor y1 = add(x, h1, "res1");  // the chain's tensor second, as the Transformer has it
  SymTensor h2 = call(std::make_shared<Dropout>(0.4, "drop2"), call(std::make_shared<Dense>(6, DenseOptions{}, "d2"), y1));
  SymTensor y2 = add(h2, y1, "res2");  // first
  SymTensor h3 = call(std::make_shared<Dropout>(0.2, "drop3"), y2);
  SymTensor y3 = add(h3, call(std::make_shared<Dense>(6, DenseOptions{}, "d3"), h3), "res3");  // h3 used twice
  SymTensor out = call(std::make_shared<Dense>(3, DenseOptions{}, "d4"), y3);
  auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{out}, "residual");
  net->initialize(5);
  return net;
}

}  // namespace

TEST_CASE("layer fusion: Dropout -> Add chains on the CPU are the unfused run bitwise", "[fusion]") {
  auto plain = residual_net();
  auto fused = residual_net();
  plain->set_layer_fusion(LayerFusion::off);
  CHECK(fused->fused_chains() == 2);  // res1 and res2; drop3's output has two uses
  // 5 samples (120 values a chain), and 400 (9,600: the draws' parallel loop).
  for (int64_t batch : {5, 400}) {
    INFO("batch " << batch);
    const Pass want = train_pass(*plain, {batch, 4, 6}, {batch, 4, 3});
    const Pass got = train_pass(*fused, {batch, 4, 6}, {batch, 4, 3});
    CHECK(fused->fused_engine_runs() == 2);
    check_bitwise(got, want);
  }
  // And the dropout did drop: an output differs from inference's.
  RunContext eval;
  const Tensor x = random({5, 4, 6}, 4, "x");
  RunContext train;
  train.training = true;
  CHECK(fused->forward({x}, eval)[0].to_double_vector() != fused->forward({x}, train)[0].to_double_vector());
}

namespace {

// relu -> pool on the images themselves (so that the chain sees the values a test makes),
// then conv -> relu -> pool (the Fashion-MNIST CNN's shape), and a relu -> pool the CPU
// engine does not take (3x3 windows).
std::shared_ptr<Network> cnn(int64_t h, int64_t w) {
  SymTensor x = Input({2, h, w}, DType::f32, "x");
  auto pool2 = [](const std::string& name) { return std::make_shared<MaxPool2D>(2, name); };
  SymTensor a = call(pool2("pool0"), relu(x, "relu0"));
  SymTensor b = call(pool2("pool1"), relu(conv(a, 16, 3, 1, "conv1"), "relu1"));
  SymTensor c = call(std::make_shared<MaxPool2D>(3, 1, 1, "pool2"), relu(conv(b, 4, 3, 1, "conv2"), "relu2"));
  SymTensor y = call(std::make_shared<Dense>(5, DenseOptions{}, "fc"), call(std::make_shared<Flatten>("flat"), c));
  auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "cnn");
  net->initialize(5);
  return net;
}

// x from {-1, -0, 0, NaN, 1, 2} and random values: windows of equal, negative, zero and NaN
// elements as well as plain ones.
Tensor awkward(const Shape& shape) {
  Tensor t = random(shape, 7, "awkward");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float pick[] = {-1.0f, -0.0f, 0.0f, nan, 1.0f, 2.0f};
  CounterRng rng(8, "awkward.pick");
  for (int64_t i = 0; i < t.numel(); ++i) {
    float& v = t.data<float>()[i];
    if (v < 0.2f) v = pick[rng.bits(static_cast<uint64_t>(i)) % 6];
  }
  return t;
}

}  // namespace

TEST_CASE("layer fusion: ReLU -> MaxPool2D 2x2 on the CPU, one pass each way, the unfused bits", "[fusion]") {
  // 28 x 28 (the demo's images: pools of 14 and 7 windows a row), and odd sizes whose last
  // row and column are in no window (39 columns: two runs of 8 windows and 3).
  for (auto [h, w] : {std::pair<int64_t, int64_t>{28, 28}, {13, 39}, {9, 19}}) {
    INFO(h << " x " << w);
    auto plain = cnn(h, w);
    auto fused = cnn(h, w);  // the same weights (one seed)
    plain->set_layer_fusion(LayerFusion::off);
    CHECK(plain->fused_chains() == 0);
    CHECK(fused->fused_chains() == 2);  // by default on the CPU: relu0 -> pool0, relu1 -> pool1 (pool2 is 3x3)
    const Shape out{3, 5};
    SECTION("training, random values") {
      const Pass want = train_pass(*plain, {3, 2, h, w}, out);
      const Pass got = train_pass(*fused, {3, 2, h, w}, out);
      CHECK(fused->fused_engine_runs() == 2);
      check_bitwise(got, want);
    }
    SECTION("NaN, signed zeros and ties") {
      RunContext rc;
      rc.training = true;
      const Tensor x = awkward({3, 2, h, w});
      auto pass = [&](Network& net) {
        net.zero_grad();
        std::vector<Tensor> r{net.forward({x}, rc)[0]};
        r.push_back(net.backward({random(out, 3, "dy")}, rc)[0]);
        for (auto& np : net.named_parameters()) r.push_back(np.param->grad.clone());
        return r;
      };
      const std::vector<Tensor> want = pass(*plain), got = pass(*fused);
      CHECK(fused->fused_engine_runs() == 2);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("tensor " << i);
        const std::vector<float> g = got[i].to_vector(), e = want[i].to_vector();
        REQUIRE(g.size() == e.size());
        CHECK(std::memcmp(g.data(), e.data(), g.size() * sizeof(float)) == 0);  // NaNs and zeros' signs too
      }
      // The chain's own output: its zeros are +0 as ReLU's (x > 0 ? x : 0).
      auto relu_pool = [&](LayerFusion mode) {
        SymTensor in = Input({2, h, w}, DType::f32, "x");
        SymTensor out = call(std::make_shared<MaxPool2D>(2, "pool"), relu(in, "relu"));
        Network net({in}, {out}, "relu_pool");
        net.set_layer_fusion(mode);
        std::vector<float> r = net.forward({x}, rc)[0].to_vector();
        const std::vector<float> dx = net.backward({awkward(Shape{3, 2, h / 2, w / 2})}, rc)[0].to_vector();
        r.insert(r.end(), dx.begin(), dx.end());
        return r;
      };
      const std::vector<float> one = relu_pool(LayerFusion::off), two = relu_pool(LayerFusion::automatic);
      REQUIRE(one.size() == two.size());
      CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
    }
  }
  SECTION("BatchNorm -> ReLU -> MaxPool2D: batch_norm_relu takes the ReLU (patterns of one length by name)") {
    auto bn_net = [](LayerFusion mode) {
      SymTensor x = Input({2, 8, 6}, DType::f32, "x");
      SymTensor h = call(std::make_shared<MaxPool2D>(2, "pool"), relu(bn(conv(x, 16, 3, 1, "conv"), "bn"), "relu"));
      SymTensor y = call(std::make_shared<Dense>(5, DenseOptions{}, "fc"), call(std::make_shared<Flatten>("flat"), h));
      auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "bn_cnn");
      net->initialize(6);
      net->set_layer_fusion(mode);
      return net;
    };
    auto plain = bn_net(LayerFusion::off), automatic = bn_net(LayerFusion::automatic), on = bn_net(LayerFusion::on);
    CHECK(automatic->fused_chains() == 1);  // bn -> relu
    CHECK(on->fused_chains() == 1);         // the same: relu_max_pool finds its ReLU taken
    const Pass want = train_pass(*plain, {2, 2, 8, 6}, {2, 5});
    for (Network* net : {automatic.get(), on.get()}) {
      const Pass got = train_pass(*net, {2, 2, 8, 6}, {2, 5});
      CHECK(net->fused_engine_runs() == 1);
      check_bitwise(got, want);
    }
  }
  SECTION("channels_last and inference: the layers' results (the engine declines NHWC tensors)") {
    auto plain = cnn(12, 10);
    auto fused = cnn(12, 10);
    plain->set_layer_fusion(LayerFusion::off);
    for (auto* net : {plain.get(), fused.get()}) net->set_memory_format(MemoryFormat::channels_last);
    const Pass want = train_pass(*plain, {2, 2, 12, 10}, {2, 5});
    const Pass got = train_pass(*fused, {2, 2, 12, 10}, {2, 5});
    // The images come in NCHW, so their chain runs the engine; the convolution's output is
    // NHWC, and relu1 -> pool1 runs layer by layer.
    CHECK(fused->fused_engine_runs() == 1);
    check_bitwise(got, want);
    RunContext eval;
    fused->set_memory_format(MemoryFormat::contiguous);
    plain->set_memory_format(MemoryFormat::contiguous);
    const Tensor x = random({2, 2, 12, 10}, 9, "x");
    CHECK(fused->forward({x}, eval)[0].to_double_vector() == plain->forward({x}, eval)[0].to_double_vector());
  }
}
