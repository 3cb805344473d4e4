// Network::set_memory_format(channels_last) on the CPU: a ResNet-like graph (stem Conv-BN-
// ReLU-MaxPool, a residual block with Add, a custom layer without channels_last support in
// the middle, a strided block, GlobalAveragePool, Flatten, Dense) gives the outputs, input
// gradients and parameter gradients of the contiguous network, in f32 and in emulated bf16;
// the custom layer never sees a channels_last tensor; outputs and input gradients come back
// contiguous; checkpoints do not depend on the format; the setting is refused where it
// changes nothing. The resnet50 program's --data_format is tested in tests/e2e.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"
#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace tnt;

namespace {

// y = 2 x, element by element, on contiguous tensors only (the default of
// supports_memory_format). It counts the channels_last tensors it is given, in forward and
// backward: the executor must never hand it one.
class Twice : public Layer {
 public:
  explicit Twice(std::string name) : Layer(std::move(name)) {}
  std::string type() const override { return "Twice"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0)}; }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext& rc, SavedState&) override {
    ++calls;
    if (in.at(0).is_channels_last()) ++channels_last_seen;
    if (rc.memory_format == MemoryFormat::channels_last) ++told_channels_last;
    return {twice(in[0])};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState&) override {
    ++calls;
    if (g.at(0).is_channels_last()) ++channels_last_seen;
    return {twice(g[0])};
  }
  int calls = 0, channels_last_seen = 0, told_channels_last = 0;

 private:
  static Tensor twice(const Tensor& x) {
    Tensor y = Tensor::empty(x.shape(), x.dtype());
    if (x.dtype() == DType::f32) {
      for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = 2 * x.data<float>()[i];
    } else {
      y.copy_from(ops::cast(x, DType::f32));
      ops::scale(y, 2.0);
    }
    return y;
  }
};

// ReLU that counts the channels_last tensors it gets (forward inputs, output gradients):
// proof that the format does flow where it is supported.
class ReluSpy : public ReLU {
 public:
  explicit ReluSpy(std::string name) : ReLU(std::move(name)) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext& rc, SavedState& saved) override {
    if (in.at(0).is_channels_last()) ++channels_last_seen;
    return ReLU::forward(in, rc, saved);
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext& rc, SavedState& saved) override {
    if (g.at(0).is_channels_last()) ++channels_last_seen;
    return ReLU::backward(g, rc, saved);
  }
  int channels_last_seen = 0;
};

using test::add;
using test::bn;
using test::conv;
using test::relu;

struct ResNetLike {
  std::shared_ptr<Network> net;
  std::shared_ptr<Twice> twice;
  std::shared_ptr<ReluSpy> spy;  // block1.relu2, after the Add
};

// (N, 3, 13, 11) images -> 5 logits. Uneven sizes: the stride-2 layers drop rows/columns.
ResNetLike resnet_like() {
  SymTensor x = Input({3, 13, 11}, DType::f32, "images");
  SymTensor h = relu(bn(conv(x, 8, 3, 1, "conv1"), "bn1"), "relu1");
  h = call(std::make_shared<MaxPool2D>(3, 2, 1, "maxpool"), h);  // (N, 8, 7, 6)
  // Residual block, identity shortcut.
  SymTensor r = relu(bn(conv(h, 8, 3, 1, "block1.conv1"), "block1.bn1"), "block1.relu1");
  r = bn(conv(r, 8, 3, 1, "block1.conv2"), "block1.bn2");
  auto spy = std::make_shared<ReluSpy>("block1.relu2");
  h = call(spy, add(r, h, "block1.add"));
  // A layer without channels_last support in the middle of the convolutional part.
  auto twice = std::make_shared<Twice>("twice");
  h = call(twice, h);
  // Residual block with a strided projection shortcut.
  SymTensor s = relu(bn(conv(h, 12, 3, 2, "block2.conv1"), "block2.bn1"), "block2.relu1");
  s = bn(conv(s, 12, 3, 1, "block2.conv2"), "block2.bn2");
  SymTensor shortcut = bn(conv(h, 12, 1, 2, "block2.downsample.0"), "block2.downsample.1");
  h = relu(add(s, shortcut, "block2.add"), "block2.relu2");  // (N, 12, 4, 3)
  h = call(std::make_shared<GlobalAveragePool>("avgpool"), h);
  h = call(std::make_shared<Flatten>("flatten"), h);
  SymTensor y = call(std::make_shared<Dense>(5, DenseOptions{}, "fc"), h);
  auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "resnet_like");
  net->initialize(21);
  return {net, twice, spy};
}

