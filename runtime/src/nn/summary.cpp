// Network::summary(): a Keras-style table, one row per call (a layer's k-th call, k >= 2,
// is "name#k" and its parameters are counted once, at its first call). A plain chain has
// no "Connected to" column; any other graph lists each call's inputs.
#include "nn/graph_node.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tnt {

namespace {

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace

std::string Network::summary() {
  prepare(nullptr);
  const size_t n = nodes_.size();
  // A node's label: the layer's name, with "#k" for its k-th call (k >= 2).
  std::vector<std::string> label(n);
  std::vector<int> calls(layers_.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    if (nodes_[i]->layer == nullptr) {
      label[i] = nodes_[i]->input_name;
      continue;
    }
    const int c = ++calls[layer_of_node_[i]];
    label[i] = c == 1 ? nodes_[i]->layer->name() : fmt::format("{}#{}", nodes_[i]->layer->name(), c);
  }
  bool chain = inputs_.size() == 1;
  for (size_t i = inputs_.size(); chain && i < n; ++i) {
    chain = node_inputs_[i].size() == 1 && node_inputs_[i][0].first == i - 1;
  }

  struct Row {
    std::string layer, shape, params, inputs;
  };
  std::vector<Row> rows;
  for (size_t i = 0; i < n; ++i) {
    const detail::GraphNode& node = *nodes_[i];
    Row r;
    r.layer = fmt::format("{} ({})", label[i], node.layer ? node.layer->type() : "Input");
    for (size_t k = 0; k < node.shapes.size(); ++k) {
      r.shape += (k > 0 ? ", " : "") + detail::sym_shape_str(node.shapes[k]);
    }
    if (node.layer == nullptr) {
      r.params = "0";
    } else if (first_node_of_layer_[layer_of_node_[i]] == i) {
      r.params = with_commas(node.layer->parameter_count());
    } else {
      r.params = "(shared)";
    }
    for (const auto& [p, k] : node_inputs_[i]) {
      if (!r.inputs.empty()) r.inputs += ", ";
      r.inputs += nodes_[p]->shapes.size() > 1 ? fmt::format("{}[{}]", label[p], k) : label[p];
    }
    rows.push_back(std::move(r));
  }
  size_t w0 = 12, w1 = 12, w2 = 7;
  for (const Row& r : rows) {
    w0 = std::max(w0, r.layer.size());
    w1 = std::max(w1, r.shape.size());
    w2 = std::max(w2, r.params.size());
  }
  std::string out = fmt::format("Model: \"{}\"\n", name_);
  std::string header = fmt::format("{:<{}}  {:<{}}  {:>{}}", "Layer (type)", w0, "Output Shape", w1,
                                   "Param #", w2);
  if (!chain) header += "  Connected to";
  size_t width = header.size();
  for (const Row& r : rows) {
    if (!chain) width = std::max(width, w0 + w1 + w2 + 8 + r.inputs.size());
  }
  out += header + "\n" + std::string(width, '=') + "\n";
  for (const Row& r : rows) {
    std::string line = fmt::format("{:<{}}  {:<{}}  {:>{}}", r.layer, w0, r.shape, w1, r.params, w2);
    if (!chain && !r.inputs.empty()) line += "  " + r.inputs;
    out += line + "\n";
  }
  const int64_t total = parameter_count();
  const int64_t trainable = trainable_parameter_count();
  int64_t buffers = 0;
  for (const NamedParameter& b : named_buffers()) buffers += b.param->value.numel();
  out += std::string(width, '=') + "\n";
  out += fmt::format("Total params: {}\nTrainable params: {}\nNon-trainable params: {}\n",
                     with_commas(total), with_commas(trainable), with_commas(total - trainable));
  out += fmt::format("Buffers (running statistics, not counted above): {}\n", with_commas(buffers));
  return out;
}

}  // namespace tnt
