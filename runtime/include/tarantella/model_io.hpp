// Whole-model files: the architecture (every layer's configuration and the graph that
// connects them) and the weights in ONE safetensors file, so a program can load a network
// without the code that built it (Keras' model.save / load_model).
//
//   tnt::save_model(model, "run/model.safetensors");           // collective; the master writes
//   auto loaded = tnt::load_model("run/model.safetensors", 42);  // every rank reads
//   loaded->compile(...);  loaded->fit(...);  loaded->predict(...);
//
// The tensors are those of Model::save_weights (PyTorch names and layouts, parameters then
// buffers), so Model::load_weights and PyTorch's safetensors loader read the file as they
// read a weights file. The architecture is JSON text in the header's "__metadata__" under
// "architecture" (docs/model_files.md describes it and its format_version). Optimizer state
// and the training position are not saved: that is what checkpoints are for (Model::
// save_checkpoint). Sequential and functional networks of registered layer types are
// supported: a layer called at several places, residual Adds, several inputs and outputs.
//
// Layer types: every built-in layer is registered. A program's own layer type is saved and
// loaded once it is registered with register_layer_type (after tnt::init, before the save
// or load); a network with an unregistered type is an InputError naming the layer and the
// type.
#pragma once

#include "tarantella/graph.hpp"
#include "tarantella/initializers.hpp"
#include "tarantella/layer.hpp"
#include "tarantella/model.hpp"

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

// Collective (every rank calls it): the master writes the file atomically and every rank
// learns whether it worked (a failure throws on every rank). Refuses (tnt::Error on every
// rank, the file left as it was) when a tensor holds a NaN or an infinity, as save_weights.
void save_model(Network& network, const std::string& path);
void save_model(Model& model, const std::string& path);

// Every rank reads the file. load_network: the network with the file's weights, on the CPU.
// Wrapping it in a Model would lose them (Model's constructor draws fresh weights from its
// seed); load_model makes the Model (seed: the run's seed, which keys Dropout masks) and
// then puts the file's weights back. Compile it to fit or evaluate; predict needs nothing.
// A file that is not a model file (truncated, a weights-only file, an unknown layer type, a
// newer format_version, missing or extra tensors, JSON that is not an architecture) is an
// InputError naming the file and the problem.
std::shared_ptr<Network> load_network(const std::string& path);
std::unique_ptr<Model> load_model(const std::string& path, uint64_t seed = 0);

}  // namespace tnt
