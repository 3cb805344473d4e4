// A network's architecture as JSON (docs/model_files.md) and back: every layer's type, name
// and configuration, and the graph as a list of nodes in an order where each comes after its
// inputs. A network made from it has the same layer names, hence the same parameter names,
// and the same structure, hence the same order of nodes and layers (graph.hpp: the order
// depends only on the structure): its weights load by name and it computes what the
// original computed, bit for bit.
//
// Layer types live in two tables: the built-in ones below (constant), and the program's own,
// registered at run time, in the runtime context (the one mutable global).
#include "nn/serialize.hpp"

#include "core/context.hpp"
#include "nn/graph_node.hpp"
#include "tarantella/check.hpp"
#include "nn/layer_types.hpp"
#include "tarantella/layer_config.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

namespace tnt {

using json = nlohmann::json;

namespace detail {

struct LayerTypeRegistry {
  std::map<std::string, LayerTypeFunctions> types;
};

}  // namespace detail

namespace {

using detail::GraphNode;
using detail::LayerTypeFunctions;

// ---- LayerConfig values <-> JSON ----

struct InitializerName {
  Initializer::Kind kind;
  const char* name;
};

constexpr InitializerName kInitializerNames[] = {
    {Initializer::Kind::zeros, "zeros"},
    {Initializer::Kind::ones, "ones"},
    {Initializer::Kind::constant, "constant"},
    {Initializer::Kind::uniform, "uniform"},
    {Initializer::Kind::normal, "normal"},
    {Initializer::Kind::truncated_normal, "truncated_normal"},
    {Initializer::Kind::glorot_uniform, "glorot_uniform"},
    {Initializer::Kind::glorot_normal, "glorot_normal"},
    {Initializer::Kind::he_uniform, "he_uniform"},
    {Initializer::Kind::he_normal, "he_normal"},
};

const char* initializer_name(Initializer::Kind kind) {
  for (const auto& n : kInitializerNames) {
    if (n.kind == kind) return n.name;
  }
  TNT_THROW("initializer kind {} has no name", static_cast<int>(kind));
}

json value_to_json(const LayerConfig::Value& value) {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* d = std::get_if<double>(&value)) {
    TNT_INPUT_CHECK(std::isfinite(*d), "a configuration value {} is not finite (JSON has no such number)", *d);
    return *d;
  }
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&value)) return *v;
  const Initializer& init = std::get<Initializer>(value);
  return json{{"initializer", initializer_name(init.kind)}, {"a", init.a}, {"b", init.b}};
}

double number_of(const json& j, const std::string& where) {
  TNT_INPUT_CHECK(j.is_number(), "{} is not a number", where);
  return j.get<double>();
}

LayerConfig::Value value_from_json(const json& j, const std::string& where) {
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) {
    TNT_INPUT_CHECK(!j.is_number_unsigned() || j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
                    "{} = {} does not fit a 64-bit integer", where, j.dump());
    return j.get<int64_t>();
  }
  if (j.is_number_float()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  if (j.is_array()) {
    std::vector<int64_t> ints;
    for (const json& e : j) {
      TNT_INPUT_CHECK(e.is_number_integer(), "{} is a list that is not of integers", where);
      ints.push_back(e.get<int64_t>());
    }
    return ints;
  }
  if (j.is_object() && j.contains("initializer")) {
    const json& name = j["initializer"];
    TNT_INPUT_CHECK(name.is_string(), "{}: 'initializer' is not a string", where);
    for (const auto& n : kInitializerNames) {
      if (name.get<std::string>() == n.name) {
        Initializer init;
        init.kind = n.kind;
        if (j.contains("a")) init.a = number_of(j["a"], where + ".a");
        if (j.contains("b")) init.b = number_of(j["b"], where + ".b");
        return init;
      }
    }
    TNT_INPUT_ERROR("{}: unknown initializer '{}'", where, name.get<std::string>());
  }
  TNT_INPUT_ERROR("{} = {} is not a configuration value (a boolean, number, string, integer list or initializer)",
                  where, j.dump());
}

detail::LayerTypeRegistry* custom_types() {
  RuntimeContext* ctx = context_or_null();
  return ctx != nullptr ? ctx->layer_types.get() : nullptr;
}

