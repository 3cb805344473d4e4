// ResNet-50 v1.5 with torchvision's parameter names and layouts, so a checkpoint written by
// tnt::Model loads into torchvision.models.resnet50 (and the other way round).
//
// v1.5: in the first bottleneck of layer2..layer4 the stride-2 is on the 3x3 convolution
// (conv2), not on the first 1x1 (v1). Every convolution is bias-free and followed by a
// BatchNorm. Initialisation follows torchvision: convolutions N(0, sqrt(2 / fan_out)),
// fan_out = filters * k * k (kaiming_normal_, mode fan_out, relu); BatchNorm weight 1,
// bias 0; fc U(-1/sqrt(2048), 1/sqrt(2048)) for weight and bias (nn.Linear's default).
// With zero_init_residual the last BatchNorm of each residual branch (bn3) starts at
// weight 0, so every block starts as the identity (Goyal et al., "Accurate, large
// minibatch SGD"), as torchvision's option of the same name.
#pragma once

#include <tarantella/graph.hpp>
#include <tarantella/schedule.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace tnt_models {

// Input (N, 3, image_size, image_size) f32, output logits (N, num_classes). image_size
// must be at least 32 (the network downsamples by 32).
std::shared_ptr<tnt::Network> make_resnet50(int64_t num_classes, bool zero_init_residual,
                                            int64_t image_size = 224);

// Whether a full parameter name belongs to a BatchNorm (bn1, layerX.Y.bnZ,
// layerX.Y.downsample.1): the TF ResNet and the tutorial exclude those from weight decay.
bool is_batch_norm_parameter(const std::string& full_name);

// The tutorial's learning rate: base_lr_per_256 scaled linearly to the global batch, a
// linear warmup over warmup_epochs, then x0.1 at epochs 30, 60 and 80. epoch_size is the
// number of training samples per epoch (steps per epoch = epoch_size / global_batch).
tnt::SchedulePtr make_lr_schedule(int64_t global_batch, int64_t epoch_size, int64_t warmup_epochs,
                                  double base_lr_per_256);

// make_lr_schedule's schedule in words, numbers in the shortest form ({:g}: 0.00125, not
// 0.0012500000000000002): "0.0125 (0.1 per 256 images, global batch 32), linear warmup over
// 5 epochs = 20 steps, then 0.00125, 0.000125, 1.25e-05 after epochs 30, 60, 80 = steps 120,
// 240, 320".
std::string describe_lr_schedule(int64_t global_batch, int64_t epoch_size, int64_t warmup_epochs,
                                 double base_lr_per_256);

}  // namespace tnt_models
