#include "tarantella/layers/add.hpp"

#include "tarantella/ops.hpp"

namespace tnt {

Add::Add(std::string name) : Layer(std::move(name)) { default_name("add"); }

std::vector<Shape> Add::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() >= 2, "Add '{}': expects two or more inputs, got {}", name_, in.size());
  for (size_t i = 1; i < in.size(); ++i)
    TNT_CHECK(in[i] == in[0], "Add '{}': input {} has shape {}, input 0 has {}", name_, i, shape_str(in[i]),
              shape_str(in[0]));
  return {in[0]};
}

std::vector<Tensor> Add::forward(const std::vector<Tensor>& inputs, const RunContext&, SavedState& saved) {
  check_inputs(inputs, 0);
  std::vector<Shape> shapes;
  for (const Tensor& t : inputs) shapes.push_back(t.shape());
  output_shapes(shapes);
  for (const Tensor& t : inputs)
    TNT_CHECK(t.dtype() == inputs[0].dtype(), "Add '{}': inputs of different dtypes ({} and {})", name_, t.str(),
              inputs[0].str());
  ensure_built(shapes);
  Tensor y = ops::add(inputs[0], inputs[1]);
  for (size_t i = 2; i < inputs.size(); ++i) ops::axpy(1.0, inputs[i], y);
  saved.tensors.clear();
  saved.extra = std::make_shared<size_t>(inputs.size());
  return {y};
}

std::vector<Tensor> Add::backward(const std::vector<Tensor>& grad_outputs, const RunContext&, SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && saved.extra,
            "Add '{}': backward needs one gradient and a forward", name_);
  const size_t n = *std::static_pointer_cast<size_t>(saved.extra);
  // Each input gets its own copy: the caller may accumulate into a returned gradient.
  std::vector<Tensor> grads{grad_outputs[0].clone()};
  for (size_t i = 1; i < n; ++i) grads.push_back(grad_outputs[0].clone());
  return grads;
}

}  // namespace tnt
