// Add: the sum of two or more tensors of one shape. Memory formats: the sum has the first
// input's format (ops::add converts the others), and each input gradient comes back in
// that input's format.
#include "tarantella/layers/add.hpp"
#include "nn/layer_types.hpp"

#include "tarantella/ops.hpp"

namespace tnt {

Add::Add(std::string name) : Layer(std::move(name)) { default_name("add"); }

std::vector<Shape> Add::output_shapes(const std::vector<Shape>& in) const {
  TNT_INPUT_CHECK(in.size() >= 2, "Add '{}': expects two or more inputs, got {}", name_, in.size());
  for (size_t i = 1; i < in.size(); ++i)
    TNT_INPUT_CHECK(in[i] == in[0], "Add '{}': input {} has shape {}, input 0 has {}", name_, i, shape_str(in[i]),
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
  for (size_t i = 2; i < inputs.size(); ++i) ops::axpy(1.0, inputs[i].to_memory_format(y.memory_format()), y);
  saved.tensors.clear();
  auto formats = std::make_shared<std::vector<MemoryFormat>>();  // per input
  for (const Tensor& t : inputs) formats->push_back(t.memory_format());
  saved.extra = formats;
  return {y};
}

std::vector<Tensor> Add::backward(const std::vector<Tensor>& grad_outputs, const RunContext&, SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && saved.extra,
            "Add '{}': backward needs one gradient and a forward", name_);
  const auto& formats = *std::static_pointer_cast<std::vector<MemoryFormat>>(saved.extra);
  // Each input gets dy in its own format. The first input in dy's format gets dy itself, each
  // other one its own copy, so that no two returned gradients share memory: the executor sums
  // into a gradient in place only where nothing else holds its memory (nn/executor_util.hpp).
  std::vector<Tensor> grads;
  const Tensor& dy = grad_outputs[0];
  bool shared = false;
  for (MemoryFormat f : formats) {
    if (dy.memory_format() != f) {
      grads.push_back(dy.to_memory_format(f));  // a conversion is a copy
    } else {
      grads.push_back(shared ? dy.clone() : dy);
      shared = true;
    }
  }
  return grads;
}

// Model files (nn/layer_types.hpp).
namespace {
const auto kAdd = detail::LayerTypeRegistration::plain<Add>("Add");
}  // namespace

}  // namespace tnt
