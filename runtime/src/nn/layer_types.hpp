// The built-in layer types that model files know (nn/serialize.cpp looks them up by the
// name their type() returns). Each layer's .cpp registers its own, next to the class:
//
//   namespace { const detail::LayerTypeRegistration kDense("Dense", dense_config, dense_from); }
//   namespace { const auto kReLU = detail::LayerTypeRegistration::plain<ReLU>("ReLU"); }
//
// Registration runs while libtarantella (a shared library, so no object of it is dropped)
// is loaded, before main; the table is a function-local static, made by the first
// registration whichever file's runs first.
#pragma once

#include "tarantella/check.hpp"
#include "tarantella/layer.hpp"
#include "tarantella/layer_config.hpp"

#include <map>
#include <memory>
#include <string>

namespace tnt::detail {

struct LayerTypeFunctions {
  LayerToConfig to_config;
  LayerFromConfig from_config;
};

// Every built-in type by name.
const std::map<std::string, LayerTypeFunctions>& builtin_layer_types();

class LayerTypeRegistration {
 public:
  // Two registrations of one type name are a programming error (thrown at load time).
  LayerTypeRegistration(const char* type, LayerToConfig to_config, LayerFromConfig from_config);

  // A type whose constructor takes only the name.
  template <typename L>
  static LayerTypeRegistration plain(const char* type) {
    return {type, [](const Layer&) { return LayerConfig(); },
            [](const std::string& name, const LayerConfig&) -> LayerPtr { return std::make_shared<L>(name); }};
  }
};

// The layer as its registered type (a layer whose type() names a type it is not: an error).
template <typename L>
const L& layer_as(const Layer& layer) {
  const L* l = dynamic_cast<const L*>(&layer);
  TNT_CHECK(l != nullptr, "layer '{}' says its type is {} but is not one", layer.name(), layer.type());
  return *l;
}

}  // namespace tnt::detail
