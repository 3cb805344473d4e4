// Whole-model files (tarantella/model_io.hpp): a safetensors file whose tensors are the
// network's parameters and buffers under their full names (what Model::save_weights writes)
// and whose metadata holds the architecture (nn/serialize.cpp) under "architecture".
// Saving is collective as Model's saves are: the master writes atomically (write_safetensors)
// and broadcasts the outcome, so a failure ends the job on every rank and no rank waits.
#include "tarantella/model_io.hpp"

#include "nn/serialize.hpp"
#include "tarantella/checkpoint.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/model.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/format.h>

namespace tnt {

namespace {

NamedTensors weights_of(Network& network) {
  NamedTensors out;
  for (const NamedParameter& p : network.named_parameters()) out.emplace_back(p.name, p.param->value);
  for (const NamedParameter& b : network.named_buffers()) out.emplace_back(b.name, b.param->value);
  return out;
}

// The outcome of the master's write, as every rank learns it: "" when the file was written,
// else a kind letter (I: the user's input, such as a directory that does not exist; E:
// anything else) and the message, so that every rank throws the same exception type.
std::string write_file(const std::string& path, const NamedTensors& tensors, const std::string& architecture) {
  try {
    // A diverged network is not written: its file would replace a good one with one that
    // cannot be used.
    for (const auto& [name, tensor] : tensors) {
      if (ops::has_non_finite(tensor)) {
        return fmt::format("Erefusing to write model file '{}': '{}' holds a NaN or an infinity (the training "
                           "diverged); the file there, if any, is left as it was",
                           path, name);
      }
    }
    write_safetensors(path, tensors, {{checkpoint_key::format, "pt"}, {detail::kArchitectureKey, architecture}});
  } catch (const InputError& e) {
    return fmt::format("Iwriting model file '{}' failed: {}", path, e.what());
  } catch (const std::exception& e) {
    return fmt::format("Ewriting model file '{}' on the master failed: {}", path,
                       *e.what() ? e.what() : "unknown error");
  }
  return "";
}

void throw_failure(const std::string& failure) {
  if (failure.empty()) return;
  if (failure[0] == 'I') throw InputError(failure.substr(1));
  throw Error(failure.substr(1));
}

// The network described by the file, with fresh weights; ck holds the file's tensors.
std::shared_ptr<Network> network_of(const Checkpoint& ck, const std::string& path) {
  const std::string source = fmt::format("model file '{}'", path);
  TNT_INPUT_CHECK(ck.has_metadata(detail::kArchitectureKey),
                  "{} has no architecture (no metadata '{}'): it holds weights only; build the network in code "
                  "and use Model::load_weights, or save it with tnt::save_model",
                  source, detail::kArchitectureKey);
  return detail::network_from_architecture(ck.metadata(detail::kArchitectureKey), source);
}

// Every tensor of the network from the file, and nothing else in the file (load_into names
// the file and every missing, extra or mismatched tensor).
void load_weights_into(Network& network, const Checkpoint& ck) {
  LoadOptions lo;
  lo.kind = "model file";
  ck.load_into(weights_of(network), lo);
}

}  // namespace

void save_model(Network& network, const std::string& path) {
  // Every rank describes the network, so that an unregistered layer type throws on every
  // rank before any collective.
  const std::string architecture = model_to_json(network);
  const NamedTensors tensors = weights_of(network);
  if (!initialized()) {  // one process without the runtime: nobody to tell
    throw_failure(write_file(path, tensors, architecture));
    return;
  }
  std::string failure;
  if (is_master_rank()) failure = write_file(path, tensors, architecture);
  communicator().broadcast(failure, master_rank());
  throw_failure(failure);
}

void save_model(Model& model, const std::string& path) { save_model(model.network(), path); }

std::shared_ptr<Network> load_network(const std::string& path) {
  const Checkpoint ck = Checkpoint::read(path);
  std::shared_ptr<Network> network = network_of(ck, path);
  load_weights_into(*network, ck);
  return network;
}

std::unique_ptr<Model> load_model(const std::string& path, uint64_t seed) {
  const Checkpoint ck = Checkpoint::read(path);
  auto model = std::make_unique<Model>(network_of(ck, path), seed);
  // After the constructor, which drew fresh weights from the seed.
  load_weights_into(model->network(), ck);
  return model;
}

}  // namespace tnt
