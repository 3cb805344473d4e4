// cuDNN operation graphs for a ResNet block with BatchNorm fused into its convolutions, the
// way NVIDIA's tuned ResNet-50 runs on Ampere and Hopper (cuDNN's "ConvBNfprop",
// "DgradDreluBNBwdWeight", "ConvBNwgrad" and "BN finalize" patterns):
//   forward   conv -> GEN_STATS (per-channel sum, sum of squares of the bf16 output), or
//             scale + bias + ReLU of the input (the previous BatchNorm applied on the fly)
//             -> conv -> GEN_STATS;
//             BN_FINALIZE: those sums -> the next BatchNorm's equivalent scale and bias, the
//             saved mean and inverse std, the running mean and variance;
//   backward  dgrad -> dReLU (against the BatchNorm output recomputed from its input) ->
//             BN_BWD_WEIGHTS (dscale, dbias and the coefficients of the input gradient);
//             scale + bias + ReLU of the input recomputed -> wgrad.
//
// Groundwork only: nothing in the model or the layers calls this yet (Conv2D runs cuDNN's
// legacy API in conv2d_cuda.cu, BatchNorm its legacy fused ops). What is proven today is what
// cuDNN 9.19 plans for an H200 on a machine without a GPU (deviceless planning,
// tests/layers/test_conv_bn_graph.cpp, table in docs/gpu.md): conv + GEN_STATS, scale + bias
// + ReLU -> conv -> GEN_STATS (bf16 scale/bias and intermediates only) and BN finalize as
// asked; dgrad + dReLU + BN backward weights refused (dgrad + dReLU served), scale + bias +
// ReLU -> wgrad refused in bf16 (plain wgrad served). Numerics wait for the GPU integration.
//
// The node patterns follow cudnn-frontend's samples for the same fusions (convolution/
// fprop.cpp "SBRCS", dgrads.cpp "Dgrad Drelu DBNweight", wgrads.cpp "scale-bias-relu-wgrad",
// norm/batchnorm.cpp "BN Finalize") and its nodes' descriptor attributes: NHWC activations
// as (N, C, H, W) dims with channels-last strides, KRSC filters, per-channel (1, C, 1, 1)
// f32 statistics, f32 compute, virtual tensors between fused nodes, alpha 1 and beta 0.
#pragma once

#include "tarantella/dtype.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace tnt::cuda {

// One convolution: x (N, C, H, W) NHWC, w (K, C, R, S) KRSC -> y (N, K, P, Q) NHWC, the same
// stride and padding along H and W, no dilation.
struct ConvBnShape {
  int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 1, s = 1, stride = 1, padding = 0;
  int64_t p() const { return (h + 2 * padding - r) / stride + 1; }
  int64_t q() const { return (w + 2 * padding - s) / stride + 1; }
  std::string str() const;  // "N256 C64 56x56 -> K256 1x1/s1/p0 (56x56)"
};

enum class ConvBnGraphKind {
  conv_genstats,        // y = conv(x, w); sum, sq_sum of y
  sbr_conv_genstats,    // y = conv(relu(x scale + bias), w); sum, sq_sum of y
  sbr_conv,             // y = conv(relu(x scale + bias), w)
  conv,                 // y = conv(x, w)
  bn_finalize,          // sum, sq_sum (K channels) -> eq scale/bias, saved stats, running stats
  dgrad_drelu_dbn,      // dz = drelu(dgrad(dy, w), bn(x)); BN backward weights of (x, dz)
  dgrad_drelu,          // dz = drelu(dgrad(dy, w), x)
  dgrad,                // dx = dgrad(dy, w)
  sbr_wgrad,            // dw = wgrad(relu(x scale + bias), dy)
  wgrad,                // dw = wgrad(x, dy)
};
const char* conv_bn_graph_kind_name(ConvBnGraphKind k);
// The graphs with fewer fused operations to try when cuDNN serves none for `k`, in order
// (the closest first): sbr_conv_genstats -> sbr_conv -> conv_genstats -> conv, ...
std::vector<ConvBnGraphKind> conv_bn_fallbacks(ConvBnGraphKind k);

// The data types left open by the patterns: those of the per-channel scale and bias applied
// to the bf16 activations (cudnn-frontend's samples give them the I/O type; our BatchNorm
// keeps them in f32) and of the virtual tensors between fused nodes (f32 in the fprop and
// dgrad samples, the I/O type in the wgrad one). Activations and filters are in the I/O
// type: bf16 (the model's), or f16 (the samples', to tell a pattern cuDNN serves only in f16).
struct ConvBnVariant {
  DType io = DType::bf16;
  DType affine = DType::f32;
  DType intermediate = DType::f32;
  std::string str() const;  // "I/O bf16, scale/bias f32, intermediate f32"
};
// The variants tried for an I/O type, in order: f32 scale/bias and f32 intermediates first
// (what our BatchNorm produces and what loses nothing), then the I/O type where the samples
// use it.
std::vector<ConvBnVariant> conv_bn_variants(DType io = DType::bf16);

// The graph's operations ("CONV_FPROP", "POINTWISE MUL (x * scale)", ...) and its tensors as
// cuDNN holds them after finalize ("x: uid 1 bf16 [256,64,56,56] strides [...]"), built
// without a GPU or handle, for tests to pin.
struct ConvBnGraphText {
  std::vector<std::string> ops, tensors;
};
ConvBnGraphText conv_bn_graph(ConvBnGraphKind kind, const ConvBnShape& shape, const ConvBnVariant& variant = {});

// What cuDNN chose for a graph on the described GPU: the graph and variant it served (the
// one asked for, or the first fallback served), its engine (global index), heuristics mode
// and rank, workspace, whether the kernel was generated but not loaded (no CUDA driver
// here), and why each graph/variant tried before it was refused.
struct ConvBnPlanInfo {
  ConvBnGraphKind asked = ConvBnGraphKind::conv, served = ConvBnGraphKind::conv;
  ConvBnVariant variant;
  int64_t engine = -1, mode = -1, config = -1, workspace = 0;
  bool compiled_only = false;
  std::vector<std::string> refused;  // "<kind> [<variant>]: <cuDNN's reasons>"
  std::string str() const;
};
// Plans `kind` for shape on the GPU device_json describes (graph::make_device_properties),
// without it: each variant of `kind`, then each variant of its fallbacks, until one gets an
// execution plan. Throws with every refusal if none does. With fallbacks false only `kind`.
ConvBnPlanInfo conv_bn_plan_deviceless(ConvBnGraphKind kind, const ConvBnShape& shape,
                                       const std::string& device_json, bool fallbacks = true,
                                       DType io = DType::bf16);

}  // namespace tnt::cuda
