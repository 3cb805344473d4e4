// The fused chains of BatchNorm (nn/fusion.hpp): BatchNorm -> ReLU and BatchNorm -> Add ->
// ReLU, ResNet's "bn, relu" and "bn3, + shortcut, relu". On CUDA they run as one cuDNN call
// each way (batch_norm_cuda.hpp: batch_norm_act_forward, where it applies); everywhere else
// the executor runs the layers one by one.
#include "backend/dispatch.hpp"
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
  if (inputs.size() != (add ? 2u : 1u) || !inputs[0].defined() || !inputs[0].device().is_cuda()) return false;
  BatchNorm& bn = bn_of(layers);
  if (!bn.device().is_cuda()) return false;
  const Tensor& x = inputs[0];
  const Tensor z = add ? inputs[1] : Tensor();
  Tensor y;
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
    TNT_THROW("fused chain of BatchNorm '{}': backward of a chain that ran on the CPU", bn.name());
  };
  std::vector<Tensor> g = run();
  if (layers.size() == 2) g.resize(1);
  return g;
}

// Any BatchNorm (affine or not), ReLU has no options, Add of exactly two inputs (checked by
// the executor's match: the chain's and one side input).
bool accepts(const std::vector<Layer*>& layers) {
  return dynamic_cast<BatchNorm*>(layers.at(0)) != nullptr && dynamic_cast<ReLU*>(layers.back()) != nullptr &&
         (layers.size() == 2 || dynamic_cast<Add*>(layers.at(1)) != nullptr);
}

const detail::FusionRegistration kBnRelu(detail::FusionPattern{
    "batch_norm_relu", {"BatchNorm", "ReLU"}, accepts, chain_forward, chain_backward});
const detail::FusionRegistration kBnAddRelu(detail::FusionPattern{
    "batch_norm_add_relu", {"BatchNorm", "Add", "ReLU"}, accepts, chain_forward, chain_backward});

}  // namespace

}  // namespace tnt