const LayerTypeFunctions& find_type(const std::string& type, const std::string& name) {
  const auto& builtin = detail::builtin_layer_types();
  if (auto it = builtin.find(type); it != builtin.end()) return it->second;
  if (detail::LayerTypeRegistry* r = custom_types()) {
    auto it = r->types.find(type);
    if (it != r->types.end()) return it->second;
  }
  TNT_INPUT_ERROR(
      "layer '{}' is of type '{}', which model files do not know: register it with "
      "tnt::register_layer_type(\"{}\", to_config, from_config) (tarantella/model_io.hpp) before saving or loading",
      name, type, type);
}

// ---- network -> JSON ----

// Inputs first, in their order, then a post-order walk from each output: every node after
// its inputs.
std::vector<const GraphNode*> ordered_nodes(Network& net) {
  std::vector<const GraphNode*> order;
  std::unordered_set<const GraphNode*> seen;
  for (const SymTensor& in : net.inputs()) {
    order.push_back(in.node.get());
    seen.insert(in.node.get());
  }
  for (const SymTensor& out : net.outputs()) {
    std::vector<std::pair<const GraphNode*, size_t>> stack;
    if (seen.insert(out.node.get()).second) stack.emplace_back(out.node.get(), 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        const GraphNode* child = node->inputs[next++].node.get();
        if (seen.insert(child).second) stack.emplace_back(child, 0);
      } else {
        order.push_back(node);
        stack.pop_back();
      }
    }
  }
  return order;
}

json architecture_of(Network& net) {
  bool sequential = false;
  if (auto* seq = dynamic_cast<Sequential*>(&net)) {
    TNT_INPUT_CHECK(seq->is_built(),
                    "Sequential '{}' is not built: call build(input shape) or run it once before saving it",
                    net.name());
    sequential = true;
  }
  json layers = json::array();
  for (Layer* layer : net.layers()) {
    const LayerTypeFunctions& t = find_type(layer->type(), layer->name());
    const LayerConfig values = t.to_config(*layer);
    json config = json::object();
    for (const auto& [key, value] : values.values()) config[key] = value_to_json(value);
    layers.push_back({{"name", layer->name()}, {"type", layer->type()}, {"config", std::move(config)}});
  }

  const std::vector<const GraphNode*> order = ordered_nodes(net);
  std::unordered_map<const GraphNode*, size_t> index;
  for (size_t i = 0; i < order.size(); ++i) index[order[i]] = i;
  auto ref = [&](const SymTensor& t) { return json::array({index.at(t.node.get()), t.index}); };
  json nodes = json::array();
  for (const GraphNode* n : order) {
    if (n->layer == nullptr) {
      const Shape& s = n->shapes.at(0);  // (-1, per-sample dims...)
      nodes.push_back({{"input", n->input_name},
                       {"shape", std::vector<int64_t>(s.begin() + 1, s.end())},
                       {"dtype", dtype_name(n->dtypes.at(0))}});
    } else {
      json inputs = json::array();
      for (const SymTensor& in : n->inputs) inputs.push_back(ref(in));
      nodes.push_back({{"layer", n->layer->name()}, {"inputs", std::move(inputs)}});
    }
  }
  json inputs = json::array(), outputs = json::array(), frozen = json::array();
  for (const SymTensor& in : net.inputs()) inputs.push_back(index.at(in.node.get()));
  for (const SymTensor& out : net.outputs()) outputs.push_back(ref(out));
  for (const NamedParameter& p : net.named_parameters()) {
    if (!p.param->trainable) frozen.push_back(p.name);
  }
  return {{"format", "tarantella.model"},
          {"format_version", detail::kModelFormatVersion},
          {"class", sequential ? "Sequential" : "Network"},
          {"name", net.name()},
          {"layers", std::move(layers)},
          {"nodes", std::move(nodes)},
          {"inputs", std::move(inputs)},
          {"outputs", std::move(outputs)},
          {"frozen", std::move(frozen)}};
}

// ---- JSON -> network ----

const json& member(const json& obj, const char* key, const std::string& where) {
  TNT_INPUT_CHECK(obj.is_object(), "{} is not a JSON object", where);
  auto it = obj.find(key);
  TNT_INPUT_CHECK(it != obj.end(), "{} has no '{}'", where, key);
  return *it;
}

const std::string& string_member(const json& obj, const char* key, const std::string& where) {
  const json& v = member(obj, key, where);
  TNT_INPUT_CHECK(v.is_string(), "{}.{} is not a string", where, key);
  return v.get_ref<const std::string&>();
}

