// How a CPU entry point hands its work to a CUDA engine, and what every engine may assume.
//
// Each layer, loss, metric and op has its CUDA engine declared beside it: layers/<name>_cuda.hpp,
// layers/losses/losses_cuda.hpp, layers/metrics/metrics_cuda.hpp, backend/cuda/ops_cuda.hpp
// (plain C++ declarations), implemented in the .cu of the same name (CUDA builds only). The
// CPU side (layers/<name>.cpp, backend/cpu/ops_cpu.cpp) checks the inputs (count, dtype,
// shapes, device == layer device), builds the layer, and then calls its engine through
// TNT_CUDA_DISPATCH when the first input is on a CUDA device. So an engine may assume:
//   - inputs are on layer.device(), contiguous, with the shapes the layer documents;
//   - the layer is built (parameters exist on the same device, grads allocated and zeroed
//     once by Layer; backward ADDS into Parameter::grad, never overwrites);
//   - SavedState is this engine's own (the CPU engine never reads or writes it);
//   - layer.engine_cache(Device::Kind::cuda) is free for the engine's per-layer cache;
//   - saved.need_input_grads == false (set by the graph for a network's first layer) lets
//     backward skip the input gradients and return undefined tensors (Conv2D and Dense
//     do, on both engines; parameter gradients are still required).
// Mixed precision (Network::set_compute_dtype; f16 or bf16 activations, f32 master weights):
//   - A layer's activations, their gradients and its outputs have the dtype of its input x
//     (f32, f16 or bf16); parameters, buffers and every Parameter::grad are f32 always.
//   - Conv2D and Dense with a half x multiply by compute_value(layer.weight(), x.dtype(),
//     layer.name()), the network's half copy of the weight (Parameter::compute); with an
//     f32 x that is weight().value itself, and the f32 path is unchanged. Products run on
//     tensor cores with f32 accumulation; results are rounded to x's dtype once.
//   - The weight gradient is ACCUMULATED (+=) in f32: Dense by cublasGemmEx with half A/B
//     and an f32 C (beta 1, never rounded to half); Conv2D through a temporary half filter
//     gradient (cuDNN writes the filter descriptor's dtype) added with accumulate_as_float.
//   - Biases are f32 and added in float to the half product (one more rounding); bias
//     gradients are f32 channel sums of the half dy.
//   - BatchNorm: cuDNN's mixed mode (x, y, dy, dx half; gamma, beta, statistics and their
//     gradients f32).
//   - ReLU, MaxPool2D, GlobalAveragePool and Dropout are our kernels: float arithmetic,
//     results stored in x's dtype. Softmax and AvgPool2D are cuDNN's on half descriptors
//     (its internal precision is not documented; tests allow half accumulation for pooling).
//     ops (axpy, scale, add, copy_cast, sum, sum_squares, has_non_finite) take f32, f16 and
//     bf16 and compute in float. Losses and metrics get f32 (the network widens its outputs).
// Semantics are the CPU engine's (tests compare them with |gpu - cpu| <= atol + rtol |cpu|);
// each engine's header says what they are for its layer. Flatten and Add have no engine: a
// reshape, and ops::add/copy, which dispatch themselves.
#pragma once

#include <type_traits>

namespace tnt::detail {
[[noreturn]] void no_cuda_engine(const char* what);  // "... built without CUDA"
}  // namespace tnt::detail

// In a CPU engine entry point: hand a CUDA input to the CUDA engine, or fail clearly in a
// CPU-only build.
#ifdef TNT_WITH_CUDA
#define TNT_CUDA_DISPATCH(device, call) \
  do {                                  \
    if ((device).is_cuda()) return call; \
  } while (0)
#else
// The unevaluated decltype keeps the call type-checked (and its arguments "used") without
// needing the CUDA engine's symbols.
#define TNT_CUDA_DISPATCH(device, call)                                     \
  do {                                                                      \
    (void)sizeof(std::is_void<decltype(call)>);                             \
    if ((device).is_cuda()) ::tnt::detail::no_cuda_engine(__func__);        \
  } while (0)
#endif
