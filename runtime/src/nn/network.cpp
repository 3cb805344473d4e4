// Network construction (see graph.hpp for the idea): from the symbolic outputs back to the
// inputs, an order of the calls that depends only on the graph's structure (so it is the same
// on every rank), the layers in the order of their first call (the registration order of
// parameters, hence of the Reducer's buckets), their names, and the network's device.
#include "core/device_api.hpp"
#include "nn/fusion.hpp"
#include "nn/graph_node.hpp"

#include "tarantella/check.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/format.h>

#include <cctype>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace tnt {

namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

std::string lowercase(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Network::Network(const std::vector<SymTensor>& inputs, const std::vector<SymTensor>& outputs,
                 std::string name)
    : name_(std::move(name)) {
  set_graph(inputs, outputs, false);
}

Network::Network(std::string name) : name_(std::move(name)) {}

Network::~Network() = default;

void Network::prepare(const std::vector<Tensor>*) {
  TNT_CHECK(has_graph(), "network '{}' has no graph", name_);
}

void Network::set_graph(const std::vector<SymTensor>& inputs, const std::vector<SymTensor>& outputs,
                        bool sequential_names) {
  using detail::GraphNode;
  TNT_INPUT_CHECK(!inputs.empty(), "network '{}': no inputs given", name_);
  TNT_INPUT_CHECK(!outputs.empty(), "network '{}': no outputs given", name_);
  inputs_ = inputs;
  outputs_ = outputs;
  nodes_.clear();

  std::unordered_map<const GraphNode*, size_t> index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const SymTensor& in = inputs[i];
    TNT_INPUT_CHECK(in.defined() && in.node->layer == nullptr,
                    "network '{}': input {} is not a tensor made by tnt::Input()", name_, i);
    TNT_INPUT_CHECK(!index.count(in.node.get()), "network '{}': input {} is given twice", name_, i);
    if (in.node->input_name.empty()) {
      in.node->input_name = inputs.size() == 1 ? "input" : fmt::format("input_{}", i);
    }
    index[in.node.get()] = nodes_.size();
    nodes_.push_back(in.node);
  }

  // Post-order depth-first walk from the outputs: every node comes after its inputs, and
  // the order depends only on the graph's structure, so it is the same on every rank.
  for (size_t o = 0; o < outputs.size(); ++o) {
    TNT_INPUT_CHECK(outputs[o].defined(), "network '{}': output {} is undefined", name_, o);
    std::vector<std::pair<std::shared_ptr<GraphNode>, size_t>> stack;
    auto visit = [&](const std::shared_ptr<GraphNode>& n) {
      if (index.count(n.get())) return;
      TNT_INPUT_CHECK(n->layer != nullptr,
                      "network '{}': the outputs depend on input '{}' {}, which is not among the "
                      "network's inputs",
                      name_, n->input_name, detail::sym_shape_str(n->shapes[0]));
      stack.emplace_back(n, 0);
    };
    visit(outputs[o].node);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        std::shared_ptr<GraphNode> child = node->inputs[next++].node;
        visit(child);
      } else {
        index[node.get()] = nodes_.size();
        nodes_.push_back(node);
        stack.pop_back();
      }
    }
  }

  const size_t n = nodes_.size();
  node_inputs_.assign(n, {});
  consumers_.assign(n, {});
  pinned_.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    consumers_[i].assign(nodes_[i]->shapes.size(), 0);
    pinned_[i].assign(nodes_[i]->shapes.size(), false);
  }
  for (size_t i = 0; i < n; ++i) {
    for (const SymTensor& in : nodes_[i]->inputs) {
      const size_t p = index.at(in.node.get());
      node_inputs_[i].emplace_back(p, in.index);
      ++consumers_[p][static_cast<size_t>(in.index)];
    }
  }
  output_node_.clear();
  for (const SymTensor& out : outputs_) {
    output_node_.push_back(index.at(out.node.get()));
    pinned_[output_node_.back()][static_cast<size_t>(out.index)] = true;
  }

  // Layers in the order of their first call.
  layers_.clear();
  owned_.clear();
  layer_of_node_.assign(n, kNone);
  first_node_of_layer_.clear();
  std::unordered_map<const Layer*, size_t> layer_index;
  for (size_t i = 0; i < n; ++i) {
    Layer* layer = nodes_[i]->layer;
    if (layer == nullptr) continue;
    auto [it, fresh] = layer_index.emplace(layer, layers_.size());
    if (fresh) {
      layers_.push_back(layer);
      first_node_of_layer_.push_back(i);
    }
    if (nodes_[i]->owner) owned_.push_back(nodes_[i]->owner);
    layer_of_node_[i] = it->second;
  }

  // Names: a layer the program named keeps its name; a default-named one is renamed by
  // position (Sequential, as PyTorch) or as "<type>", "<type>_1", ... (Keras), skipping
  // names already taken, so checkpoint names do not depend on other models in the process.
  std::unordered_set<std::string> taken;
  for (Layer* layer : layers_) {
    if (!layer->has_default_name()) taken.insert(layer->name());
  }
  std::unordered_map<std::string, int> counters;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer* layer = layers_[l];
    if (!layer->has_default_name() && !layer->name().empty()) continue;
    std::string name;
    if (sequential_names) {
      name = std::to_string(first_node_of_layer_[l] - inputs_.size());
    } else {
      const std::string base = lowercase(layer->type());
      do {
        const int k = counters[base]++;
        name = k == 0 ? base : fmt::format("{}_{}", base, k);
      } while (taken.count(name));
    }
    layer->set_name(name);
    taken.insert(name);
  }
  std::unordered_map<std::string, const Layer*> by_name;
  for (Layer* layer : layers_) {
    auto [it, fresh] = by_name.emplace(layer->name(), layer);
    TNT_INPUT_CHECK(fresh,
                    "network '{}': two different layers are named '{}' ({} and {}); parameter "
                    "names must be unique, so give each layer its own name",
                    name_, layer->name(), it->second->type(), layer->type());
  }

  device_ = layers_.empty() ? Device::cpu() : layers_[0]->device();
  for (Layer* layer : layers_) {
    TNT_INPUT_CHECK(layer->device() == device_,
                    "network '{}': layer '{}' is on {} but layer '{}' on {}; move the layers to one "
                    "device first",
                    name_, layers_[0]->name(), device_.str(), layer->name(), layer->device().str());
  }
  saved_.assign(n, {});
  fusion_.reset();  // the chains of the old graph
  out_shapes_.assign(n, {});
  out_dtypes_.assign(n, {});
  out_formats_.assign(n, {});
  have_saved_ = false;
}

