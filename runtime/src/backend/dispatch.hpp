// The CUDA engines of the layers, losses, metrics and ops: declared here, implemented in
// runtime/src/layers/<name>_cuda.cu and runtime/src/backend/cuda/ops_cuda.cu (CUDA builds
// only). The CPU side (runtime/src/layers/<name>.cpp, backend/cpu/ops_cpu.cpp) checks the
// inputs (count, dtype, shapes, device == layer device), builds the layer, and then calls
// these when the first input is on a CUDA device. So an engine may assume:
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
// Semantics are the CPU engine's (tests compare them with |gpu - cpu| <= atol + rtol|cpu|):
//   Dense       y = x W^T + b over the last axis; x (..., in) -> (..., units); W (units, in).
//   Conv2D      NCHW cross-correlation, square kernel/stride/symmetric padding, W (F, C, k, k).
//   BatchNorm   over axis 1 of (N, C) or (N, C, H, W). Training: batch mean and biased var
//               normalise; running = (1 - m) * running + m * batch, running_var uses the
//               UNBIASED batch variance (N*H*W / (N*H*W - 1)); updated in forward(training).
//               Inference: running stats. Backward in training uses batch statistics; in
//               inference the running ones (a per-channel affine map).
//   ReLU        gradient 0 at x == 0.
//   Softmax     along layer.axis() (normalise negative axes by the input's rank).
//   MaxPool2D   padding never wins; gradient to the FIRST maximum of a window (row-major);
//               a NaN in a window is the output (as PyTorch).
//   AvgPool2D   padded positions excluded from the divisor.
//   GlobalAveragePool (N, C, H, W) -> (N, C).
//   Dropout     training only (inference never reaches the engine): keep element i iff
//               philox::uniform(layer.mask_key(rc), Dropout::mask_counter(rc, shape) + i)
//               >= float(layer.rate()), kept values scaled by 1 / (1 - rate). See philox.hpp.
//               The engine must leave saved.tensors or saved.extra non-empty (the mask):
//               an empty SavedState tells backward that forward was the identity.
//   Flatten, Add: no engine (reshape, and ops::add/copy, which dispatch themselves).
//   SoftmaxCrossEntropy: logits (R, K) viewed from (..., K), labels (R) i32 or i64;
//               loss = sum over rows with label != ignore_index of
//               -sum_k q_k log softmax(x)_k, q = (1 - s) onehot + s / K, divided by
//               global_batch (> 0 here: the caller resolved 0). backward: (softmax - q) *
//               scale / global_batch for counted rows, 0 for ignored rows. A label outside
//               [0, K) (and != ignore_index) is an error (InputError naming the label).
//   MeanSquaredError: sum (p - t)^2 / (global_batch * D); backward 2 (p - t) scale / (global_batch * D).
//   topk_correct: see metrics.hpp (stable descending rank of the label < k).
// The loss forward returns a 1-element f32 tensor on the device.
#pragma once

#include "tarantella/layer.hpp"
#include "tarantella/layers/activation.hpp"
#include "tarantella/layers/batch_norm.hpp"
#include "tarantella/layers/conv2d.hpp"
#include "tarantella/layers/dense.hpp"
#include "tarantella/layers/dropout.hpp"
#include "tarantella/layers/pooling.hpp"
#include "tarantella/loss.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <type_traits>
#include <vector>

namespace tnt::cuda {

#define TNT_DECLARE_CUDA_LAYER_ENGINE(Type, fn)                                                     \
  std::vector<Tensor> fn##_forward(Type& layer, const std::vector<Tensor>& inputs,                 \
                                   const RunContext& rc, SavedState& saved);                       \
  std::vector<Tensor> fn##_backward(Type& layer, const std::vector<Tensor>& grad_outputs,          \
                                    const RunContext& rc, SavedState& saved);

TNT_DECLARE_CUDA_LAYER_ENGINE(Dense, dense)
TNT_DECLARE_CUDA_LAYER_ENGINE(Conv2D, conv2d)
TNT_DECLARE_CUDA_LAYER_ENGINE(BatchNorm, batch_norm)
TNT_DECLARE_CUDA_LAYER_ENGINE(ReLU, relu)
TNT_DECLARE_CUDA_LAYER_ENGINE(Softmax, softmax)
TNT_DECLARE_CUDA_LAYER_ENGINE(MaxPool2D, max_pool2d)
TNT_DECLARE_CUDA_LAYER_ENGINE(AvgPool2D, avg_pool2d)
TNT_DECLARE_CUDA_LAYER_ENGINE(GlobalAveragePool, global_average_pool)
TNT_DECLARE_CUDA_LAYER_ENGINE(Dropout, dropout)

#undef TNT_DECLARE_CUDA_LAYER_ENGINE

// Losses (global_batch > 0 already resolved by the caller).
Tensor softmax_cross_entropy_forward(SoftmaxCrossEntropy& loss, const Tensor& logits, const Tensor& labels,
                                     int64_t global_batch, SavedState& saved);
Tensor softmax_cross_entropy_backward(SoftmaxCrossEntropy& loss, SavedState& saved, double scale);
Tensor mean_squared_error_forward(MeanSquaredError& loss, const Tensor& predictions, const Tensor& targets,
                                  int64_t global_batch, SavedState& saved);
Tensor mean_squared_error_backward(MeanSquaredError& loss, SavedState& saved, double scale);

// Metrics: scores (R, K) f32, labels (R) i32/i64.
struct MetricCounts {
  int64_t correct = 0;
  int64_t count = 0;  // rows whose label != ignore_index
};
MetricCounts topk_correct(const Tensor& scores, const Tensor& labels, int64_t k, int64_t ignore_index);

// Ops (tarantella/ops.hpp semantics; all tensors on one CUDA device, checked by the caller:
// equal numel, equal dtypes except for copy_cast; out tensors allocated by the caller).
void axpy(double alpha, const Tensor& x, const Tensor& y);
void scale(const Tensor& x, double alpha);
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void copy_cast(const Tensor& src, const Tensor& dst);
double sum(const Tensor& x);
double sum_squares(const Tensor& x);
bool has_non_finite(const Tensor& x);
bool has_non_finite(const std::vector<Tensor>& xs);  // all on one CUDA device, floating
void argmax_rows(const Tensor& x, const Tensor& out);  // x (R, K), out (R) i64

}  // namespace tnt::cuda

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