Tensor random(const Shape& shape, uint64_t seed, const std::string& name) {
  Tensor t = Tensor::empty(shape);
  CounterRng rng(seed, name);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(2 * rng.uniform(i) - 1);
  return t;
}

struct Pass {
  Tensor y, dx;
  std::vector<Tensor> grads;
  std::vector<Tensor> buffers;
};

// Two training passes (forward + backward) with these weights: the second one starts from
// BatchNorm statistics that the first one updated.
Pass train_pass(ResNetLike& m, MemoryFormat format, DType compute) {
  m.net->set_memory_format(format);
  m.net->set_compute_dtype(compute);
  RunContext rc;
  rc.training = true;
  Pass p;
  for (int step = 0; step < 2; ++step) {
    m.net->zero_grad();
    const Tensor x = random({4, 3, 13, 11}, 1 + step, "x");
    p.y = m.net->forward({x}, rc)[0];
    p.dx = m.net->backward({random({4, 5}, 1 + step, "dy")}, rc)[0];
  }
  for (auto& np : m.net->named_parameters()) p.grads.push_back(np.param->grad.clone());
  for (auto& nb : m.net->named_buffers()) p.buffers.push_back(nb.param->value.clone());
  return p;
}

struct Diff {
  double worst = 0;  // max |a - b| / (atol + rtol |b|): <= 1 passes
  std::string where;
};

void compare(Diff& d, const std::string& what, const Tensor& a, const Tensor& b, double atol, double rtol) {
  REQUIRE(a.shape() == b.shape());
  std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    const double r = std::fabs(x[i] - y[i]) / (atol + rtol * std::fabs(y[i]));
    if (!(r <= d.worst)) {
      d.worst = std::isnan(r) ? std::numeric_limits<double>::infinity() : r;
      d.where = what + "[" + std::to_string(i) + "]: " + std::to_string(x[i]) + " against " + std::to_string(y[i]);
    }
  }
}

Diff compare_passes(const Pass& a, const Pass& b, double atol, double rtol) {
  Diff d;
  compare(d, "output", a.y, b.y, atol, rtol);
  compare(d, "input gradient", a.dx, b.dx, atol, rtol);
  for (size_t i = 0; i < a.grads.size(); ++i) {
    compare(d, "gradient " + std::to_string(i), a.grads[i], b.grads[i], atol, rtol);
  }
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    compare(d, "buffer " + std::to_string(i), a.buffers[i], b.buffers[i], atol, rtol);
  }
  return d;
}

}  // namespace

