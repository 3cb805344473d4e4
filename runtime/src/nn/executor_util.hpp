// Private to runtime/src/nn: what the executor (executor.cpp) and the fused chains
// (fusion.cpp) do alike at the edges of a layer call.
#pragma once

#include "tarantella/layer.hpp"
#include "tarantella/ops.hpp"

namespace tnt::detail {

// slot += grad, both ending in `format` (that of the tensor they are the gradient of).
inline void accumulate(Tensor& slot, const Tensor& grad, MemoryFormat format) {
  // Out of place: grad may be the caller's tensor or a view (Flatten) of another gradient.
  // to_memory_format shares what is already in format; ops::add makes a new tensor.
  const Tensor g = grad.to_memory_format(format);
  slot = slot.defined() ? ops::add(slot.to_memory_format(format), g) : g;
}

// What a layer gets: t itself when the layer takes its format, else a contiguous copy.
inline Tensor for_layer(const Layer& layer, const Tensor& t) {
  if (!t.defined() || !t.is_channels_last() || layer.supports_memory_format(MemoryFormat::channels_last)) return t;
  return t.contiguous();
}

// t in dtype `to` when t is floating in dtype `from`; anything else unchanged. The memory
// format stays (ops::cast keeps it).
inline Tensor convert(const Tensor& t, DType from, DType to) {
  return t.defined() && t.dtype() == from && from != to ? ops::cast(t, to) : t;
}


}  // namespace tnt::detail
