// Running the graph: forward in the network's topological order, backward in the reverse
// one, with the mixed-precision casts at the edges (see Network::set_compute_dtype).
//
// Memory: an activation is dropped as soon as its last consumer has run (unless it is a
// network output); what backward needs is in each call's SavedState. Gradients of one
// tensor from several consumers are summed in place only where the running sum's memory has
// no other owner (executor_util.hpp), because a layer may return the caller's tensor or a
// view of it (Add, Flatten, Sum) as its input gradient.
//
// The gradient hook fires for a layer's parameters right after the backward of its FIRST
// call in the order, its last backward in this pass: from there on nothing writes them.
//
// Memory formats (see Network::set_memory_format): every layer runs with rc.memory_format =
// the network's format; a channels_last tensor reaches only layers that support it (the
// others get a contiguous copy, of inputs in forward and of output gradients in backward).
// The format of every node output is recorded in forward, and every gradient is summed in
// the format of the tensor it belongs to.
#include "core/device_api.hpp"
#include "nn/executor_util.hpp"
#include "nn/fusion.hpp"
#include "nn/graph_node.hpp"

#include "tarantella/check.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/runtime.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace tnt {

using detail::accumulate;
using detail::convert;
using detail::for_layer;

namespace {

// A layer's outputs must have the shapes its output_shapes() gave when the network was made
// (-1: follows the batch). A custom layer whose forward and output_shapes disagree is named
// here, not by the layer that happens to get the output next.
void check_output_shapes(const Layer& layer, const std::vector<Tensor>& outs, const std::vector<Shape>& declared,
                         const std::string& network) {
  for (size_t k = 0; k < outs.size() && k < declared.size(); ++k) {
    const Shape& got = outs[k].shape();
    const Shape& want = declared[k];
    bool ok = got.size() == want.size();
    for (size_t d = 0; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == got[d];
    TNT_INPUT_CHECK(ok,
                    "layer '{}' ({}) in network '{}': its forward returned output {} of shape {}, but its "
                    "output_shapes() gave {} (None: any batch size); forward and output_shapes must agree",
                    layer.name(), layer.type(), network, k, shape_str(got), detail::sym_shape_str(want));
  }
}

}  // namespace

namespace detail {

void rethrow_in_layer(const Error& error, const std::string& what, const char* pass,
                      const std::vector<Tensor>& operands) {
  std::string on;
  for (const Tensor& t : operands) {
    if (!on.empty()) on += ", ";
    on += t.defined() ? t.str() : std::string("(none)");
  }
  throw Error(fmt::format("{}; in {}, {} on {}", error.what(), what, pass, on.empty() ? "no operands" : on));
}

bool cuda_sync_check(const Device& device) { return device.is_cuda() && tnt::config().cuda_sync_check; }

void check_device_now(const Device& device) { backend::cuda_check_now(device.index); }

}  // namespace detail


std::vector<Tensor> Network::forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                                     std::optional<bool> keep_for_backward) {
  prepare(&inputs);
  if (memory_format_ == MemoryFormat::channels_last) check_memory_format();
  const bool keep = keep_for_backward.value_or(rc.training);
  TNT_INPUT_CHECK(inputs.size() == inputs_.size(), "network '{}' takes {} inputs, got {}", name_, inputs_.size(),
                  inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const Shape& want = inputs_[i].shape();
    const std::string& what = inputs_[i].node->input_name;
    TNT_INPUT_CHECK(t.defined(), "network '{}': input {} ('{}') is undefined", name_, i, what);
    bool ok = t.ndim() == static_cast<int>(want.size());
    for (size_t d = 0; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == t.shape()[d];
    // One leading dimension too many, the rest as expected: samples batched already.
    bool batched_twice = !ok && t.ndim() == static_cast<int>(want.size()) + 1;
    for (size_t d = 1; batched_twice && d < want.size(); ++d) {
      batched_twice = want[d] < 0 || want[d] == t.shape()[d + 1];
    }
    TNT_INPUT_CHECK(ok, "network '{}': input {} ('{}') has shape {}, expected {}{}", name_, i, what,
                    shape_str(t.shape()), detail::sym_shape_str(want),
                    batched_twice ? " (one dimension more, as if its samples were batched already: fit, evaluate "
                                    "and predict cut the dataset into batches themselves, so give them unbatched "
                                    "samples)"
                                  : "");
    TNT_INPUT_CHECK(t.dtype() == inputs_[i].dtype(), "network '{}': input {} ('{}') is {}, expected {}", name_, i,
                    what, dtype_name(t.dtype()), dtype_name(inputs_[i].dtype()));
    TNT_INPUT_CHECK(t.device() == device_, "network '{}': input {} ('{}') is on {}, the network on {}", name_, i,
                    what, t.device().str(), device_.str());
  }
  for (Layer* layer : layers_) {
    TNT_CHECK(layer->device() == device_,
              "network '{}' is on {} but its layer '{}' is on {} (moved by another network "
              "sharing it?); call to() on this network",
              name_, device_.str(), layer->name(), layer->device().str());
  }

  // Mixed precision (see set_compute_dtype): cdt between layers, f32 at the edges.
  const DType cdt = compute_dtype_;
  const bool mixed = cdt != DType::f32;
  // CPU engines compute in f32, except those that take cdt themselves (Conv2D and Dense in
  // bf16 through oneDNN: Layer::cpu_computes_in).
  const bool emulating = mixed && device_.is_cpu();
  if (mixed) refresh_compute_copies();

  RunContext lrc = rc;  // what the layers see
  lrc.memory_format = memory_format_;
  const size_t n = nodes_.size();
  std::vector<std::vector<Tensor>> values(n);          // per node: its outputs, while needed
  std::vector<std::vector<int>> remaining = consumers_;  // per node output: uses still to run
  for (size_t i = 0; i < inputs_.size(); ++i) {
    values[i] = {convert(inputs[i], DType::f32, cdt)};
    out_formats_[i] = {inputs[i].memory_format()};
    out_shapes_[i] = {inputs[i].shape()};
  }
  detail::FusionPlan* fusion = fusion_active() ? fusion_plan() : nullptr;
  if (fusion_ && rc.training) fusion_->engine_runs = 0;  // counts the last training forward
  std::vector<Tensor> args;
  for (size_t i = inputs_.size(); i < n; ++i) {
    Layer* layer = nodes_[i]->layer;
    if (fusion != nullptr && fusion->chain_of_node[i] >= 0) {
      // A fused chain runs at its last member (nn/fusion.hpp).
      detail::FusedChain& chain = fusion->chains[static_cast<size_t>(fusion->chain_of_node[i])];
      if (chain.nodes.back() == i) forward_chain(chain, values, remaining, lrc, keep);
      continue;
    }
    args.clear();
    for (const auto& [p, k] : node_inputs_[i]) args.push_back(for_layer(*layer, values[p][static_cast<size_t>(k)]));
    saved_[i] = SavedState{};
    if (!input_gradients_) {
      // A layer fed only by the network's inputs (the first convolution on the images) need
      // not compute gradients that nobody asked for.
      bool only_inputs = true;
      for (const auto& [p, k] : node_inputs_[i]) only_inputs = only_inputs && p < inputs_.size();
      saved_[i].need_input_grads = !only_inputs;
    }
    const bool emulate = emulating && !layer->cpu_computes_in(cdt);
    if (emulate) {
      for (Tensor& a : args) a = convert(a, cdt, DType::f32);
    }
    std::vector<Tensor> outs = detail::in_layer([&] { return detail::layer_label(*layer); }, "forward", args, device_,
                                                [&] { return layer->forward(args, lrc, saved_[i]); });
    if (emulate) {
      for (Tensor& o : outs) o = convert(o, DType::f32, cdt);
    }
    TNT_CHECK(outs.size() == nodes_[i]->shapes.size(),
              "layer '{}' ({}) returned {} outputs, its call in network '{}' has {}", layer->name(),
              layer->type(), outs.size(), name_, nodes_[i]->shapes.size());
    check_output_shapes(*layer, outs, nodes_[i]->shapes, name_);
    args.clear();
    out_shapes_[i].clear();
    out_dtypes_[i].clear();
    out_formats_[i].clear();
    for (const Tensor& t : outs) {
      out_shapes_[i].push_back(t.shape());
      out_dtypes_[i].push_back(t.dtype());
      out_formats_[i].push_back(t.memory_format());
    }
    values[i] = std::move(outs);
    // Free activations nobody else needs (backward keeps what it needs in saved_).
    for (const auto& [p, k] : node_inputs_[i]) {
      const auto ku = static_cast<size_t>(k);
      if (--remaining[p][ku] == 0 && !pinned_[p][ku]) values[p][ku] = Tensor();
    }
    for (size_t k = 0; k < values[i].size(); ++k) {
      if (remaining[i][k] == 0 && !pinned_[i][k]) values[i][k] = Tensor();
    }
    if (!keep) saved_[i] = SavedState{};
  }
  have_saved_ = keep;

  std::vector<Tensor> result;
  for (size_t o = 0; o < outputs_.size(); ++o) {
    const Tensor& out = values[output_node_[o]][static_cast<size_t>(outputs_[o].index)];
    result.push_back((rc.half_outputs ? out : convert(out, cdt, DType::f32)).contiguous());
  }
  return result;
}

std::vector<Tensor> Network::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                      const GradientHook& hook) {
  prepare(nullptr);
  TNT_CHECK(have_saved_,
            "network '{}': backward() needs a forward() with rc.training (or keep_for_backward) "
            "just before it",
            name_);
  TNT_INPUT_CHECK(grad_outputs.size() == outputs_.size(), "network '{}' has {} outputs, backward() got {} gradients",
                  name_, outputs_.size(), grad_outputs.size());
  const size_t n = nodes_.size();
  std::vector<std::vector<Tensor>> grads(n);  // per node output: d(loss)/d(output), summed
  for (size_t i = 0; i < n; ++i) grads[i].resize(nodes_[i]->shapes.size());
  for (size_t o = 0; o < outputs_.size(); ++o) {
    if (!grad_outputs[o].defined()) continue;
    const size_t p = output_node_[o];
    const auto k = static_cast<size_t>(outputs_[o].index);
    const Shape& want = p < inputs_.size() ? grad_outputs[o].shape() : out_shapes_[p][k];
    TNT_INPUT_CHECK(grad_outputs[o].shape() == want, "network '{}': gradient {} has shape {}, output {} has {}", name_,
                    o, shape_str(grad_outputs[o].shape()), o, shape_str(want));
    // The outputs were handed out as f32 (or, with RunContext::half_outputs, in the compute
    // dtype); inside, gradients travel in the compute dtype (also for an output that is a
    // network input, which forward() cast on entry).
    TNT_INPUT_CHECK(compute_dtype_ == DType::f32 || grad_outputs[o].dtype() == DType::f32 ||
                        grad_outputs[o].dtype() == compute_dtype_,
                    "network '{}': gradient {} is {}; a network in mixed precision takes f32 gradients (or {}, its "
                    "compute dtype) for its outputs",
                    name_, o, grad_outputs[o].str(), dtype_name(compute_dtype_));
    const DType want_dtype = p < inputs_.size()
                                 ? (inputs_[p].dtype() == DType::f32 ? compute_dtype_ : inputs_[p].dtype())
                                 : out_dtypes_[p][k];
    accumulate(grads[p][k], convert(grad_outputs[o], DType::f32, want_dtype), out_formats_[p][k]);
  }
  RunContext lrc = rc;  // what the layers see
  lrc.memory_format = memory_format_;
  const DType cdt = compute_dtype_;
  const bool emulating = cdt != DType::f32 && device_.is_cpu();  // see forward
  // Hook indices are positions in trainable_parameters(), counted now: a program may freeze
  // or unfreeze a parameter (Parameter::trainable) after the network was made.
  std::vector<size_t> first_trainable;  // per layer
  if (hook) first_trainable = first_trainable_of_layers();

  detail::FusionPlan* fusion = fusion_active() ? fusion_plan() : nullptr;
  for (size_t i = n; i-- > inputs_.size();) {
    Layer* layer = nodes_[i]->layer;
    std::vector<Tensor>& g = grads[i];
    const int chain = fusion != nullptr ? fusion->chain_of_node[i] : -1;
    if (chain >= 0) {
      // The whole chain at its last member; the others have nothing left to do.
      detail::FusedChain& c = fusion->chains[static_cast<size_t>(chain)];
      if (c.nodes.back() == i) backward_chain(c, grads, lrc);
    } else if (std::any_of(g.begin(), g.end(), [](const Tensor& t) { return t.defined(); })) {
      for (size_t k = 0; k < g.size(); ++k) {
        // In the format of output k (accumulate put it there), contiguous for a layer without
        // channels_last support (whose outputs are contiguous anyway).
        if (!g[k].defined()) g[k] = Tensor::zeros(out_shapes_[i][k], out_dtypes_[i][k], device_, out_formats_[i][k]);
        g[k] = for_layer(*layer, g[k]);
      }
      const bool emulate = emulating && !layer->cpu_computes_in(cdt);
      if (emulate) {
        for (Tensor& t : g) t = convert(t, cdt, DType::f32);
      }
      std::vector<Tensor> gin = detail::in_layer([&] { return detail::layer_label(*layer); }, "backward", g, device_,
                                                 [&] { return layer->backward(g, lrc, saved_[i]); });
      TNT_CHECK(gin.size() == node_inputs_[i].size(),
                "layer '{}' ({}) returned {} input gradients for {} inputs", layer->name(),
                layer->type(), gin.size(), node_inputs_[i].size());
      if (emulate) {
        for (Tensor& t : gin) t = convert(t, DType::f32, cdt);
      }
      for (size_t j = 0; j < gin.size(); ++j) {
        if (!gin[j].defined()) continue;
        const auto& [p, k] = node_inputs_[i][j];
        const auto ku = static_cast<size_t>(k);
        TNT_INPUT_CHECK(gin[j].shape() == out_shapes_[p][ku],
                        "layer '{}' ({}) in network '{}': its backward returned a gradient of shape {} for input {}, "
                        "which has shape {}",
                        layer->name(), layer->type(), name_, shape_str(gin[j].shape()), j,
                        shape_str(out_shapes_[p][ku]));
        accumulate(grads[p][ku], gin[j], out_formats_[p][ku]);
      }
    }
    saved_[i] = SavedState{};
    g.clear();
    const size_t l = layer_of_node_[i];
    if (hook && first_node_of_layer_[l] == i) {
      // This was the layer's first call, hence its last backward: its gradients are final.
      size_t index = first_trainable[l];
      for (Parameter* param : layer->parameters()) {
        if (param->trainable) hook(index++, *param);
      }
    }
  }
  have_saved_ = false;

  std::vector<Tensor> input_grads;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    input_grads.push_back(convert(grads[i][0], cdt, DType::f32).contiguous());
  }
  return input_grads;
}