TEST_CASE("channels_last network: the contiguous network's results", "[memory_format]") {
  ResNetLike ref = resnet_like();
  ResNetLike cl = resnet_like();  // the same weights (one seed)

  SECTION("f32") {
    const Pass want = train_pass(ref, MemoryFormat::contiguous, DType::f32);
    const Pass got = train_pass(cl, MemoryFormat::channels_last, DType::f32);
    CHECK_FALSE(got.y.is_channels_last());
    CHECK_FALSE(got.dx.is_channels_last());
    // atol 2e-5, rtol 2e-4: the convolutions run the same oneDNN primitives in both formats,
    // but BatchNorm's NHWC implementation sums in another order (differences ~1e-7
    // relative per layer); six BatchNorms normalise by batch statistics of 4*13*11 values
    // or fewer and the backward pass differentiates through them, which multiplies such
    // differences by up to ~1/std of a channel per layer. Measured here: 7e-7 at most, on a
    // weight gradient of 0.02, a twentieth of the bound. A value in the wrong place
    // changes results by O(1).
    const Diff d = compare_passes(got, want, 2e-5, 2e-4);
    INFO("worst: " << d.where << " (" << d.worst << " of the tolerance)");
    CHECK(d.worst <= 1.0);
  }
  SECTION("bf16 (emulated mixed precision)") {
    const Pass want = train_pass(ref, MemoryFormat::contiguous, DType::bf16);
    const Pass got = train_pass(cl, MemoryFormat::channels_last, DType::bf16);
    CHECK_FALSE(got.y.is_channels_last());
    CHECK(got.y.dtype() == DType::f32);
    // Activations are rounded to bf16 (8 significant bits, a relative step of 2^-8 = 0.4%)
    // after every layer: the f32 differences above (~1e-7 relative) can move a value that
    // lies next to a rounding boundary to the neighbouring bf16 number, and that step
    // propagates. Such flips are rare and isolated (none in the measured run), so the bound
    // allows a few bf16 steps: atol 4e-3, rtol 2e-2. A wrong element is still O(1) off,
    // and the f32 case checks tightly.
    const Diff d = compare_passes(got, want, 4e-3, 2e-2);
    INFO("worst: " << d.where << " (" << d.worst << " of the tolerance)");
    CHECK(d.worst <= 1.0);
  }
  // The layer without support was run and never given a channels_last tensor, but it was
  // told the network's format.
  CHECK(cl.twice->calls == 4);
  CHECK(cl.twice->channels_last_seen == 0);
  CHECK(cl.twice->told_channels_last == 2);
  CHECK(ref.twice->told_channels_last == 0);
  // ... while the layers that support it got channels_last tensors (2 forward, 2 backward).
  CHECK(cl.spy->channels_last_seen == 4);
  CHECK(ref.spy->channels_last_seen == 0);
}

TEST_CASE("channels_last network: a layer without support never sees the format", "[memory_format]") {
  // Twice right after the images and right before the output, in a network of supporting
  // layers, also when it is the network's output and when it meets Add.
  SymTensor x = Input({2, 5, 4}, DType::f32, "x");
  auto first = std::make_shared<Twice>("first");
  auto between = std::make_shared<Twice>("between");
  auto last = std::make_shared<Twice>("last");
  SymTensor a = call(first, x);
  SymTensor c = relu(conv(a, 3, 3, 1, "conv"), "relu");
  SymTensor b = call(between, c);
  SymTensor sum = add(c, b, "add");  // channels_last + contiguous
  SymTensor y = call(last, relu(sum, "relu2"));
  Network net({x}, {y, c}, "spy");
  net.initialize(5);
  net.set_memory_format(MemoryFormat::channels_last);
  RunContext rc;
  rc.training = true;
  std::vector<Tensor> out = net.forward({random({2, 2, 5, 4}, 3, "x")}, rc);
  REQUIRE(out.size() == 2);
  CHECK_FALSE(out[0].is_channels_last());
  CHECK_FALSE(out[1].is_channels_last());  // c is channels_last inside, contiguous outside
  std::vector<Tensor> dx = net.backward({random(out[0].shape(), 4, "d0"), random(out[1].shape(), 4, "d1")}, rc);
  CHECK_FALSE(dx[0].is_channels_last());
  for (auto* t : {first.get(), between.get(), last.get()}) {
    INFO(t->name());
    CHECK(t->calls == 2);
    CHECK(t->channels_last_seen == 0);
  }

  // The same network in the contiguous format gives the same numbers (one convolution,
  // identical primitives: the same bits).
  Network ref({x}, {y, c}, "spy_ref");
  RunContext rc2 = rc;
  std::vector<Tensor> out2 = ref.forward({random({2, 2, 5, 4}, 3, "x")}, rc2);
  CHECK(out2[0].to_vector() == out[0].to_vector());
  CHECK(out2[1].to_vector() == out[1].to_vector());
}

