// Chains of layers that one engine call can run (BatchNorm -> ReLU, BatchNorm -> Add ->
// ReLU: cuDNN's fused batch norm), found in a network's graph and run by the executor.
//
// A layer file registers a pattern (its types in chain order and the engine call); the
// executor (executor.cpp, fusion.cpp) finds chains in the graph where each member's single
// output has exactly one use, by the next member, and is no network output, so nothing
// outside the chain ever sees an intermediate tensor. A member may take other inputs (the
// Add's shortcut): the chain's side inputs.
//
// A chain runs at its LAST member's place in the order, when its side inputs exist (the
// shortcut's branch may come after the BatchNorm), and its backward at the same place in
// reverse. Where the engine declines (another device, dtype, format or mode), the executor
// runs the members one by one there, with the same calls, bits and saved states as an
// unfused run; so does every chain when fusion is off. Parameter hooks fire where they
// would without fusion (at each layer's first call in the reverse order).
#pragma once

#include "tarantella/layer.hpp"

#include <functional>
#include <string>
#include <typeinfo>
#include <vector>

namespace tnt::detail {

// Whether `layer` is exactly a T, not a subclass: an engine computes T's own forward and
// backward, so a subclass that overrides them (a user's layer, a test's spy) must run as a
// layer. Patterns' accepts() ask this of each member.
template <typename T>
bool is_exactly(const Layer* layer) {
  return layer != nullptr && typeid(*layer) == typeid(T);
}

struct FusionPattern {
  std::string name;                // for logs and tests: "batch_norm_add_relu"
  std::vector<std::string> types;  // Layer::type() of each member, chain order
  // Whether these layers (chain order) may run as one: their options allow it.
  std::function<bool(const std::vector<Layer*>& layers)> accepts;
  // One engine call for the chain. inputs: the head's inputs, then each later member's other
  // inputs in chain order (for an Add: its inputs but the chain's). Returns false, having
  // changed nothing, where the engine declines; then the members run one by one. saved is
  // the chain's own state for backward.
  std::function<bool(const std::vector<Layer*>& layers, const std::vector<Tensor>& inputs, const RunContext& rc,
                     SavedState& saved, std::vector<Tensor>& outputs)>
      forward;
  // Gradients of the last member's outputs -> gradients of forward's inputs, in that order
  // (undefined where none). Called only after forward returned true.
  std::function<std::vector<Tensor>(const std::vector<Layer*>& layers, const std::vector<Tensor>& grad_outputs,
                                    const RunContext& rc, SavedState& saved)>
      backward;
  // The devices whose tensors the engine takes. By default (LayerFusion::automatic) a network
  // plans only the patterns with an engine on its device; LayerFusion::on plans those first
  // (they take their layers before the others can), then the others, which run layer by layer.
  bool cpu_engine = false;
  bool cuda_engine = true;
};

// At static initialisation (like LayerTypeRegistration). Longer patterns are matched first,
// then those of one length by name (batch_norm_relu takes a ReLU before relu_max_pool can).
void register_fusion_pattern(FusionPattern pattern);
const std::vector<FusionPattern>& fusion_patterns();

struct FusionRegistration {
  explicit FusionRegistration(FusionPattern pattern) { register_fusion_pattern(std::move(pattern)); }
};

// The chains of one network (Network::plan_fusion).
struct FusedChain {
  size_t pattern = 0;
  std::vector<size_t> nodes;   // chain order
  std::vector<Layer*> layers;  // of those nodes
  // Per member: the position of the previous member's output among its inputs (the head: -1).
  std::vector<int> chain_arg;
  bool engine = false;  // the last forward ran the pattern's engine call (else layer by layer)
};

struct FusionPlan {
  int planned_for = -1;  // Network::fusion_plan's key: the device kind and whether every pattern
  std::vector<FusedChain> chains;
  std::vector<int> chain_of_node;  // per node: its chain, or -1
  int64_t engine_runs = 0;         // chains the last forward ran through an engine call
};

}  // namespace tnt::detail
