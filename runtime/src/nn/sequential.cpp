#include "tarantella/check.hpp"
#include "tarantella/graph.hpp"

namespace tnt {

Sequential::Sequential(std::string name) : Network(std::move(name)) {}

Sequential::Sequential(std::vector<LayerPtr> layers, std::string name) : Network(std::move(name)) {
  for (LayerPtr& layer : layers) add(std::move(layer));
}

Sequential& Sequential::add(LayerPtr layer) {
  TNT_INPUT_CHECK(layer != nullptr, "Sequential '{}': add() of a null layer", name());
  TNT_INPUT_CHECK(!has_graph(), "Sequential '{}': add() after the model was built (layer '{}'): add every layer "
                  "before build() or the first forward()", name(), layer->name());
  pending_.push_back(std::move(layer));
  return *this;
}

void Sequential::build(const Shape& per_sample_shape, DType dtype) {
  TNT_INPUT_CHECK(!has_graph(), "Sequential '{}' is already built (build() once, before training)", name());
  TNT_INPUT_CHECK(!pending_.empty(), "Sequential '{}' has no layers", name());
  SymTensor x = Input(per_sample_shape, dtype, "input");
  SymTensor y = x;
  for (const LayerPtr& layer : pending_) y = call(layer, y);
  set_graph({x}, {y}, true);
}

void Sequential::prepare(const std::vector<Tensor>* inputs) {
  if (has_graph()) return;
  if (inputs != nullptr && inputs->size() == 1 && (*inputs)[0].defined() && (*inputs)[0].ndim() >= 1) {
    const Tensor& x = (*inputs)[0];
    build(Shape(x.shape().begin() + 1, x.shape().end()), x.dtype());
    return;
  }
  TNT_INPUT_ERROR("Sequential '{}' is not built yet: call build(input shape) or forward() once", name());
}

}  // namespace tnt