const json& array_member(const json& obj, const char* key, const std::string& where) {
  const json& v = member(obj, key, where);
  TNT_INPUT_CHECK(v.is_array(), "{}.{} is not a list", where, key);
  return v;
}

// what: "a node before this one".
int64_t index_in(const json& v, size_t limit, const std::string& where, const char* what) {
  TNT_INPUT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && static_cast<size_t>(v.get<int64_t>()) < limit,
                  "{} = {} is not {} (an index below {})", where, v.dump(), what, limit);
  return v.get<int64_t>();
}

LayerPtr make_layer(const json& entry, const std::string& where) {
  const std::string& name = string_member(entry, "name", where);
  const std::string& type = string_member(entry, "type", where);
  TNT_INPUT_CHECK(!name.empty(), "{}.name is empty", where);
  const json& config_json = member(entry, "config", where);
  TNT_INPUT_CHECK(config_json.is_object(), "{}.config is not a JSON object", where);
  const LayerTypeFunctions& t = find_type(type, name);
  const std::string context = fmt::format("layer '{}' ({})", name, type);
  LayerConfig config(context);
  for (const auto& item : config_json.items()) {
    config.set(item.key(), value_from_json(item.value(), fmt::format("{}: config '{}'", context, item.key())));
  }
  LayerPtr layer;
  try {
    layer = t.from_config(name, config);
  } catch (const InputError& e) {
    // The configuration's own errors name the layer already; a constructor's (Dense with
    // units -4) name its settings only.
    if (std::string(e.what()).find(context) != std::string::npos) throw;
    TNT_INPUT_ERROR("{} cannot be made from its configuration {}: {}", context, config_json.dump(), e.what());
  } catch (const std::exception& e) {
    TNT_INPUT_ERROR("{} cannot be made from its configuration {}: {}", context, config_json.dump(), e.what());
  }
  TNT_INPUT_CHECK(layer != nullptr && layer->type() == type && layer->name() == name,
                  "{}: the from_config registered for type '{}' made {} (it must make a layer of that type and "
                  "name)",
                  context, type, layer ? fmt::format("'{}' ({})", layer->name(), layer->type()) : "nothing");
  return layer;
}

// The outputs of each node so far, as symbolic tensors.
using NodeOutputs = std::vector<std::vector<SymTensor>>;

SymTensor output_ref(const json& ref, const NodeOutputs& made, const std::string& where) {
  TNT_INPUT_CHECK(ref.is_array() && ref.size() == 2, "{} is not a [node, output] pair", where);
  const auto node = static_cast<size_t>(index_in(ref[0], made.size(), where + "[0]", "a node before this one"));
  const auto out = static_cast<size_t>(index_in(ref[1], made[node].size(), where + "[1]", "an output of that node"));
  return made[node][out];
}

SymTensor make_input(const json& node, const std::string& where) {
  const std::string& name = string_member(node, "input", where);
  const json& shape = array_member(node, "shape", where);
  Shape per_sample;
  for (const json& d : shape) {
    TNT_INPUT_CHECK(d.is_number_integer() && d.get<int64_t>() > 0, "{}.shape {} is not a list of positive sizes",
                    where, shape.dump());
    per_sample.push_back(d.get<int64_t>());
  }
  return Input(per_sample, dtype_from_name(string_member(node, "dtype", where)), name);
}

