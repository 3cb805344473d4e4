// Private to the runtime: a network's architecture as JSON text and back (nn/serialize.cpp),
// for model files (train/model_file.cpp). docs/model_files.md describes the JSON.
#pragma once

#include "tarantella/graph.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace tnt::detail {

// The version written; a reader takes files up to it. Raise it when a reader of the previous
// version would misread a new file (not when a field is only added).
inline constexpr int64_t kModelFormatVersion = 1;

// The metadata key of a model file that holds the architecture.
inline constexpr const char* kArchitectureKey = "architecture";

// Every error is an InputError that starts with `source` ("model file 'x.safetensors'").
std::shared_ptr<Network> network_from_architecture(const std::string& json_text, const std::string& source);

}  // namespace tnt::detail
