#include "tarantella/layers/flatten.hpp"
#include "nn/layer_types.hpp"

namespace tnt {

Flatten::Flatten(std::string name) : Layer(std::move(name)) { default_name("flatten"); }

std::vector<Shape> Flatten::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1 && !in[0].empty(), "Flatten '{}': expects one input (N, ...)", name_);
  int64_t rest = 1;
  for (size_t i = 1; i < in[0].size(); ++i) rest *= in[0][i];
  return {{in[0][0], rest}};
}

std::vector<Tensor> Flatten::forward(const std::vector<Tensor>& inputs, const RunContext&, SavedState& saved) {
  check_inputs(inputs, 1);
  Shape out = output_shapes({inputs[0].shape()})[0];
  ensure_built({inputs[0].shape()});
  saved.tensors.clear();
  saved.extra = std::make_shared<Shape>(inputs[0].shape());
  return {inputs[0].reshape(out)};
}

std::vector<Tensor> Flatten::backward(const std::vector<Tensor>& grad_outputs, const RunContext&, SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && saved.extra,
            "Flatten '{}': backward needs one gradient and a forward", name_);
  return {grad_outputs[0].reshape(*std::static_pointer_cast<Shape>(saved.extra))};
}

// Model files (nn/layer_types.hpp).
namespace {
const auto kFlatten = detail::LayerTypeRegistration::plain<Flatten>("Flatten");
}  // namespace

}  // namespace tnt
