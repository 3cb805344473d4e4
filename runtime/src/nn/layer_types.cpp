#include "nn/layer_types.hpp"

namespace tnt::detail {

namespace {
std::map<std::string, LayerTypeFunctions>& table() {
  static std::map<std::string, LayerTypeFunctions> types;
  return types;
}
}  // namespace

const std::map<std::string, LayerTypeFunctions>& builtin_layer_types() { return table(); }

LayerTypeRegistration::LayerTypeRegistration(const char* type, LayerToConfig to_config, LayerFromConfig from_config) {
  const bool inserted = table().emplace(type, LayerTypeFunctions{std::move(to_config), std::move(from_config)}).second;
  TNT_CHECK(inserted, "the layer type '{}' is registered twice", type);
}

}  // namespace tnt::detail
