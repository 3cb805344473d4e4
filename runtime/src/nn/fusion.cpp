// Layer fusion: the patterns' registry, finding chains in a graph, and running a chain
// (the rules are at the top of fusion.hpp).
#include "nn/fusion.hpp"

#include "nn/executor_util.hpp"
#include "nn/graph_node.hpp"

#include "tarantella/check.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>

namespace tnt {

namespace detail {

namespace {

std::vector<FusionPattern>& patterns() {
  static std::vector<FusionPattern> table;
  return table;
}

}  // namespace

void register_fusion_pattern(FusionPattern pattern) {
  TNT_CHECK(pattern.types.size() >= 2 && pattern.accepts && pattern.forward && pattern.backward,
            "fusion pattern '{}' needs two or more types and all three functions", pattern.name);
  auto& table = patterns();
  table.push_back(std::move(pattern));
  // Longer first; among patterns of one length (which may want the same layer: BatchNorm ->
  // ReLU and ReLU -> MaxPool2D) by name, not by the order of static initialisation.
  std::sort(table.begin(), table.end(), [](const FusionPattern& a, const FusionPattern& b) {
    if (a.types.size() != b.types.size()) return a.types.size() > b.types.size();
    return a.name < b.name;
  });
}

const std::vector<FusionPattern>& fusion_patterns() { return patterns(); }

}  // namespace detail

using detail::FusedChain;
using detail::FusionPlan;

namespace {
// "fused chain 'bn1' (BatchNorm) -> 'relu1' (ReLU)", for in_layer's messages.
std::string chain_label(const FusedChain& chain) {
  std::string label = "fused chain ";
  for (size_t m = 0; m < chain.layers.size(); ++m) {
    if (m > 0) label += " -> ";
    label += "'" + chain.layers[m]->name() + "' (" + chain.layers[m]->type() + ")";
  }
  return label;
}
}  // namespace

void Network::set_layer_fusion(LayerFusion mode) {
  layer_fusion_ = mode;
  have_saved_ = false;  // a state saved by the other way of running must not meet this backward
}

bool Network::fusion_active() const {
  // The CPU's mixed precision widens and rounds around each layer in the loop (emulation).
  if (device_.is_cpu() && compute_dtype_ != DType::f32) return false;
  switch (layer_fusion_) {
    case LayerFusion::on:
      return true;
    case LayerFusion::off:
      return false;
    case LayerFusion::automatic:
      break;
  }
  // Only the patterns with an engine on the network's device are planned (fusion_plan).
  return tnt::config().layer_fusion;
}

int64_t Network::fused_chains() {
  prepare(nullptr);
  return fusion_active() ? static_cast<int64_t>(fusion_plan()->chains.size()) : 0;
}

int64_t Network::fused_engine_runs() const { return fusion_ ? fusion_->engine_runs : 0; }

FusionPlan* Network::fusion_plan() {
  // The patterns with an engine on this device first, so that they take their layers; the
  // others (which would run layer by layer) only under LayerFusion::on.
  const bool cpu = device_.is_cpu(), every = layer_fusion_ == LayerFusion::on;
  const int key = (cpu ? 1 : 0) + (every ? 2 : 0);
  if (fusion_ && fusion_->planned_for == key) return fusion_.get();
  auto plan = std::make_shared<FusionPlan>();
  plan->planned_for = key;
  const size_t n = nodes_.size();
  plan->chain_of_node.assign(n, -1);
  // The one consumer of each single-use output: (node, input position).
  std::vector<std::pair<size_t, int>> user(n, {0, -1});
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < node_inputs_[i].size(); ++j) {
      const auto& [p, k] = node_inputs_[i][j];
      if (k == 0 && nodes_[p]->shapes.size() == 1 && consumers_[p][0] == 1) user[p] = {i, static_cast<int>(j)};
    }
  }
  const auto& table = detail::fusion_patterns();
  for (size_t order = 0; order < 2 * table.size(); ++order) {
    const size_t pi = order % table.size();
    const detail::FusionPattern& pattern = table[pi];
    const bool engine_here = cpu ? pattern.cpu_engine : pattern.cuda_engine;
    if (order < table.size() ? !engine_here : (engine_here || !every)) continue;
    for (size_t head = inputs_.size(); head < n; ++head) {
      if (plan->chain_of_node[head] >= 0 || nodes_[head]->layer->type() != pattern.types[0]) continue;
      FusedChain chain;
      chain.pattern = pi;
      chain.nodes = {head};
      chain.layers = {nodes_[head]->layer};
      chain.chain_arg = {-1};
      size_t cur = head;
      bool ok = true;
      for (size_t m = 1; ok && m < pattern.types.size(); ++m) {
        ok = nodes_[cur]->shapes.size() == 1 && consumers_[cur][0] == 1 && !pinned_[cur][0] && user[cur].second >= 0;
        if (!ok) break;
        const size_t next = user[cur].first;
        ok = plan->chain_of_node[next] < 0 && nodes_[next]->layer->type() == pattern.types[m];
        if (!ok) break;
        chain.nodes.push_back(next);
        chain.layers.push_back(nodes_[next]->layer);
        chain.chain_arg.push_back(user[cur].second);
        cur = next;
      }
      if (!ok || !pattern.accepts(chain.layers)) continue;
      for (size_t node : chain.nodes) plan->chain_of_node[node] = static_cast<int>(plan->chains.size());
      plan->chains.push_back(std::move(chain));
    }
  }
  fusion_ = plan;
  return fusion_.get();
}