TEST_CASE("channels_last is refused where it changes nothing", "[memory_format]") {
  SymTensor x = Input({6}, DType::f32, "features");
  SymTensor y = relu(call(std::make_shared<Dense>(3, DenseOptions{}, "fc"), x), "relu");
  Network mlp({x}, {y}, "mlp");
  CHECK_THROWS_AS(mlp.set_memory_format(MemoryFormat::channels_last), InputError);
  CHECK_THROWS_WITH(mlp.set_memory_format(MemoryFormat::channels_last),
                    Catch::Contains("network 'mlp': memory format channels_last changes nothing here"));
  CHECK(mlp.memory_format() == MemoryFormat::contiguous);
  mlp.set_memory_format(MemoryFormat::contiguous);  // always fine

  // A Sequential makes its graph at the first forward: refused there.
  Sequential seq("seq");
  seq.add(std::make_shared<Dense>(2, DenseOptions{}, "fc"));
  seq.set_memory_format(MemoryFormat::channels_last);
  RunContext rc;
  CHECK_THROWS_WITH(seq.forward({Tensor::zeros({1, 4})}, rc),
                    Catch::Contains("network 'seq': memory format channels_last"));

  CHECK_THROWS_WITH(parse_memory_format("NHWC8"), Catch::Contains("memory format 'NHWC8' is not 'channels_first'"));
}

TEST_CASE("a checkpoint of a channels_last network is that of the contiguous one", "[memory_format]") {
  test::TempDir dir("tnt-memory-format");
  const std::string a = (dir.path / "channels_last.safetensors").string();
  const std::string b = (dir.path / "contiguous.safetensors").string();
  std::vector<float> images(16 * 3 * 13 * 11);
  std::vector<int32_t> labels(16);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>((i * 37) % 11) / 11.0f - 0.5f;
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % 5);
  Dataset data = Dataset::from_tensors(
      {Tensor::from_vector(images, {16, 3, 13, 11}), Tensor::from_data(labels.data(), {16})});

  // Trained in channels_last (SGD with momentum: optimizer state too), then saved.
  ResNetLike trained = resnet_like();
  trained.net->set_memory_format(MemoryFormat::channels_last);
  Model m(trained.net, 3);
  SgdOptions sgd;
  sgd.momentum = 0.9;
  m.compile(std::make_shared<SGD>(0.05, sgd), std::make_shared<SoftmaxCrossEntropy>());
  FitOptions fo;
  fo.batch_size = 8;
  fo.epochs = 1;
  fo.verbose = 0;
  m.fit(data, fo);
  m.save_checkpoint(a, 1);
  communicator().barrier();

  // The same state in a contiguous network, saved again: the same bytes.
  ResNetLike other = resnet_like();
  Model m2(other.net, 3);  // the seed is in the checkpoint's metadata
  m2.compile(std::make_shared<SGD>(0.05, sgd), std::make_shared<SoftmaxCrossEntropy>());
  CHECK(m2.load_checkpoint(a) == 1);
  m2.save_checkpoint(b, 1);
  communicator().barrier();
  const test::Bytes ba = test::read_bytes(a), bb = test::read_bytes(b);
  REQUIRE(ba.size() > 1000);
  CHECK(ba == bb);
  // The weights were stored in PyTorch's layout: conv1.weight (8, 3, 3, 3) as in the
  // network, whatever the activations' format.
  Checkpoint ck = Checkpoint::read(a);
  bool found = false;
  for (const auto& [name, t] : ck.tensors()) {
    if (name != "conv1.weight") continue;
    found = true;
    CHECK(t.shape() == Shape{8, 3, 3, 3});
    CHECK(t.to_vector() == trained.net->named_parameters()[0].param->value.to_vector());
  }
  CHECK(found);
}
