// A layer's configuration by name, the registry of layer types by the name their type()
// returns, and the architecture as JSON: what a model file (tarantella/model_io.hpp) is made
// of, on the floor of the graph (nn/), below the Model.
//
// Layer types: every built-in layer is registered. A program's own layer type is saved and
// loaded once it is registered with register_layer_type (after tnt::init, before the save
// or load); a network with an unregistered type is an InputError naming the layer and the
// type.
#pragma once

#include "tarantella/graph.hpp"
#include "tarantella/initializers.hpp"
#include "tarantella/layer.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace tnt {

// A layer's configuration: its constructor's arguments by name (the name of the layer itself
// is kept apart). Values are booleans, integers, floating numbers, strings, integer lists or
// initialisers. The get_* of a missing key or of a value of another kind throw InputError
// naming the key and the context (the loader sets it to the file and the layer).
class LayerConfig {
 public:
  using Value = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, Initializer>;

  explicit LayerConfig(std::string context = "layer configuration") : context_(std::move(context)) {}

  void set_bool(const std::string& key, bool value) { values_[key] = value; }
  void set_int(const std::string& key, int64_t value) { values_[key] = value; }
  void set_double(const std::string& key, double value) { values_[key] = value; }
  void set_string(const std::string& key, std::string value) { values_[key] = std::move(value); }
  void set_ints(const std::string& key, std::vector<int64_t> value) { values_[key] = std::move(value); }
  void set_initializer(const std::string& key, Initializer value) { values_[key] = value; }
  void set(const std::string& key, Value value) { values_[key] = std::move(value); }

  bool has(const std::string& key) const { return values_.count(key) != 0; }
  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;  // an integer value is taken as well
  const std::string& get_string(const std::string& key) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;
  Initializer get_initializer(const std::string& key) const;

  const std::map<std::string, Value>& values() const { return values_; }
  const std::string& context() const { return context_; }

 private:
  const Value& at(const std::string& key, const char* kind) const;

  std::map<std::string, Value> values_;
  std::string context_;
};

// to_config reads a layer's configuration (the layer is of the registered type); from_config
// makes a new layer of that type with this name and configuration (unbuilt: the graph builds
// it, and the file's weights are then copied in).
using LayerToConfig = std::function<LayerConfig(const Layer& layer)>;
using LayerFromConfig = std::function<LayerPtr(const std::string& name, const LayerConfig& config)>;

// Registers a type of layer by the name its type() returns (again: replaces the functions).
// The built-in types cannot be replaced. Needs tnt::init (registrations live in the runtime
// context, until tnt::finalize); not thread-safe: register at the start of the program, on
// every rank that saves or loads.
void register_layer_type(const std::string& type, LayerToConfig to_config, LayerFromConfig from_config);
bool layer_type_registered(const std::string& type);

// The architecture as JSON text (what a model file's metadata holds), and a network made
// from it with fresh weights (from the layers' initialisers, seed 0, as a network built in
// code). The network must be built (a Sequential: build() or one forward).
std::string model_to_json(Network& network);
std::shared_ptr<Network> model_from_json(const std::string& json);

}  // namespace tnt
