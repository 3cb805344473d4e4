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

#include "tarantella/layer_config.hpp"
#include "tarantella/model.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace tnt {

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
