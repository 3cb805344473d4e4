// The graph with the real layers: a small residual CNN with batch norm learns a separable
// synthetic task (horizontal against vertical stripes under noise) on the CPU in a few
// seconds, and initial weights depend only on the seed and the parameter names.
#include <catch2/catch.hpp>

#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/optim.hpp"

#include <map>
#include <string>
#include <vector>

using namespace tnt;

namespace {

constexpr int64_t kSide = 8;

// Sample i: class i % 2; stripes of period 2 along rows (class 0) or columns (class 1) with a
// random phase, plus N(0, 0.3) noise. Deterministic in (seed, i).
void make_data(uint64_t seed, int64_t n, Tensor& x, Tensor& y) {
  x = Tensor::empty({n, 1, kSide, kSide});  // (N, 1, H, W)
  y = Tensor::empty({n}, DType::i64);       // (N,)
  CounterRng rng(seed, "stripes");
  float* px = x.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = i % 2;
    const int64_t phase = rng.bits(static_cast<uint64_t>(i)) % 2;
    y.data<int64_t>()[i] = label;
    for (int64_t r = 0; r < kSide; ++r) {
      for (int64_t c = 0; c < kSide; ++c) {
        const int64_t k = (i * kSide + r) * kSide + c;
        const bool on = ((label == 0 ? r : c) + phase) % 2 == 1;
        px[k] = (on ? 1.0f : 0.0f) + 0.3f * static_cast<float>(rng.normal(static_cast<uint64_t>(n + k)));
      }
    }
  }
}

double accuracy(Network& net, const Tensor& x, const Tensor& y) {
  RunContext eval;
  Accuracy acc;
  acc.update(net.forward({x}, eval)[0], y);
  return acc.result();
}

Conv2DOptions same3() {
  Conv2DOptions o;
  o.padding = 1;
  o.use_bias = false;  // followed by batch norm
  o.kernel_initializer = Initializer::he_normal();
  return o;
}

}  // namespace

TEST_CASE("graph training: a residual CNN with batch norm learns separable data") {
  SymTensor x = Input({1, kSide, kSide}, DType::f32, "image");
  SymTensor h = (*std::make_shared<ReLU>("relu1"))(
      (*std::make_shared<BatchNorm>("bn1"))((*std::make_shared<Conv2D>(8, 3, same3(), "conv1"))(x)));
  // A residual block: h + bn(conv(relu(bn(conv(h))))), as ResNet's basic block.
  SymTensor r = (*std::make_shared<Conv2D>(8, 3, same3(), "layer1.0.conv1"))(h);
  r = (*std::make_shared<ReLU>("layer1.0.relu"))((*std::make_shared<BatchNorm>("layer1.0.bn1"))(r));
  r = (*std::make_shared<BatchNorm>("layer1.0.bn2"))((*std::make_shared<Conv2D>(8, 3, same3(), "layer1.0.conv2"))(r));
  SymTensor sum = (*std::make_shared<Add>("layer1.0.add"))({h, r});
  SymTensor feat = (*std::make_shared<GlobalAveragePool>("pool"))((*std::make_shared<ReLU>("layer1.0.relu2"))(sum));
  SymTensor logits = (*std::make_shared<Dense>(2, "fc"))(feat);
  Network net({x}, {logits}, "tiny_resnet");
  net.initialize(42);

  std::vector<std::string> names;
  for (const NamedParameter& p : net.named_parameters()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
                                          "layer1.0.bn1.weight", "layer1.0.bn1.bias", "layer1.0.conv2.weight",
                                          "layer1.0.bn2.weight", "layer1.0.bn2.bias", "fc.weight", "fc.bias"});
  std::vector<std::string> buffers;
  for (const NamedParameter& p : net.named_buffers()) buffers.push_back(p.name);
  CHECK(buffers.at(0) == "bn1.running_mean");
  CHECK(buffers.at(1) == "bn1.running_var");
  CHECK(net.named_parameters()[0].param->value.shape() == Shape{8, 1, 3, 3});  // PyTorch's [out, in, kh, kw]

  Tensor train_x, train_y, test_x, test_y;
  make_data(1, 256, train_x, train_y);
  make_data(2, 128, test_x, test_y);
  const double before = accuracy(net, test_x, test_y);

  Adam adam(0.01);
  SoftmaxCrossEntropy loss_fn;
  RunContext rc;
  rc.training = true;
  const int64_t batch = 32;
  double first_loss = 0, last_loss = 0;
  size_t hooks = 0;
  for (int epoch = 0; epoch < 6; ++epoch) {
    for (int64_t b = 0; b < 256 / batch; ++b) {
      Tensor xb = train_x.slice_rows(b * batch, (b + 1) * batch);
      Tensor yb = train_y.slice_rows(b * batch, (b + 1) * batch);
      net.zero_grad();
      SavedState ls;
      const double loss = Loss::value(loss_fn.forward(net.forward({xb}, rc)[0], yb, 0, ls));
      net.backward({loss_fn.backward(ls)}, rc, [&](size_t, Parameter&) { ++hooks; });
      adam.step(net.trainable_parameters());
      ++rc.step;
      if (rc.step == 1) first_loss = loss;
      last_loss = loss;
    }
  }
  const double after = accuracy(net, test_x, test_y);
  INFO("accuracy before " << before << ", after " << after << "; loss " << first_loss << " -> " << last_loss);
  CHECK(hooks == 48 * names.size());  // every trainable parameter, once per step
  CHECK(last_loss < 0.5 * first_loss);
  // Stripes under noise of 0.3 are separable: 128 held-out samples, all but a few right.
  CHECK(after >= 0.97);
}

TEST_CASE("graph training: initial weights depend on the seed and names, not on build order") {
  auto build = [](bool reversed) {
    // The same network; its layers are constructed in opposite orders.
    std::map<std::string, LayerPtr> layers;
    std::vector<std::string> order = {"conv", "bn", "fc"};
    if (reversed) order = {"fc", "bn", "conv"};
    for (const std::string& n : order) {
      if (n == "conv") layers[n] = std::make_shared<Conv2D>(4, 3, Conv2DOptions{}, "conv");
      if (n == "bn") layers[n] = std::make_shared<BatchNorm>(BatchNormOptions{}, "bn");
      if (n == "fc") layers[n] = std::make_shared<Dense>(3, DenseOptions{}, "fc");
    }
    SymTensor x = Input({2, 6, 6});
    SymTensor h = call(layers["bn"], call(layers["conv"], x));
    h = call(std::make_shared<Flatten>(), h);
    auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{call(layers["fc"], h)});
    return net;
  };
  auto a = build(false);
  auto b = build(true);
  a->initialize(7);
  b->initialize(7);
  std::vector<NamedParameter> pa = a->named_parameters(), pb = b->named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].name);
    CHECK(pa[i].name == pb[i].name);
    CHECK(pa[i].param->value.to_vector() == pb[i].param->value.to_vector());
  }
  b->initialize(8);
  CHECK(pa[0].param->value.to_vector() != pb[0].param->value.to_vector());
}
