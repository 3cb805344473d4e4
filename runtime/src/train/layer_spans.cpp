#include "train/layer_spans.hpp"

#include <fmt/format.h>

namespace tnt::timeline {

LayerSpans::~LayerSpans() {
  if (recorder_ && last_device_) recorder_->device_span(Lane::gpu_compute, {}, last_device_, nullptr, {});
}

void LayerSpans::mark(size_t index) {
  const std::string& full = (*params_)[index].name;
  std::string layer = full.substr(0, full.rfind('.'));
  if (layer == last_layer_) return;  // the layer's next parameter: the same moment
  const double now = detail::now_s();
  std::string args = fmt::format(R"("layer":"{}")", escape(layer));
  if (last_device_) {
    // Two events a layer: one span's end and the next one's begin are each the pool's.
    recorder_->device_span(Lane::gpu_compute, "backward " + layer, last_device_, recorder_->device_mark(), args);
    last_device_ = recorder_->device_mark();
  }
  recorder_->add(Lane::compute, "backward " + layer, "backward", last_, now, std::move(args));
  last_layer_ = std::move(layer);
  last_ = now;
}

}  // namespace tnt::timeline