std::shared_ptr<Network> make_network(const json& arch) {
  TNT_INPUT_CHECK(arch.is_object(), "the architecture is not a JSON object");
  TNT_INPUT_CHECK(arch.contains("format") && arch.at("format") == "tarantella.model",
                  "the JSON is not a tarantella model architecture (no \"format\": \"tarantella.model\")");
  const json& version = member(arch, "format_version", "the architecture");
  TNT_INPUT_CHECK(version.is_number_integer() && version.get<int64_t>() >= 1,
                  "format_version {} is not a positive integer", version.dump());
  TNT_INPUT_CHECK(version.get<int64_t>() <= detail::kModelFormatVersion,
                  "format_version {} is newer than this tarantella reads (up to {}): load it with a newer tarantella",
                  version.get<int64_t>(), detail::kModelFormatVersion);
  const std::string& cls = string_member(arch, "class", "the architecture");
  TNT_INPUT_CHECK(cls == "Sequential" || cls == "Network", "class '{}' is neither Sequential nor Network", cls);
  const std::string& net_name = string_member(arch, "name", "the architecture");

  std::map<std::string, LayerPtr> layers;
  std::vector<std::string> layer_order;
  const json& layer_list = array_member(arch, "layers", "the architecture");
  for (size_t i = 0; i < layer_list.size(); ++i) {
    LayerPtr layer = make_layer(layer_list[i], fmt::format("layers[{}]", i));
    TNT_INPUT_CHECK(layers.emplace(layer->name(), layer).second, "layers[{}]: a second layer named '{}'", i,
                    layer->name());
    layer_order.push_back(layer->name());
  }

  const json& node_list = array_member(arch, "nodes", "the architecture");
  NodeOutputs made;
  std::vector<LayerPtr> chain;  // a Sequential's layers, in node order
  std::set<std::string> called;
  for (size_t i = 0; i < node_list.size(); ++i) {
    const std::string where = fmt::format("nodes[{}]", i);
    const json& node = node_list[i];
    TNT_INPUT_CHECK(node.is_object() && (node.contains("input") != node.contains("layer")),
                    "{} is neither an input ({{\"input\": ...}}) nor a layer call ({{\"layer\": ...}})", where);
    if (node.contains("input")) {
      made.push_back({make_input(node, where)});
      continue;
    }
    const std::string& name = string_member(node, "layer", where);
    auto it = layers.find(name);
    TNT_INPUT_CHECK(it != layers.end(), "{} calls layer '{}', which is not among the layers", where, name);
    const json& refs = array_member(node, "inputs", where);
    TNT_INPUT_CHECK(!refs.empty(), "{} calls layer '{}' on no inputs", where, name);
    std::vector<SymTensor> inputs;
    for (size_t k = 0; k < refs.size(); ++k) {
      inputs.push_back(output_ref(refs[k], made, fmt::format("{}.inputs[{}]", where, k)));
    }
    try {
      made.push_back(call(it->second, inputs));
    } catch (const Error& e) {
      // A shape check's InputError (Add of two shapes) names the layer, not the file's node.
      if (dynamic_cast<const InputError*>(&e) && std::string(e.what()).find(where) != std::string::npos) throw;
      TNT_INPUT_ERROR("{}: layer '{}' ({}) does not accept its inputs: {}", where, name, it->second->type(), e.what());
    }
    chain.push_back(it->second);
    called.insert(name);
  }
  for (const std::string& name : layer_order) {
    TNT_INPUT_CHECK(called.count(name), "layer '{}' is never called in the nodes", name);
  }

  std::vector<SymTensor> inputs, outputs;
  const json& input_list = array_member(arch, "inputs", "the architecture");
  for (size_t i = 0; i < input_list.size(); ++i) {
    const std::string where = fmt::format("inputs[{}]", i);
    const auto n = static_cast<size_t>(index_in(input_list[i], made.size(), where, "a node"));
    TNT_INPUT_CHECK(node_list[n].contains("input"), "{} = {} is not an input node", where, n);
    inputs.push_back(made[n][0]);
  }
  const json& output_list = array_member(arch, "outputs", "the architecture");
  for (size_t i = 0; i < output_list.size(); ++i) {
    outputs.push_back(output_ref(output_list[i], made, fmt::format("outputs[{}]", i)));
  }

  std::shared_ptr<Network> net;
  if (cls == "Sequential") {
    // A chain: one input, each node fed by the one before, the last one the output.
    bool chain_ok = node_list.size() >= 2 && node_list[0].contains("input") && input_list.size() == 1 &&
                    input_list[0] == 0 && output_list.size() == 1 &&
                    output_list[0] == json::array({node_list.size() - 1, 0});
    for (size_t i = 1; chain_ok && i < node_list.size(); ++i) {
      chain_ok = node_list[i].contains("layer") && node_list[i].at("inputs") == json::array({json::array({i - 1, 0})});
    }
    TNT_INPUT_CHECK(chain_ok, "class Sequential, but the nodes are not one chain from one input to one output");
    auto seq = std::make_shared<Sequential>(chain, net_name);
    const SymTensor& in = made[0][0];
    seq->build(Shape(in.shape().begin() + 1, in.shape().end()), in.dtype());
    net = seq;
  } else {
    net = std::make_shared<Network>(inputs, outputs, net_name);
  }

  const json& frozen = array_member(arch, "frozen", "the architecture");
  std::map<std::string, Parameter*> params;
  for (const NamedParameter& p : net->named_parameters()) params[p.name] = p.param;
  for (size_t i = 0; i < frozen.size(); ++i) {
    TNT_INPUT_CHECK(frozen[i].is_string() && params.count(frozen[i].get<std::string>()),
                    "frozen[{}] = {} is not a parameter of the network", i, frozen[i].dump());
    params[frozen[i].get<std::string>()]->trainable = false;
  }
  return net;
}

}  // namespace