void Network::set_compute_dtype(DType dtype) {
  TNT_INPUT_CHECK(dtype == DType::f32 || is_half(dtype),
                  "network '{}': compute dtype {} is not supported (f32, bf16 or f16)", name_, dtype_name(dtype));
  compute_dtype_ = dtype;
  have_saved_ = false;  // a state saved in the other dtype must not meet this backward
  if (dtype == DType::f32) {  // free the copies (layers_ is empty until the graph exists)
    for (Layer* layer : layers_) {
      for (Parameter* p : layer->parameters()) p->compute = Tensor();
    }
  }
}

void Network::set_memory_format(MemoryFormat format) {
  TNT_INPUT_CHECK(format == MemoryFormat::contiguous || format == MemoryFormat::channels_last,
                  "network '{}': memory format {} is unknown", name_, static_cast<int>(format));
  if (format == MemoryFormat::channels_last && has_graph()) check_memory_format();  // before: a refusal changes nothing
  memory_format_ = format;
  have_saved_ = false;  // a state saved in the other format must not meet this backward
}

void Network::check_memory_format() const {
  for (size_t i = inputs_.size(); i < nodes_.size(); ++i) {
    const Layer* layer = nodes_[i]->layer;
    if (!layer->supports_memory_format(MemoryFormat::channels_last)) continue;
    bool four_d = std::any_of(nodes_[i]->shapes.begin(), nodes_[i]->shapes.end(),
                              [](const Shape& s) { return s.size() == 4; });
    for (const auto& [p, k] : node_inputs_[i]) {
      const std::vector<Shape>& shapes = nodes_[p]->shapes;
      four_d = four_d || shapes[static_cast<size_t>(k)].size() == 4;
    }
    if (four_d) return;
  }
  TNT_INPUT_ERROR("network '{}': memory format channels_last changes nothing here: none of its layers that support "
                  "it (Conv2D, BatchNorm, pooling, element-wise activations, Add) has a 4-D input or output; keep "
                  "channels_first (contiguous)",
                  name_);
}

