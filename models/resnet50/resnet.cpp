#include "resnet.hpp"

#include "common/wording.hpp"

#include <tarantella/check.hpp>
#include <tarantella/layers.hpp>

#include <fmt/format.h>

#include <cmath>
#include <utility>

namespace tnt_models {

namespace {

// torchvision's kaiming_normal_(mode="fan_out", nonlinearity="relu") for a conv weight
// (F, C, k, k): fan_out = F * k * k, std = sqrt(2 / fan_out).
tnt::Initializer conv_init(int64_t filters, int64_t kernel) {
  return tnt::Initializer::normal(0.0, std::sqrt(2.0 / static_cast<double>(filters * kernel * kernel)));
}

tnt::SymTensor conv(const tnt::SymTensor& x, int64_t filters, int64_t kernel, int64_t stride, const std::string& name) {
  tnt::Conv2DOptions o;
  o.stride = stride;
  o.padding = kernel / 2;  // "same" for odd kernels; with stride 2 this is torchvision's padding
  o.use_bias = false;
  o.kernel_initializer = conv_init(filters, kernel);
  return tnt::call(std::make_shared<tnt::Conv2D>(filters, kernel, o, name), x);
}

tnt::SymTensor bn(const tnt::SymTensor& x, const std::string& name, bool zero_weight = false) {
  tnt::BatchNormOptions o;  // momentum 0.1, epsilon 1e-5: torchvision's defaults
  if (zero_weight) o.weight_initializer = tnt::Initializer::zeros();
  return tnt::call(std::make_shared<tnt::BatchNorm>(o, name), x);
}

tnt::SymTensor relu(const tnt::SymTensor& x, const std::string& name) {
  return tnt::call(std::make_shared<tnt::ReLU>(name), x);
}

// torchvision's Bottleneck: 1x1 (width) -> 3x3 (width, stride) -> 1x1 (4 width), plus the
// shortcut (a strided 1x1 conv and BN where the shape changes).
tnt::SymTensor bottleneck(const tnt::SymTensor& x, int64_t width, int64_t stride, bool downsample,
                          bool zero_init_residual, const std::string& p) {
  const int64_t out = 4 * width;
  tnt::SymTensor h = relu(bn(conv(x, width, 1, 1, p + ".conv1"), p + ".bn1"), p + ".relu1");
  h = relu(bn(conv(h, width, 3, stride, p + ".conv2"), p + ".bn2"), p + ".relu2");
  h = bn(conv(h, out, 1, 1, p + ".conv3"), p + ".bn3", zero_init_residual);
  tnt::SymTensor shortcut = x;
  if (downsample) {
    shortcut = bn(conv(x, out, 1, stride, p + ".downsample.0"), p + ".downsample.1");
  }
  tnt::SymTensor sum = tnt::call(std::make_shared<tnt::Add>(p + ".add"), std::vector<tnt::SymTensor>{h, shortcut});
  return relu(sum, p + ".relu3");
}

}  // namespace

std::shared_ptr<tnt::Network> make_resnet50(int64_t num_classes, bool zero_init_residual, int64_t image_size) {
  TNT_CHECK(num_classes > 0, "make_resnet50: num_classes must be positive, got {}", num_classes);
  TNT_CHECK(image_size >= 32, "make_resnet50: image_size must be at least 32 (the network downsamples by 32), got {}",
            image_size);
  tnt::SymTensor input = tnt::Input({3, image_size, image_size}, tnt::DType::f32, "images");  // (N, 3, S, S)
  // Stem: 7x7/2 conv, BN, ReLU, 3x3/2 max pool: (N, 64, S/4, S/4).
  tnt::SymTensor x = relu(bn(conv(input, 64, 7, 2, "conv1"), "bn1"), "relu");
  x = tnt::call(std::make_shared<tnt::MaxPool2D>(3, 2, 1, "maxpool"), x);

  struct Stage {
    int64_t width, blocks, stride;
  };
  const Stage stages[] = {{64, 3, 1}, {128, 4, 2}, {256, 6, 2}, {512, 3, 2}};
  for (int s = 0; s < 4; ++s) {
    for (int64_t b = 0; b < stages[s].blocks; ++b) {
      const std::string prefix = fmt::format("layer{}.{}", s + 1, b);
      // The first block of every stage changes the channel count (64 -> 256 in layer1),
      // so it always has a projection shortcut.
      x = bottleneck(x, stages[s].width, b == 0 ? stages[s].stride : 1, b == 0, zero_init_residual, prefix);
    }
  }
  x = tnt::call(std::make_shared<tnt::GlobalAveragePool>("avgpool"), x);  // (N, 2048)
  tnt::DenseOptions fc;
  const double bound = 1.0 / std::sqrt(2048.0);
  fc.kernel_initializer = tnt::Initializer::uniform(-bound, bound);
  fc.bias_initializer = tnt::Initializer::uniform(-bound, bound);
  tnt::SymTensor logits = tnt::call(std::make_shared<tnt::Dense>(num_classes, fc, "fc"), x);  // (N, K)
  return std::make_shared<tnt::Network>(std::vector<tnt::SymTensor>{input}, std::vector<tnt::SymTensor>{logits},
                                        "resnet50");
}

bool is_batch_norm_parameter(const std::string& full_name) {
  // torchvision names: "bn1.weight", "layer1.0.bn2.bias", "layer2.0.downsample.1.weight".
  auto dot = full_name.rfind('.');
  std::string layer = dot == std::string::npos ? full_name : full_name.substr(0, dot);
  auto last = layer.rfind('.');
  std::string leaf = last == std::string::npos ? layer : layer.substr(last + 1);
  if (leaf.rfind("bn", 0) == 0) return true;
  return layer.size() >= 13 && layer.compare(layer.size() - 13, 13, ".downsample.1") == 0;
}

namespace {
// The tutorial's boundaries (epochs) and the multipliers of the scaled rate between them.
const std::vector<int64_t> kBoundaryEpochs = {30, 60, 80};
const std::vector<double> kMultipliers = {1.0, 0.1, 0.01, 0.001};
}  // namespace

tnt::SchedulePtr make_lr_schedule(int64_t global_batch, int64_t epoch_size, int64_t warmup_epochs,
                                  double base_lr_per_256) {
  TNT_CHECK(global_batch > 0 && epoch_size >= global_batch,
            "make_lr_schedule: an epoch of {} samples holds no global batch of {}", epoch_size, global_batch);
  return tnt::PiecewiseConstantWithWarmup::from_epochs(global_batch, epoch_size, warmup_epochs, kBoundaryEpochs,
                                                       kMultipliers, base_lr_per_256);
}

std::string describe_lr_schedule(int64_t global_batch, int64_t epoch_size, int64_t warmup_epochs,
                                 double base_lr_per_256) {
  TNT_CHECK(global_batch > 0 && epoch_size >= global_batch,
            "describe_lr_schedule: an epoch of {} samples holds no global batch of {}", epoch_size, global_batch);
  // The same arithmetic as PiecewiseConstantWithWarmup::from_epochs.
  const int64_t steps_per_epoch = epoch_size / global_batch;
  const double rate = base_lr_per_256 * static_cast<double>(global_batch) / 256.0;
  std::vector<std::string> later, epochs, steps;
  for (size_t i = 1; i < kMultipliers.size(); ++i) later.push_back(fmt::format("{:g}", rate * kMultipliers[i]));
  for (int64_t e : kBoundaryEpochs) {
    epochs.push_back(std::to_string(e));
    steps.push_back(std::to_string(e * steps_per_epoch));
  }
  const std::string warmup =
      warmup_epochs > 0 ? fmt::format(", linear warmup over {} = {}", count_of(warmup_epochs, "epoch"),
                                      count_of(warmup_epochs * steps_per_epoch, "step"))
                        : std::string(", no warmup");
  return fmt::format("{:g} ({:g} per 256 images, global batch {}){}, then {} after epochs {} = steps {}", rate,
                     base_lr_per_256, global_batch, warmup, fmt::join(later, ", "), fmt::join(epochs, ", "),
                     fmt::join(steps, ", "));
}

}  // namespace tnt_models
