// The CPU engine of BatchNorm's fused chains (layers/batch_norm_fusion.cpp), beside the
// layer's own oneDNN calls in layers/batch_norm.cpp. BatchNorm -> ReLU is oneDNN's batch
// normalisation with its ReLU flag (fuse_norm_relu: ReLU before y is stored, a bit mask for
// the backward); BatchNorm -> Add -> ReLU is oneDNN's batch normalisation, then the sum and
// ReLU in one pass over its output. Either way a step makes one tensor where the layers made
// two or three, reads and writes it once less each way, and its results are the layers' bits
// (nn_layer_fusion checks them in both memory formats).
#pragma once

#include "tarantella/layers/batch_norm.hpp"

namespace tnt::cpu {

// x (and z, the Add's other input, or undefined) f32 on the CPU, z of x's shape and memory
// format; otherwise false, having changed nothing. Runs bn.begin_forward; y takes x's format.
bool batch_norm_act_forward(BatchNorm& bn, const Tensor& x, const Tensor& z, const RunContext& rc, SavedState& saved,
                            Tensor& y);
// dy (like y) -> {dx} or {dx, dz}; the parameter gradients are added to the layer's.
std::vector<Tensor> batch_norm_act_backward(BatchNorm& bn, const Tensor& dy, SavedState& saved);

}  // namespace tnt::cpu