void Network::forward_chain(FusedChain& chain, std::vector<std::vector<Tensor>>& values,
                            std::vector<std::vector<int>>& remaining, const RunContext& lrc, bool keep) {
  const detail::FusionPattern& pattern = detail::fusion_patterns()[chain.pattern];
  const size_t members = chain.nodes.size();
  const size_t tail = chain.nodes.back();
  auto arg = [&](size_t m, size_t j) {
    const auto& [p, k] = node_inputs_[chain.nodes[m]][j];
    return detail::for_layer(*chain.layers[m], values[p][static_cast<size_t>(k)]);
  };
  // The head's inputs, then the side inputs in chain order (fusion.hpp).
  std::vector<Tensor> inputs;
  for (size_t j = 0; j < node_inputs_[chain.nodes[0]].size(); ++j) inputs.push_back(arg(0, j));
  for (size_t m = 1; m < members; ++m) {
    for (size_t j = 0; j < node_inputs_[chain.nodes[m]].size(); ++j) {
      if (static_cast<int>(j) != chain.chain_arg[m]) inputs.push_back(arg(m, j));
    }
  }
  for (size_t node : chain.nodes) saved_[node] = SavedState{};
  std::vector<Tensor> outs;
  chain.engine = detail::in_layer([&] { return chain_label(chain); }, "forward", inputs, device_,
                                  [&] { return pattern.forward(chain.layers, inputs, lrc, saved_[tail], outs); });
  if (chain.engine) {
    if (lrc.training) ++fusion_->engine_runs;
    for (size_t node : chain.nodes) {
      out_shapes_[node] = {outs.at(0).shape()};
      out_dtypes_[node] = {outs.at(0).dtype()};
      out_formats_[node] = {outs.at(0).memory_format()};
    }
  } else {
    // Layer by layer, as the executor's loop would call them.
    std::vector<Tensor> prev;
    for (size_t m = 0; m < members; ++m) {
      const size_t node = chain.nodes[m];
      std::vector<Tensor> args;
      for (size_t j = 0; j < node_inputs_[node].size(); ++j) {
        args.push_back(static_cast<int>(j) == chain.chain_arg[m] ? detail::for_layer(*chain.layers[m], prev.at(0))
                                                                 : arg(m, j));
      }
      prev = detail::in_layer([&] { return detail::layer_label(*chain.layers[m]); }, "forward", args, device_,
                              [&] { return chain.layers[m]->forward(args, lrc, saved_[node]); });
      TNT_CHECK(prev.size() == nodes_[node]->shapes.size(), "layer '{}' ({}) returned {} outputs, its call has {}",
                chain.layers[m]->name(), chain.layers[m]->type(), prev.size(), nodes_[node]->shapes.size());
      out_shapes_[node] = {prev.at(0).shape()};
      out_dtypes_[node] = {prev.at(0).dtype()};
      out_formats_[node] = {prev.at(0).memory_format()};
    }
    outs = std::move(prev);
  }
  values[tail] = std::move(outs);
  // Free the inputs from outside the chain that nobody else needs.
  for (size_t m = 0; m < members; ++m) {
    for (size_t j = 0; j < node_inputs_[chain.nodes[m]].size(); ++j) {
      if (static_cast<int>(j) == chain.chain_arg[m]) continue;
      const auto& [p, k] = node_inputs_[chain.nodes[m]][j];
      const auto ku = static_cast<size_t>(k);
      if (--remaining[p][ku] == 0 && !pinned_[p][ku]) values[p][ku] = Tensor();
    }
  }
  for (size_t k = 0; k < values[tail].size(); ++k) {
    if (remaining[tail][k] == 0 && !pinned_[tail][k]) values[tail][k] = Tensor();
  }
  if (!keep) {
    for (size_t node : chain.nodes) saved_[node] = SavedState{};
  }
}

