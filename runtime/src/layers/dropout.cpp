#include "tarantella/layers/dropout.hpp"
#include "nn/layer_types.hpp"

#include "backend/dispatch.hpp"
#include "layers/dropout_cuda.hpp"
#include "layers/dropout_cpu.hpp"
#include "layers/dropout_mask.hpp"

namespace tnt {

Dropout::Dropout(double rate, std::string name) : Layer(std::move(name)), rate_(rate) {
  default_name("dropout");
  TNT_INPUT_CHECK(rate >= 0 && rate < 1, "Dropout '{}': rate {} is not in [0, 1)", name_, rate);
}

std::vector<Shape> Dropout::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1, "Dropout '{}': expects one input", name_);
  return {in[0]};
}

namespace detail {
uint64_t dropout_mask_key(const std::string& layer_name, const RunContext& rc) {
  return CounterRng(rc.seed, fmt::format("{}/dropout/{}", layer_name, rc.step)).key();
}
}  // namespace detail

uint64_t Dropout::mask_key(const RunContext& rc) const { return detail::dropout_mask_key(name_, rc); }

uint64_t Dropout::mask_counter(const RunContext& rc, const Shape& shape) {
  if (shape.empty() || shape[0] == 0) return 0;
  return static_cast<uint64_t>(rc.sample_offset) * static_cast<uint64_t>(shape_numel(shape) / shape[0]);
}

std::vector<Tensor> Dropout::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  ensure_built({inputs[0].shape()});
  saved.tensors.clear();
  saved.extra.reset();
  if (!rc.training || rate_ == 0) return {inputs[0]};  // identity; backward passes dy on
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::dropout_forward(*this, inputs, rc, saved));
  const Tensor& x = inputs[0];
  const uint64_t key = mask_key(rc), base = mask_counter(rc, x.shape());
  const float rate = static_cast<float>(rate_);
  const float keep_scale = static_cast<float>(1.0 / (1.0 - rate_));
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  Tensor mask = Tensor::empty(x.shape(), DType::u8);  // 1 = kept
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  uint8_t* ms = mask.data<uint8_t>();
  detail::for_each_dropout_keep(key, base, x.numel(), rate, [&](int64_t i, bool keep) {
    ms[i] = keep;
    ys[i] = keep ? xs[i] * keep_scale : 0.0f;
  });
  saved.tensors = {mask};
  return {y};
}

std::vector<Tensor> Dropout::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                      SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "Dropout '{}': backward needs one gradient", name_);
  if (saved.tensors.empty() && !saved.extra) return {grad_outputs[0].clone()};  // forward was the identity
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::dropout_backward(*this, grad_outputs, rc, saved));
  const Tensor& mask = saved.tensors.at(0);
  const Tensor& dy = grad_outputs[0];
  TNT_CHECK(dy.numel() == mask.numel() && dy.dtype() == DType::f32, "Dropout '{}': gradient {} for output {}", name_,
            dy.str(), mask.str());
  const float keep_scale = static_cast<float>(1.0 / (1.0 - rate_));
  Tensor dx = Tensor::empty(dy.shape(), DType::f32);
  const uint8_t* ms = mask.data<uint8_t>();
  const float* g = dy.data<float>();
  float* d = dx.data<float>();
  const int64_t n = dy.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) d[i] = ms[i] ? g[i] * keep_scale : 0.0f;
  return {dx};
}

// Model files (nn/layer_types.hpp).
namespace {
const detail::LayerTypeRegistration kDropout(
    "Dropout",
    [](const Layer& l) {
      LayerConfig c;
      c.set_double("rate", detail::layer_as<Dropout>(l).rate());
      return c;
    },
    [](const std::string& name, const LayerConfig& c) -> LayerPtr {
      return std::make_shared<Dropout>(c.get_double("rate"), name);
    });
}  // namespace

}  // namespace tnt
