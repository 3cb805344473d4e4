// The fused chain ReLU -> MaxPool2D (nn/fusion.hpp) on the CPU, 2x2 windows at stride 2 on
// NCHW: "conv, relu, pool" twice in the Fashion-MNIST CNN (the demo), as in most small CNNs.
// One pass each way (layers/max_pool_2x2_cpu.hpp): the forward reads the convolution's output
// and writes the pooled values and their argmax, where the layers one by one wrote and read
// ReLU's output in between (a tensor 4x the pooled one, kept for ReLU's backward); the
// backward writes the input gradient once, where the pooling wrote its gradient and ReLU read
// it and wrote another. ReLU is applied to each window's elements before they are compared,
// so the values, ties, argmax and gradients are the bits of the two layers: ReLU maps a NaN
// to 0 (x > 0 ? x : 0), and its backward passes the pooling's gradient only where its output,
// the pooled value at the argmax, is above 0.
//
// Everywhere else (a CUDA tensor, channels_last, another dtype, other windows: the pattern
// accepts 2x2 stride 2 only) the executor runs the two layers one by one.
#include "layers/max_pool_2x2_cpu.hpp"
#include "nn/fusion.hpp"
#include "tarantella/layers/activation.hpp"
#include "tarantella/layers/pooling.hpp"

namespace tnt {

namespace {

MaxPool2D& pool_of(const std::vector<Layer*>& layers) {
  auto* p = dynamic_cast<MaxPool2D*>(layers.at(1));
  TNT_CHECK(p != nullptr, "fused chain: layer '{}' says it is a MaxPool2D but is not one", layers.at(1)->name());
  return *p;
}

// Saved: {argmax (N, C, Ho, Wo) i32, the chain's output y}; extra: the input's shape.
bool chain_forward(const std::vector<Layer*>& layers, const std::vector<Tensor>& inputs, const RunContext&,
                   SavedState& saved, std::vector<Tensor>& outputs) {
  if (inputs.size() != 1 || !inputs[0].defined()) return false;
  const Tensor& x = inputs[0];
  if (!x.device().is_cpu() || x.dtype() != DType::f32 || x.ndim() != 4 ||
      x.memory_format() != MemoryFormat::contiguous) {
    return false;
  }
  MaxPool2D& pool = pool_of(layers);
  layers[0]->ensure_built({x.shape()});
  pool.ensure_built({x.shape()});
  const Shape y_shape = pool.output_shapes({x.shape()})[0];
  Tensor y = Tensor::empty(y_shape, DType::f32);    // (N, C, Ho, Wo)
  Tensor arg = Tensor::empty(y_shape, DType::i32);  // (N, C, Ho, Wo)
  if (x.numel() > 0) {
    detail::max_pool_2x2_planes<true>(x.data<float>(), y.data<float>(), arg.data<int32_t>(), x.dim(0) * x.dim(1),
                                      x.dim(2), x.dim(3));
  }
  saved.tensors = {arg, y};
  saved.extra = std::make_shared<Shape>(x.shape());
  outputs = {y};
  return true;
}

std::vector<Tensor> chain_backward(const std::vector<Layer*>& layers, const std::vector<Tensor>& grad_outputs,
                                   const RunContext&, SavedState& saved) {
  MaxPool2D& pool = pool_of(layers);
  TNT_CHECK(saved.tensors.size() == 2 && saved.extra, "fused chain of MaxPool2D '{}': backward without a forward",
            pool.name());
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(),
            "fused chain of MaxPool2D '{}': one gradient expected", pool.name());
  const Tensor& arg = saved.tensors[0];
  const Tensor& y = saved.tensors[1];
  const Shape x_shape = *std::static_pointer_cast<Shape>(saved.extra);
  TNT_CHECK(grad_outputs[0].shape() == y.shape() && grad_outputs[0].dtype() == DType::f32,
            "MaxPool2D '{}': gradient {} for output {}", pool.name(), grad_outputs[0].str(), y.str());
  const Tensor dy = grad_outputs[0].to_memory_format(MemoryFormat::contiguous);
  Tensor dx = Tensor::empty(x_shape, DType::f32);  // (N, C, H, W)
  if (dx.numel() > 0) {
    detail::max_pool_2x2_planes_backward(dy.data<float>(), arg.data<int32_t>(), dx.data<float>(),
                                         x_shape[0] * x_shape[1], x_shape[2], x_shape[3], y.data<float>());
  }
  return {dx};
}

bool accepts(const std::vector<Layer*>& layers) {
  auto* pool = dynamic_cast<MaxPool2D*>(layers.at(1));
  return detail::is_exactly<ReLU>(layers.at(0)) && detail::is_exactly<MaxPool2D>(pool) && pool->pool_size() == 2 &&
         pool->stride() == 2 && pool->padding() == 0;
}

const detail::FusionRegistration kReLUMaxPool([] {
  detail::FusionPattern p{"relu_max_pool", {"ReLU", "MaxPool2D"}, accepts, chain_forward, chain_backward};
  p.cpu_engine = true;
  p.cuda_engine = false;
  return p;
}());

}  // namespace

}  // namespace tnt