// ---- LayerConfig ----

const LayerConfig::Value& LayerConfig::at(const std::string& key, const char* kind) const {
  auto it = values_.find(key);
  TNT_INPUT_CHECK(it != values_.end(), "{}: config '{}' ({}) is missing", context_, key, kind);
  return it->second;
}

namespace {
template <typename T>
const T& typed(const LayerConfig::Value& v, const std::string& context, const std::string& key, const char* kind) {
  const T* p = std::get_if<T>(&v);
  TNT_INPUT_CHECK(p != nullptr, "{}: config '{}' = {} is not {}", context, key, value_to_json(v).dump(), kind);
  return *p;
}
}  // namespace

bool LayerConfig::get_bool(const std::string& key) const {
  return typed<bool>(at(key, "a boolean"), context_, key, "a boolean");
}

int64_t LayerConfig::get_int(const std::string& key) const {
  return typed<int64_t>(at(key, "an integer"), context_, key, "an integer");
}

double LayerConfig::get_double(const std::string& key) const {
  const Value& v = at(key, "a number");
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return typed<double>(v, context_, key, "a number");
}

const std::string& LayerConfig::get_string(const std::string& key) const {
  return typed<std::string>(at(key, "a string"), context_, key, "a string");
}

const std::vector<int64_t>& LayerConfig::get_ints(const std::string& key) const {
  return typed<std::vector<int64_t>>(at(key, "an integer list"), context_, key, "an integer list");
}

Initializer LayerConfig::get_initializer(const std::string& key) const {
  return typed<Initializer>(at(key, "an initializer"), context_, key, "an initializer");
}

// ---- public functions ----

void register_layer_type(const std::string& type, LayerToConfig to_config, LayerFromConfig from_config) {
  TNT_INPUT_CHECK(!type.empty(), "register_layer_type: the type name is empty");
  TNT_INPUT_CHECK(to_config && from_config, "register_layer_type(\"{}\"): to_config and from_config must be given",
                  type);
  TNT_INPUT_CHECK(detail::builtin_layer_types().count(type) == 0,
                  "register_layer_type(\"{}\"): '{}' is a built-in layer type and cannot be replaced", type, type);
  RuntimeContext* ctx = context_or_null();
  TNT_CHECK(ctx != nullptr, "register_layer_type(\"{}\"): tarantella is not initialised: call tnt::init() first", type);
  if (!ctx->layer_types) ctx->layer_types = std::make_shared<detail::LayerTypeRegistry>();
  ctx->layer_types->types[type] = {std::move(to_config), std::move(from_config)};
}

bool layer_type_registered(const std::string& type) {
  if (detail::builtin_layer_types().count(type) != 0) return true;
  detail::LayerTypeRegistry* r = custom_types();
  return r != nullptr && r->types.count(type) != 0;
}

std::string model_to_json(Network& network) { return architecture_of(network).dump(); }

std::shared_ptr<Network> model_from_json(const std::string& json_text) {
  return detail::network_from_architecture(json_text, "model JSON");
}

std::shared_ptr<Network> detail::network_from_architecture(const std::string& json_text, const std::string& source) {
  json arch;
  try {
    arch = json::parse(json_text);
  } catch (const json::exception& e) {
    TNT_INPUT_ERROR("{}: the architecture is not valid JSON: {}", source, e.what());
  }
  try {
    return make_network(arch);
  } catch (const std::exception& e) {
    // Every problem of a file is the file's: an InputError that names it, whatever part of
    // the runtime noticed it (a layer's constructor, the graph, the JSON library).
    TNT_INPUT_ERROR("{}: {}", source, e.what());
  }
}

}  // namespace tnt
