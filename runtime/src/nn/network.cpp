// The functional graph (see graph.hpp for the idea). A node is one call of a layer; symbolic
// shapes are found by asking the layer for its output shapes at batch 1 and at batch 2: a
// dimension that differs follows the batch and is shown as -1 ("None").
#include "tarantella/graph.hpp"

#include "tarantella/check.hpp"
#include "tarantella/ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace tnt {

namespace detail {

struct GraphNode {
  Layer* layer = nullptr;          // null for an Input
  LayerPtr owner;                  // keeps the layer alive where it lives in a shared_ptr
  std::vector<SymTensor> inputs;
  std::vector<Shape> shapes;       // per output, -1 where the size follows the batch
  std::vector<DType> dtypes;       // per output
  std::string input_name;          // Inputs only
};

}  // namespace detail

namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

template <typename... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

Shape with_batch(const Shape& symbolic, int64_t batch) {
  Shape s = symbolic;
  for (int64_t& d : s) {
    if (d < 0) d = batch;
  }
  return s;
}

std::string sym_shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) out += ", ";
    out += s[i] < 0 ? std::string("None") : std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string lowercase(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<SymTensor> record_call(Layer* layer, LayerPtr owner, const std::vector<SymTensor>& inputs) {
  TNT_CHECK(!inputs.empty(), "layer '{}' ({}) called on no inputs", layer->name(), layer->type());
  std::vector<Shape> at1, at2;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TNT_CHECK(inputs[i].defined(), "layer '{}' ({}): input {} is an undefined SymTensor",
              layer->name(), layer->type(), i);
    at1.push_back(with_batch(inputs[i].shape(), 1));
    at2.push_back(with_batch(inputs[i].shape(), 2));
  }
  layer->ensure_built(at1);
  const std::vector<Shape> out1 = layer->output_shapes(at1);
  const std::vector<Shape> out2 = layer->output_shapes(at2);
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

void accumulate(Tensor& slot, const Tensor& grad) {
  // Out of place: grad may be the caller's tensor or a view (Flatten) of another gradient.
  slot = slot.defined() ? ops::add(slot, grad) : grad;
}

// t in dtype `to` when t is floating in dtype `from`; anything else unchanged.
Tensor convert(const Tensor& t, DType from, DType to) {
  return t.defined() && t.dtype() == from && from != to ? ops::cast(t, to) : t;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Symbolic tensors and layer calls

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
  return fmt::format("{} {} from {}", sym_shape_str(shape()), dtype_name(dtype()), from);
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

SymTensor Layer::operator()(const SymTensor& input) {
  std::vector<SymTensor> outs = record_call(this, weak_from_this().lock(), {input});
  TNT_CHECK(outs.size() == 1, "layer '{}' ({}) has {} outputs; call it with a vector of inputs",
            name(), type(), outs.size());
  return outs[0];
}

std::vector<SymTensor> Layer::operator()(const std::vector<SymTensor>& inputs) {
  return record_call(this, weak_from_this().lock(), inputs);
}

// ---------------------------------------------------------------------------------------
// Network: construction

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
  if (inputs.empty()) input_error("network '{}': no inputs given", name_);
  if (outputs.empty()) input_error("network '{}': no outputs given", name_);
  inputs_ = inputs;
  outputs_ = outputs;
  nodes_.clear();

  std::unordered_map<const GraphNode*, size_t> index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const SymTensor& in = inputs[i];
    if (!in.defined() || in.node->layer != nullptr) {
      input_error("network '{}': input {} is not a tensor made by tnt::Input()", name_, i);
    }
    if (index.count(in.node.get())) input_error("network '{}': input {} is given twice", name_, i);
    if (in.node->input_name.empty()) {
      in.node->input_name = inputs.size() == 1 ? "input" : fmt::format("input_{}", i);
    }
    index[in.node.get()] = nodes_.size();
    nodes_.push_back(in.node);
  }

  // Post-order depth-first walk from the outputs: every node comes after its inputs, and
  // the order depends only on the graph's structure, so it is the same on every rank.
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!outputs[o].defined()) input_error("network '{}': output {} is undefined", name_, o);
    std::vector<std::pair<std::shared_ptr<GraphNode>, size_t>> stack;
    auto visit = [&](const std::shared_ptr<GraphNode>& n) {
      if (index.count(n.get())) return;
      if (n->layer == nullptr) {
        input_error("network '{}': the outputs depend on input '{}' {}, which is not among the "
                    "network's inputs",
                    name_, n->input_name, sym_shape_str(n->shapes[0]));
      }
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
    if (!fresh) {
      input_error("network '{}': two different layers are named '{}' ({} and {}); parameter "
                  "names must be unique, so give each layer its own name",
                  name_, layer->name(), it->second->type(), layer->type());
    }
  }

  first_param_of_layer_.clear();
  size_t count = 0;
  for (Layer* layer : layers_) {
    first_param_of_layer_.push_back(count);
    count += layer->parameters().size();
  }

  device_ = layers_.empty() ? Device::cpu() : layers_[0]->device();
  for (Layer* layer : layers_) {
    if (layer->device() != device_) {
      input_error("network '{}': layer '{}' is on {} but layer '{}' on {}; move the layers to one "
                  "device first",
                  name_, layers_[0]->name(), device_.str(), layer->name(), layer->device().str());
    }
  }
  saved_.assign(n, {});
  out_shapes_.assign(n, {});
  out_dtypes_.assign(n, {});
  have_saved_ = false;
}