void Network::zero_grad() {
  prepare(nullptr);
  // Each gradient once (a layer or parameter may appear twice); on a GPU in one launch per
  // device, not one memset per parameter (backend::cuda_zero_spans).
  std::set<std::pair<const void*, size_t>> seen;
  std::map<int, std::vector<std::pair<void*, size_t>>> device_spans;
  for (Layer* layer : layers_) {
    for (Parameter* p : layer->parameters()) {
      if (!p->grad.defined() || p->grad.nbytes() == 0) continue;
      if (!seen.insert({p->grad.raw(), p->grad.nbytes()}).second) continue;
      if (p->grad.device().is_cpu() || !config().cuda_batched_spans) {
        p->grad.zero_();
      } else {
        device_spans[p->grad.device().index].push_back({p->grad.raw(), p->grad.nbytes()});
      }
    }
  }
  for (const auto& [device, spans] : device_spans) backend::cuda_zero_spans(spans, device, zero_spans_cache_);
}

std::vector<NamedParameter> Network::named_parameters() {
  prepare(nullptr);
  std::vector<NamedParameter> out;
  for (Layer* layer : layers_) {
    for (auto& [name, p] : layer->named_parameters()) out.push_back({name, p});
  }
  return out;
}

std::vector<NamedParameter> Network::named_buffers() {
  prepare(nullptr);
  std::vector<NamedParameter> out;
  for (Layer* layer : layers_) {
    for (auto& [name, p] : layer->named_buffers()) out.push_back({name, p});
  }
  return out;
}

std::vector<NamedParameter> Network::trainable_parameters() {
  std::vector<NamedParameter> out;
  for (NamedParameter& np : named_parameters()) {
    if (np.param->trainable) out.push_back(std::move(np));
  }
  return out;
}

std::vector<size_t> Network::first_trainable_of_layers() {
  std::vector<size_t> first;
  size_t count = 0;
  for (Layer* layer : layers_) {
    first.push_back(count);
    for (Parameter* p : layer->parameters()) count += p->trainable ? 1 : 0;
  }
  return first;
}

std::vector<Layer*> Network::layers() {
  prepare(nullptr);
  return layers_;
}

void Network::initialize(uint64_t seed) {
  prepare(nullptr);
  for (Layer* layer : layers_) layer->initialize(seed);
}

void Network::to(Device device) {
  prepare(nullptr);
  for (Layer* layer : layers_) layer->to(device);
  device_ = device;
  for (SavedState& s : saved_) s = SavedState{};
  have_saved_ = false;
}

int64_t Network::parameter_count() {
  prepare(nullptr);
  int64_t count = 0;
  for (Layer* layer : layers_) count += layer->parameter_count();
  return count;
}

int64_t Network::trainable_parameter_count() {
  int64_t count = 0;
  for (const NamedParameter& np : trainable_parameters()) count += np.param->value.numel();
  return count;
}

const std::vector<SymTensor>& Network::inputs() {
  prepare(nullptr);
  return inputs_;
}

const std::vector<SymTensor>& Network::outputs() {
  prepare(nullptr);
  return outputs_;
}

}  // namespace tnt