// The compute-dtype copies of the weights, from the f32 masters, before every forward: the
// optimizer may have changed the masters, and a cast of all of ResNet-50's weights costs
// about as much as one of its smaller convolutions.
// On a GPU the casts of one device go in one launch (backend::cuda_cast_spans: the same
// rounding as copy_cast's), not one per weight.
void Network::refresh_compute_copies() {
  std::map<int, std::vector<backend::CastSpan>> device_spans;
  std::set<const void*> seen;  // a weight shared by two layers is cast once
  for (Layer* layer : layers_) {
    // On the CPU only the layers that compute in the compute dtype multiply by the copies.
    if (device_.is_cpu() && !layer->cpu_computes_in(compute_dtype_)) continue;
    for (Parameter* p : layer->parameters()) {
      if (!p->cast_for_compute || p->value.dtype() == compute_dtype_) continue;
      if (!p->compute.defined() || p->compute.dtype() != compute_dtype_ || p->compute.shape() != p->value.shape() ||
          p->compute.device() != p->value.device()) {
        p->compute = Tensor::empty(p->value.shape(), compute_dtype_, p->value.device());
      }
      if (!seen.insert(p->compute.raw()).second) continue;
      const bool batched = config().cuda_batched_spans && p->value.device().is_cuda() && p->value.dtype() == DType::f32 &&
                           (compute_dtype_ == DType::bf16 || compute_dtype_ == DType::f16) &&
                           p->value.memory_format() == p->compute.memory_format();
      if (batched) {
        device_spans[p->value.device().index].push_back(
            {static_cast<const float*>(p->value.raw()), p->compute.raw(), p->value.numel(), compute_dtype_});
      } else {
        ops::copy_cast(p->value, p->compute);
      }
    }
  }
  for (const auto& [device, spans] : device_spans) backend::cuda_cast_spans(spans, device, cast_spans_cache_);
}

}  // namespace tnt