// ---------------------------------------------------------------------------------------
// Network: forward and backward

std::vector<Tensor> Network::forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                                     std::optional<bool> keep_for_backward) {
  prepare(&inputs);
  const bool keep = keep_for_backward.value_or(rc.training);
  if (inputs.size() != inputs_.size()) {
    input_error("network '{}' takes {} inputs, got {}", name_, inputs_.size(), inputs.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const Shape& want = inputs_[i].shape();
    const std::string& what = inputs_[i].node->input_name;
    if (!t.defined()) input_error("network '{}': input {} ('{}') is undefined", name_, i, what);
    bool ok = t.ndim() == static_cast<int>(want.size());
    for (size_t d = 0; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == t.shape()[d];
    if (!ok) {
      input_error("network '{}': input {} ('{}') has shape {}, expected {}", name_, i, what,
                  shape_str(t.shape()), sym_shape_str(want));
    }
    if (t.dtype() != inputs_[i].dtype()) {
      input_error("network '{}': input {} ('{}') is {}, expected {}", name_, i, what,
                  dtype_name(t.dtype()), dtype_name(inputs_[i].dtype()));
    }
    if (t.device() != device_) {
      input_error("network '{}': input {} ('{}') is on {}, the network on {}", name_, i, what,
                  t.device().str(), device_.str());
    }
  }
  for (Layer* layer : layers_) {
    TNT_CHECK(layer->device() == device_,
              "network '{}' is on {} but its layer '{}' is on {} (moved by another network "
              "sharing it?); call to() on this network",
              name_, device_.str(), layer->name(), layer->device().str());
  }

  // Mixed precision (see set_compute_dtype): cdt between layers, f32 at the edges.
  const DType cdt = compute_dtype_;
  const bool mixed = cdt != DType::f32;
  const bool emulate = mixed && device_.is_cpu();  // CPU engines compute in f32
  if (mixed && device_.is_cuda()) refresh_compute_copies();

  const size_t n = nodes_.size();
  std::vector<std::vector<Tensor>> values(n);          // per node: its outputs, while needed
  std::vector<std::vector<int>> remaining = consumers_;  // per node output: uses still to run
  for (size_t i = 0; i < inputs_.size(); ++i) values[i] = {convert(inputs[i], DType::f32, cdt)};
  std::vector<Tensor> args;
  for (size_t i = inputs_.size(); i < n; ++i) {
    Layer* layer = nodes_[i]->layer;
    args.clear();
    for (const auto& [p, k] : node_inputs_[i]) args.push_back(values[p][static_cast<size_t>(k)]);
    saved_[i] = SavedState{};
    if (!input_gradients_) {
      // A layer fed only by the network's inputs (the first convolution on the images) need
      // not compute gradients that nobody asked for.
      bool only_inputs = true;
      for (const auto& [p, k] : node_inputs_[i]) only_inputs = only_inputs && p < inputs_.size();
      saved_[i].need_input_grads = !only_inputs;
    }
    if (emulate) {
      for (Tensor& a : args) a = convert(a, cdt, DType::f32);
    }
    std::vector<Tensor> outs = layer->forward(args, rc, saved_[i]);
    if (emulate) {
      for (Tensor& o : outs) o = convert(o, DType::f32, cdt);
    }
    TNT_CHECK(outs.size() == nodes_[i]->shapes.size(),
              "layer '{}' ({}) returned {} outputs, its call in network '{}' has {}", layer->name(),
              layer->type(), outs.size(), name_, nodes_[i]->shapes.size());
    args.clear();
    out_shapes_[i].clear();
    out_dtypes_[i].clear();
    for (const Tensor& t : outs) {
      out_shapes_[i].push_back(t.shape());
      out_dtypes_[i].push_back(t.dtype());
    }
    values[i] = std::move(outs);
    // Free activations nobody else needs (backward keeps what it needs in saved_).
    for (const auto& [p, k] : node_inputs_[i]) {
      const auto ku = static_cast<size_t>(k);
      if (--remaining[p][ku] == 0 && !pinned_[p][ku]) values[p][ku] = Tensor();
    }
    for (size_t k = 0; k < values[i].size(); ++k) {
      if (remaining[i][k] == 0 && !pinned_[i][k]) values[i][k] = Tensor();
    }
    if (!keep) saved_[i] = SavedState{};
  }
  have_saved_ = keep;

  std::vector<Tensor> result;
  for (size_t o = 0; o < outputs_.size(); ++o) {
    result.push_back(convert(values[output_node_[o]][static_cast<size_t>(outputs_[o].index)], cdt, DType::f32));
  }
  return result;
}

std::vector<Tensor> Network::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                      const GradientHook& hook) {
  prepare(nullptr);
  TNT_CHECK(have_saved_,
            "network '{}': backward() needs a forward() with rc.training (or keep_for_backward) "
            "just before it",
            name_);
  if (grad_outputs.size() != outputs_.size()) {
    input_error("network '{}' has {} outputs, backward() got {} gradients", name_, outputs_.size(),
                grad_outputs.size());
  }
  const size_t n = nodes_.size();
  std::vector<std::vector<Tensor>> grads(n);  // per node output: d(loss)/d(output), summed
  for (size_t i = 0; i < n; ++i) grads[i].resize(nodes_[i]->shapes.size());
  for (size_t o = 0; o < outputs_.size(); ++o) {
    if (!grad_outputs[o].defined()) continue;
    const size_t p = output_node_[o];
    const auto k = static_cast<size_t>(outputs_[o].index);
    const Shape& want = p < inputs_.size() ? grad_outputs[o].shape() : out_shapes_[p][k];
    if (grad_outputs[o].shape() != want) {
      input_error("network '{}': gradient {} has shape {}, output {} has {}", name_, o,
                  shape_str(grad_outputs[o].shape()), o, shape_str(want));
    }
    // The outputs were handed out as f32; inside, gradients travel in the compute dtype
    // (also for an output that is a network input, which forward() cast on entry).
    if (compute_dtype_ != DType::f32 && grad_outputs[o].dtype() != DType::f32) {
      input_error("network '{}': gradient {} is {}; a network in mixed precision takes f32 gradients for its outputs",
                  name_, o, grad_outputs[o].str());
    }
    const DType want_dtype = p < inputs_.size()
                                 ? (inputs_[p].dtype() == DType::f32 ? compute_dtype_ : inputs_[p].dtype())
                                 : out_dtypes_[p][k];
    accumulate(grads[p][k], convert(grad_outputs[o], DType::f32, want_dtype));
  }
  const DType cdt = compute_dtype_;
  const bool emulate = cdt != DType::f32 && device_.is_cpu();

  for (size_t i = n; i-- > inputs_.size();) {
    Layer* layer = nodes_[i]->layer;
    std::vector<Tensor>& g = grads[i];
    if (std::any_of(g.begin(), g.end(), [](const Tensor& t) { return t.defined(); })) {
      for (size_t k = 0; k < g.size(); ++k) {
        if (!g[k].defined()) g[k] = Tensor::zeros(out_shapes_[i][k], out_dtypes_[i][k], device_);
      }
      if (emulate) {
        for (Tensor& t : g) t = convert(t, cdt, DType::f32);
      }
      std::vector<Tensor> gin = layer->backward(g, rc, saved_[i]);
      TNT_CHECK(gin.size() == node_inputs_[i].size(),
                "layer '{}' ({}) returned {} input gradients for {} inputs", layer->name(),
                layer->type(), gin.size(), node_inputs_[i].size());
      if (emulate) {
        for (Tensor& t : gin) t = convert(t, DType::f32, cdt);
      }
      for (size_t j = 0; j < gin.size(); ++j) {
        if (!gin[j].defined()) continue;
        const auto& [p, k] = node_inputs_[i][j];
        accumulate(grads[p][static_cast<size_t>(k)], gin[j]);
      }
    }
    saved_[i] = SavedState{};
    g.clear();
    const size_t l = layer_of_node_[i];
    if (hook && first_node_of_layer_[l] == i) {
      // This was the layer's first call, hence its last backward: its gradients are final.
      const std::vector<Parameter*> params = layer->parameters();
      for (size_t q = 0; q < params.size(); ++q) {
        if (params[q]->trainable) hook(first_param_of_layer_[l] + q, *params[q]);
      }
    }
  }
  have_saved_ = false;

  std::vector<Tensor> input_grads;
  for (size_t i = 0; i < inputs_.size(); ++i) input_grads.push_back(convert(grads[i][0], cdt, DType::f32));
  return input_grads;
}

// ---------------------------------------------------------------------------------------
// Network: parameters, devices, summary

void Network::set_compute_dtype(DType dtype) {
  if (dtype != DType::f32 && !is_half(dtype)) {
    input_error("network '{}': compute dtype {} is not supported (f32, bf16 or f16)", name_, dtype_name(dtype));
  }
  compute_dtype_ = dtype;
  have_saved_ = false;  // a state saved in the other dtype must not meet this backward
  if (dtype == DType::f32) {  // free the copies (layers_ is empty until the graph exists)
    for (Layer* layer : layers_) {
      for (Parameter* p : layer->parameters()) p->compute = Tensor();
    }
  }
}

// The compute-dtype copies of the weights, from the f32 masters, before every forward: the
// optimizer may have changed the masters, and a cast of all of ResNet-50's weights costs
// about as much as one of its smaller convolutions.
void Network::refresh_compute_copies() {
  for (Layer* layer : layers_) {
    for (Parameter* p : layer->parameters()) {
      if (!p->cast_for_compute || p->value.dtype() == compute_dtype_) continue;
      if (!p->compute.defined() || p->compute.dtype() != compute_dtype_ || p->compute.shape() != p->value.shape() ||
          p->compute.device() != p->value.device()) {
        p->compute = Tensor::empty(p->value.shape(), compute_dtype_, p->value.device());
      }
      ops::copy_cast(p->value, p->compute);
    }
  }
}

void Network::zero_grad() {
  prepare(nullptr);
  for (Layer* layer : layers_) layer->zero_grad();
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
      r.shape += (k > 0 ? ", " : "") + sym_shape_str(node.shapes[k]);
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
