// Recording the functional graph (see graph.hpp for the idea): a call of a layer on symbolic
// tensors makes a node. Symbolic shapes are found by asking the layer for its output shapes
// at batch 1 and at batch 2: a dimension that differs follows the batch and is shown as -1
// ("None").
#include "nn/graph_node.hpp"

#include "tarantella/check.hpp"

#include <fmt/format.h>

#include <utility>

namespace tnt {

namespace detail {

std::string sym_shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) out += ", ";
    out += s[i] < 0 ? std::string("None") : std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

}  // namespace detail

namespace {

Shape with_batch(const Shape& symbolic, int64_t batch) {
  Shape s = symbolic;
  for (int64_t& d : s) {
    if (d < 0) d = batch;
  }
  return s;
}

std::vector<SymTensor> record_call(Layer* layer, LayerPtr owner, const std::vector<SymTensor>& inputs) {
  TNT_CHECK(!inputs.empty(), "layer '{}' ({}) called on no inputs", layer->name(), layer->type());
  std::vector<Shape> at1, at2;
  std::vector<DType> dtypes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TNT_CHECK(inputs[i].defined(), "layer '{}' ({}): input {} is an undefined SymTensor",
              layer->name(), layer->type(), i);
    at1.push_back(with_batch(inputs[i].shape(), 1));
    at2.push_back(with_batch(inputs[i].shape(), 2));
    dtypes.push_back(inputs[i].dtype());
  }
  layer->ensure_built(at1);
  const std::vector<Shape> out1 = layer->output_shapes_for(at1, dtypes);
  const std::vector<Shape> out2 = layer->output_shapes_for(at2, dtypes);
  TNT_CHECK(!out1.empty() && out1.size() == out2.size(), "layer '{}' ({}) reports no outputs",
            layer->name(), layer->type());

  auto node = std::make_shared<detail::GraphNode>();
  node->layer = layer;
  node->owner = std::move(owner);
  node->inputs = inputs;
  const DType in_type = inputs[0].dtype();
  for (size_t k = 0; k < out1.size(); ++k) {
    Shape s = out1[k];
    if (out2[k].size() == s.size()) {
      for (size_t d = 0; d < s.size(); ++d) {
        if (out2[k][d] != s[d]) s[d] = -1;
      }
    }
    node->shapes.push_back(std::move(s));
    // Layers do not declare output types: floating inputs keep theirs (mixed precision),
    // integer ones (token ids, labels) give f32 (embeddings, losses).
    node->dtypes.push_back(is_floating(in_type) ? in_type : DType::f32);
  }
  std::vector<SymTensor> outs;
  for (size_t k = 0; k < out1.size(); ++k) outs.push_back({node, static_cast<int>(k)});
  return outs;
}

}  // namespace

SymTensor::SymTensor(const std::vector<SymTensor>& outputs) {
  TNT_CHECK(outputs.size() == 1,
            "{} symbolic tensors where one was expected: take the outputs of a multi-output "
            "layer as a std::vector<SymTensor>",
            outputs.size());
  *this = outputs[0];
}

const Shape& SymTensor::shape() const {
  TNT_CHECK(defined(), "shape() of an undefined SymTensor");
  return node->shapes.at(static_cast<size_t>(index));
}

DType SymTensor::dtype() const {
  TNT_CHECK(defined(), "dtype() of an undefined SymTensor");
  return node->dtypes.at(static_cast<size_t>(index));
}

std::string SymTensor::str() const {
  if (!defined()) return "undefined";
  const std::string from = node->layer ? node->layer->name() : node->input_name;
  return fmt::format("{} {} from {}", detail::sym_shape_str(shape()), dtype_name(dtype()), from);
}

SymTensor Input(const Shape& per_sample_shape, DType dtype, const std::string& name) {
  for (int64_t d : per_sample_shape) {
    TNT_CHECK(d > 0, "Input '{}': every per-sample dimension must be > 0, got {}", name,
              shape_str(per_sample_shape));
  }
  auto node = std::make_shared<detail::GraphNode>();
  Shape s{-1};
  s.insert(s.end(), per_sample_shape.begin(), per_sample_shape.end());
  node->shapes.push_back(std::move(s));
  node->dtypes.push_back(dtype);
  node->input_name = name;
  return {node, 0};
}

SymTensor call(const LayerPtr& layer, const SymTensor& input) {
  TNT_CHECK(layer != nullptr, "call() of a null layer");
  std::vector<SymTensor> outs = record_call(layer.get(), layer, {input});
  TNT_CHECK(outs.size() == 1, "layer '{}' ({}) has {} outputs; call it with a vector of inputs",
            layer->name(), layer->type(), outs.size());
  return outs[0];
}

std::vector<SymTensor> call(const LayerPtr& layer, const std::vector<SymTensor>& inputs) {
  TNT_CHECK(layer != nullptr, "call() of a null layer");
  return record_call(layer.get(), layer, inputs);
}

// The Layer base's side of the functional API: weak_from_this() is empty for a layer that
// does not live in a shared_ptr, which the network then does not keep alive (layer.hpp).
SymTensor Layer::operator()(const SymTensor& input) {
  std::vector<SymTensor> outs = record_call(this, weak_from_this().lock(), {input});
  TNT_CHECK(outs.size() == 1, "layer '{}' ({}) has {} outputs; call it with a vector of inputs",
            name(), type(), outs.size());
  return outs[0];
}

std::vector<SymTensor> Layer::operator()(const std::vector<SymTensor>& inputs) {
  return record_call(this, weak_from_this().lock(), inputs);
}

}  // namespace tnt
