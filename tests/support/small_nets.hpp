// The small networks and data sets the training tests share, and a copy of a network's
// weights.
#pragma once

#include "tarantella/dataset.hpp"
#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/random.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tnt::test {

// Calls of ResNet's building blocks in a functional graph: a bias-free convolution with
// "same" padding (k / 2), a BatchNorm with PyTorch's defaults, a ReLU, a sum of two.
inline SymTensor conv(const SymTensor& x, int64_t filters, int64_t k, int64_t stride, const std::string& name) {
  Conv2DOptions o;
  o.stride = stride;
  o.padding = k / 2;
  o.use_bias = false;
  return call(std::make_shared<Conv2D>(filters, k, o, name), x);
}
inline SymTensor bn(const SymTensor& x, const std::string& name) {
  return call(std::make_shared<BatchNorm>(BatchNormOptions{}, name), x);
}
inline SymTensor relu(const SymTensor& x, const std::string& name) { return call(std::make_shared<ReLU>(name), x); }
inline SymTensor add(const SymTensor& a, const SymTensor& b, const std::string& name) {
  return call(std::make_shared<Add>(name), std::vector<SymTensor>{a, b});
}

// A small CNN for (N, 1, 8, 8) images and 3 classes with every kind of layer whose gradient
// crosses ranks: conv1 (4 filters, 3x3, padding 1), `after_conv` if given, ReLU, max-pool,
// dense 8, ReLU, dense 3. conv_bias=false suits a BatchNorm after the convolution (as in
// ResNet, where the bias's gradient would be noise).
// (N, 3, height, width) -> 5 logits, initialised with seed 5: a stem, an identity block, a
// block with a projection shortcut (whose BatchNorm comes after the chain's BatchNorm in the
// order, so a fused chain must run at its ReLU), and an Add whose chain input is its second
// input. Five BatchNorm -> (Add ->) ReLU chains; c1 and c2 channels in the two blocks.
inline std::shared_ptr<Network> resnet_like(int64_t height, int64_t width, int64_t c1, int64_t c2) {
  SymTensor x = Input({3, height, width}, DType::f32, "images");
  SymTensor h = relu(bn(conv(x, c1, 3, 1, "conv1"), "bn1"), "relu1");                        // chain 1
  SymTensor r = relu(bn(conv(h, c1, 3, 1, "b1.conv1"), "b1.bn1"), "b1.relu1");                // chain 2
  r = bn(conv(r, c1, 3, 1, "b1.conv2"), "b1.bn2");
  h = relu(add(h, r, "b1.add"), "b1.relu2");                                                  // chain 3 (arg 1)
  SymTensor s = relu(bn(conv(h, c2, 3, 2, "b2.conv1"), "b2.bn1"), "b2.relu1");                // chain 4
  s = bn(conv(s, c2, 3, 1, "b2.conv2"), "b2.bn2");
  SymTensor shortcut = bn(conv(h, c2, 1, 2, "b2.down.0"), "b2.down.1");
  h = relu(add(s, shortcut, "b2.add"), "b2.relu2");                                           // chain 5
  h = call(std::make_shared<GlobalAveragePool>("avgpool"), h);
  h = call(std::make_shared<Flatten>("flatten"), h);
  SymTensor y = call(std::make_shared<Dense>(5, DenseOptions{}, "fc"), h);
  auto net = std::make_shared<Network>(std::vector<SymTensor>{x}, std::vector<SymTensor>{y}, "resnet_like");
  net->initialize(5);
  return net;
}

inline std::shared_ptr<Sequential> small_cnn(const std::string& name, bool conv_bias = true,
                                             LayerPtr after_conv = nullptr) {
  auto net = std::make_shared<Sequential>(name);
  Conv2DOptions pad;
  pad.padding = 1;
  pad.use_bias = conv_bias;
  net->add(std::make_shared<Conv2D>(4, 3, pad, "conv1"));
  if (after_conv) net->add(std::move(after_conv));
  net->add(std::make_shared<ReLU>("relu1"));
  net->add(std::make_shared<MaxPool2D>(2, "pool1"));
  net->add(std::make_shared<Flatten>("flatten"));
  net->add(std::make_shared<Dense>(8, "fc1"));
  net->add(std::make_shared<ReLU>("relu2"));
  net->add(std::make_shared<Dense>(3, "fc2"));
  net->build({1, 8, 8});
  return net;
}

// An MLP for 4 features and 2 classes: fc1 (8), ReLU, fc2 (2).
inline std::shared_ptr<Sequential> small_mlp() {
  auto net = std::make_shared<Sequential>("mlp");
  net->add(std::make_shared<Dense>(8, "fc1"));
  net->add(std::make_shared<ReLU>("relu"));
  net->add(std::make_shared<Dense>(2, "fc2"));
  net->build({4});
  return net;
}

// 64 samples of 4 features drawn with key `key`; label = whether the first feature is above
// 0.5 (learnable in a few steps).
inline Dataset threshold_data(const std::string& key) {
  Tensor x = Tensor::empty({64, 4});
  Tensor y = Tensor::empty({64}, DType::i64);
  CounterRng rng(5, key);
  for (int64_t i = 0; i < 64 * 4; ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t n = 0; n < 64; ++n) y.data<int64_t>()[n] = x.data<float>()[n * 4] > 0.5f ? 1 : 0;
  return Dataset::from_tensors({x, y});
}

// Every parameter's values, in named_parameters() order.
inline std::vector<std::vector<double>> weights_of(Network& net) {
  std::vector<std::vector<double>> w;
  for (auto& p : net.named_parameters()) w.push_back(p.param->value.to_double_vector());
  return w;
}

}  // namespace tnt::test
