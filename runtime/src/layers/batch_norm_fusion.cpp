// The fused chains of BatchNorm (nn/fusion.hpp): BatchNorm -> ReLU and BatchNorm -> Add ->
// ReLU, ResNet's "bn, relu" and "bn3, + shortcut, relu". On CUDA they run as one cuDNN call
// each way (batch_norm_cuda.hpp: batch_norm_act_forward, where it applies); on the CPU as
// oneDNN's batch normalisation with its ReLU, or followed by one pass for the sum and ReLU
// (batch_norm_cpu.hpp), with f32 tensors in one memory format; everywhere else the executor
// runs the layers one by one.
#include "backend/dispatch.hpp"
#include "layers/batch_norm_cpu.hpp"
#include "layers/batch_norm_cuda.hpp"
#include "nn/fusion.hpp"
#include "tarantella/layers/activation.hpp"
#include "tarantella/layers/add.hpp"
#include "tarantella/layers/batch_norm.hpp"

namespace tnt {

namespace {

BatchNorm& bn_of(const std::vector<Layer*>& layers) {
  auto* bn = dynamic_cast<BatchNorm*>(layers.at(0));
  TNT_CHECK(bn != nullptr, "fused chain: layer '{}' says it is a BatchNorm but is not one", layers.at(0)->name());
  return *bn;
}

// inputs: {x} or {x, z} (the Add's other input: a sum does not care which side it is on).
bool chain_forward(const std::vector<Layer*>& layers, const std::vector<Tensor>& inputs, const RunContext& rc,
                   SavedState& saved, std::vector<Tensor>& outputs) {
  const bool add = layers.size() == 3;
  if (inputs.size() != (add ? 2u : 1u) || !inputs[0].defined()) return false;
  BatchNorm& bn = bn_of(layers);
  const Tensor& x = inputs[0];
  const Tensor z = add ? inputs[1] : Tensor();
  Tensor y;
  if (x.device().is_cpu()) {
    if (!cpu::batch_norm_act_forward(bn, x, z, rc, saved, y)) return false;
    outputs = {y};
    return true;
  }
  if (!x.device().is_cuda() || !bn.device().is_cuda()) return false;
  const auto begin = [&] { bn.begin_forward(x, rc); };
  // In a CPU-only build no tensor is on a CUDA device (returned above); the dispatch keeps
  // the call type-checked there.
  auto run = [&]() -> bool {
    TNT_CUDA_DISPATCH(x.device(), cuda::batch_norm_act_forward(bn, x, z, rc, begin, saved, y));
    return false;
  };
  const bool ran = run();
  if (ran) outputs = {y};
  return ran;
}

std::vector<Tensor> chain_backward(const std::vector<Layer*>& layers, const std::vector<Tensor>& grad_outputs,
                                   const RunContext&, SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(),
            "fused chain of BatchNorm '{}': one gradient expected", layers.at(0)->name());
  BatchNorm& bn = bn_of(layers);
  const Tensor& dy = grad_outputs[0];
  auto run = [&]() -> std::vector<Tensor> {
    TNT_CUDA_DISPATCH(dy.device(), cuda::batch_norm_act_backward(bn, dy, saved));
    return cpu::batch_norm_act_backward(bn, dy, saved);
  };
  std::vector<Tensor> g = run();
  if (layers.size() == 2) g.resize(1);
  return g;
}

// Any BatchNorm (affine or not), ReLU has no options, Add of exactly two inputs (checked by
// the executor's match: the chain's and one side input).
bool accepts(const std::vector<Layer*>& layers) {
  return detail::is_exactly<BatchNorm>(layers.at(0)) && detail::is_exactly<ReLU>(layers.back()) &&
         (layers.size() == 2 || detail::is_exactly<Add>(layers.at(1)));
}

detail::FusionPattern pattern(std::string name, std::vector<std::string> types) {
  detail::FusionPattern p{std::move(name), std::move(types), accepts, chain_forward, chain_backward};
  p.cpu_engine = true;
  p.cuda_engine = true;
  return p;
}

const detail::FusionRegistration kBnRelu(pattern("batch_norm_relu", {"BatchNorm", "ReLU"}));
const detail::FusionRegistration kBnAddRelu(pattern("batch_norm_add_relu", {"BatchNorm", "Add", "ReLU"}));

}  // namespace

}  // namespace tnt
