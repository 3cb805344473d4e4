// Private to runtime/src/nn: what the executor (executor.cpp) and the fused chains
// (fusion.cpp) do alike at the edges of a layer call.
#pragma once

#include "tarantella/check.hpp"
#include "tarantella/layer.hpp"
#include "tarantella/ops.hpp"

#include <string>
#include <typeinfo>
#include <vector>

namespace tnt::detail {

// The context in_layer appends: "layer 'dense_3' (Dense), forward on bf16 (32768, 1024) on
// cuda:0". `what` names the layer or the fused chain.
[[noreturn]] void rethrow_in_layer(const Error& error, const std::string& what, const char* pass,
                                   const std::vector<Tensor>& operands);
bool cuda_sync_check(const Device& device);  // TNT_CUDA_SYNC_CHECK on a CUDA device
void check_device_now(const Device& device);

// Runs one layer's (or fused chain's) forward or backward. An error of the library's own
// (a tnt::Error; not an InputError or a CommError, whose messages name what they are about,
// nor a program's own subclass) gets the
// layer, the pass and its operands' dtypes and shapes appended: an engine's message (a
// cuBLAS status, a kernel's fault) names only its call, which many layers share. With
// TNT_CUDA_SYNC_CHECK the host waits for the layer's work on a GPU, so that a kernel's
// fault is named here and not at the step's next wait.
// `what` is called on an error only (a step makes about a thousand layer calls).
template <class What, class F>
auto in_layer(What&& what, const char* pass, const std::vector<Tensor>& operands, const Device& device,
              F&& run) -> decltype(run()) {
  try {
    auto result = run();
    if (cuda_sync_check(device)) check_device_now(device);
    return result;
  } catch (const InputError&) {
    throw;
  } catch (const CommError&) {
    throw;
  } catch (const Error& e) {
    // A program's own subclass of Error passes as it is: its handler catches that type.
    if (typeid(e) != typeid(Error)) throw;
    rethrow_in_layer(e, what(), pass, operands);
  }
}

inline std::string layer_label(const Layer& layer) { return "layer '" + layer.name() + "' (" + layer.type() + ")"; }

// slot += grad, both ending in `format` (that of the tensor they are the gradient of).
inline void accumulate(Tensor& slot, const Tensor& grad, MemoryFormat format) {
  // grad is never written: it may be the caller's tensor, a view (Flatten) of another
  // gradient, or a tensor a layer passed on. to_memory_format shares what is already in format.
  const Tensor g = grad.to_memory_format(format);
  if (!slot.defined()) {
    slot = g;
    return;
  }
  // In place where the slot is its memory's only owner (nothing else sees the change) and
  // both are f32 in format, without a new tensor: on the CPU ops::add's own expression with
  // its operands in its order (so even a NaN's payload is the same), on a GPU an axpy with 1
  // (x + y rounded once, the add's bits). Otherwise out of place (ops::add makes a new tensor).
  if (slot.storage().use_count() == 1 && slot.memory_format() == format && slot.dtype() == DType::f32 &&
      g.dtype() == DType::f32 && g.device() == slot.device() && g.numel() == slot.numel() &&
      g.storage() != slot.storage()) {
    if (slot.device().is_cpu()) {
      float* s = slot.data<float>();
      const float* x = g.data<float>();
      const int64_t n = slot.numel();
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) s[i] = s[i] + x[i];
    } else {
      ops::axpy(1.0, g, slot);
    }
    return;
  }
  slot = ops::add(slot.to_memory_format(format), g);
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