void Network::backward_chain(FusedChain& chain, std::vector<std::vector<Tensor>>& grads, const RunContext& lrc) {
  const detail::FusionPattern& pattern = detail::fusion_patterns()[chain.pattern];
  const size_t members = chain.nodes.size();
  const size_t tail = chain.nodes.back();
  std::vector<Tensor>& g = grads[tail];
  if (std::none_of(g.begin(), g.end(), [](const Tensor& t) { return t.defined(); })) return;
  for (size_t k = 0; k < g.size(); ++k) {
    if (!g[k].defined())
      g[k] = Tensor::zeros(out_shapes_[tail][k], out_dtypes_[tail][k], device_, out_formats_[tail][k]);
    g[k] = detail::for_layer(*chain.layers.back(), g[k]);
  }
  auto give = [&](size_t m, size_t j, const Tensor& t) {
    if (!t.defined()) return;
    const auto& [p, k] = node_inputs_[chain.nodes[m]][j];
    const auto ku = static_cast<size_t>(k);
    detail::accumulate(grads[p][ku], t, out_formats_[p][ku]);
  };
  if (chain.engine) {
    std::vector<Tensor> gin = detail::in_layer([&] { return chain_label(chain); }, "backward", g, device_,
                                               [&] { return pattern.backward(chain.layers, g, lrc, saved_[tail]); });
    size_t next = 0;
    auto take = [&]() { return next < gin.size() ? gin[next++] : Tensor(); };
    for (size_t j = 0; j < node_inputs_[chain.nodes[0]].size(); ++j) give(0, j, take());
    for (size_t m = 1; m < members; ++m) {
      for (size_t j = 0; j < node_inputs_[chain.nodes[m]].size(); ++j) {
        if (static_cast<int>(j) != chain.chain_arg[m]) give(m, j, take());
      }
    }
    return;
  }
  std::vector<Tensor> cur = g;
  for (size_t m = members; m-- > 0;) {
    const size_t node = chain.nodes[m];
    std::vector<Tensor> gin = detail::in_layer([&] { return detail::layer_label(*chain.layers[m]); }, "backward", cur,
                                               device_,
                                               [&] { return chain.layers[m]->backward(cur, lrc, saved_[node]); });
    TNT_CHECK(gin.size() == node_inputs_[node].size(), "layer '{}' ({}) returned {} input gradients for {} inputs",
              chain.layers[m]->name(), chain.layers[m]->type(), gin.size(), node_inputs_[node].size());
    cur.clear();
    for (size_t j = 0; j < gin.size(); ++j) {
      if (m > 0 && static_cast<int>(j) == chain.chain_arg[m]) {
        // The previous member's output gradient, as accumulate() and the loop would give it;
        // none means the loop would skip that member's backward, and so the rest.
        const size_t prev = chain.nodes[m - 1];
        if (gin[j].defined())
          cur = {detail::for_layer(*chain.layers[m - 1], gin[j].to_memory_format(out_formats_[prev][0]))};
      } else {
        give(m, j, gin[j]);
      }
    }
    if (cur.empty()) break;
  }
}

}  // namespace tnt
