// Backward per layer on the timeline, from the gradient hook: the training step's layer-aware
// spans over the event recording of core/timeline_events.hpp.
#pragma once

#include "core/clock.hpp"
#include "core/timeline_events.hpp"
#include "tarantella/layer.hpp"

#include <string>
#include <vector>

namespace tnt::timeline {

// The span of a layer ends when its gradients are final and starts where the previous one
// ended (so it includes the parameter-free layers before it, in backward order). params: the
// hook's indices' parameters, named "<layer>.<param>".
class LayerSpans {
 public:
  explicit LayerSpans(const std::vector<NamedParameter>* params) : recorder_(active()), params_(params) {
    if (recorder_) {
      last_ = detail::now_s();
      last_device_ = recorder_->device_mark();
    }
  }
  ~LayerSpans();
  LayerSpans(const LayerSpans&) = delete;
  LayerSpans& operator=(const LayerSpans&) = delete;
  void gradient_ready(size_t index) {
    if (recorder_) mark(index);
  }

 private:
  void mark(size_t index);
  Events* recorder_;
  const std::vector<NamedParameter>* params_;
  std::string last_layer_;
  double last_ = 0;
  void* last_device_ = nullptr;  // where the next layer's GPU span begins
};

}  // namespace tnt::timeline
