// The fused chain Dropout -> Add (nn/fusion.hpp): a Transformer's "x + dropout(sublayer(x))",
// 30 of them in Transformer-big. On CUDA one pass each way (dropout_cuda.hpp:
// dropout_add_forward): the forward reads the sublayer's output and the residual and writes
// the sum, where the layers one by one wrote and read the dropped-out tensor and a byte mask
// in between; the backward writes only the sublayer's gradient, and hands the sum's gradient
// on as the residual's (an Add passes it through unchanged; the executor sums gradients out
// of place, so nobody writes into it), where Add::backward made two copies. At 32k tokens of
// 1,024 features in bf16 that is about 440 MB less traffic per chain and step, and the mask
// is kept as bits (4 MB instead of 32). Bits are those of the layers one by one: the same
// Philox draws (Dropout's key and counters), the dropped value rounded to the dtype before
// the float sum that is rounded once, as Dropout's and Add's kernels do.
//
// Everywhere else (a CPU tensor, inference, rate 0, a memory format other than contiguous,
// an Add of more than two inputs) the executor runs the two layers one by one.
#include "backend/dispatch.hpp"
#include "layers/dropout_cuda.hpp"
#include "nn/fusion.hpp"
#include "tarantella/layers/add.hpp"
#include "tarantella/layers/dropout.hpp"

namespace tnt {

namespace {

Dropout& dropout_of(const std::vector<Layer*>& layers) {
  auto* d = dynamic_cast<Dropout*>(layers.at(0));
  TNT_CHECK(d != nullptr, "fused chain: layer '{}' says it is a Dropout but is not one", layers.at(0)->name());
  return *d;
}

// inputs: {h, x}: the Dropout's input, then the Add's other input (a sum does not care which
// side it is on).
bool chain_forward(const std::vector<Layer*>& layers, const std::vector<Tensor>& inputs, const RunContext& rc,
                   SavedState& saved, std::vector<Tensor>& outputs) {
  Dropout& dropout = dropout_of(layers);
  if (!rc.training || dropout.rate() == 0 || inputs.size() != 2) return false;
  const Tensor& h = inputs[0];
  const Tensor& x = inputs[1];
  if (!h.defined() || !x.defined() || !h.device().is_cuda() || h.device() != x.device()) return false;
  if (h.shape() != x.shape() || h.dtype() != x.dtype() || (h.dtype() != DType::f32 && !is_half(h.dtype()))) return false;
  if (h.memory_format() != MemoryFormat::contiguous || x.memory_format() != MemoryFormat::contiguous) return false;
  dropout.ensure_built({h.shape()});
  layers.at(1)->ensure_built({x.shape(), h.shape()});
  auto run = [&]() -> bool {
    TNT_CUDA_DISPATCH(h.device(), cuda::dropout_add_forward(dropout, h, x, rc, saved, outputs));
    return false;
  };
  return run();
}

std::vector<Tensor> chain_backward(const std::vector<Layer*>& layers, const std::vector<Tensor>& grad_outputs,
                                   const RunContext&, SavedState& saved) {
  Dropout& dropout = dropout_of(layers);
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(),
            "fused chain of Dropout '{}': one gradient expected", dropout.name());
  const Tensor& dy = grad_outputs[0];
  auto run = [&]() -> std::vector<Tensor> {
    TNT_CUDA_DISPATCH(dy.device(), cuda::dropout_add_backward(dropout, dy, saved));
    TNT_THROW("fused chain of Dropout '{}': backward of a chain that ran on the CPU", dropout.name());
  };
  return run();
}

bool accepts(const std::vector<Layer*>& layers) {
  return detail::is_exactly<Dropout>(layers.at(0)) && detail::is_exactly<Add>(layers.at(1));
}

const detail::FusionRegistration kDropoutAdd(detail::FusionPattern{
    "dropout_add", {"Dropout", "Add"}, accepts, chain_forward, chain_backward});

}  // namespace

}  // namespace tnt
