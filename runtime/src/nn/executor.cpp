// Running the graph: forward in the network's topological order, backward in the reverse
// one, with the mixed-precision casts at the edges (see Network::set_compute_dtype).
//
// Memory: an activation is dropped as soon as its last consumer has run (unless it is a
// network output); what backward needs is in each call's SavedState. Gradients of one
// tensor from several consumers are summed out of place, because a layer may return the
// caller's tensor or a view of it (Flatten, Sum) as its input gradient.
//
// The gradient hook fires for a layer's parameters right after the backward of its FIRST
// call in the order, its last backward in this pass: from there on nothing writes them.
#include "nn/graph_node.hpp"

#include "tarantella/check.hpp"
#include "tarantella/ops.hpp"

#include <algorithm>

namespace tnt {

namespace {

void accumulate(Tensor& slot, const Tensor& grad) {
  // Out of place: grad may be the caller's tensor or a view (Flatten) of another gradient.
  slot = slot.defined() ? ops::add(slot, grad) : grad;
}

// t in dtype `to` when t is floating in dtype `from`; anything else unchanged.
Tensor convert(const Tensor& t, DType from, DType to) {
  return t.defined() && t.dtype() == from && from != to ? ops::cast(t, to) : t;
}

}  // namespace

std::vector<Tensor> Network::forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                                     std::optional<bool> keep_for_backward) {
  prepare(&inputs);
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
    TNT_INPUT_CHECK(ok, "network '{}': input {} ('{}') has shape {}, expected {}", name_, i, what,
                    shape_str(t.shape()), detail::sym_shape_str(want));
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
  const bool emulate = mixed && device_.is_cpu();  // CPU engines compute in f32
  if (mixed && device_.is_cuda()) refresh_compute_copies();

  const size_t n = nodes_.size();
  std::vector<std::vector<Tensor>> values(n);          // per node: its outputs, while needed
  std::vector<std::vector<int>> remaining = consumers_;  // per node output: uses still to run
  for (size_t i = 0; i < inputs_.size(); ++i) values[i] = {convert(inputs[i], DType::f32, cdt)};
  std::vector<Tensor> args;
  for (size_t i = inputs_.size(); i < n; ++i) {
    Layer* layer = nodes_[i]->layer;
    args.clear();
    for (const auto& [p, k] : node_inputs_[i]) args.push_back(values[p][static_cast<size_t>(k)]);
    saved_[i] = SavedState{};
    if (!input_gradients_) {
      // A layer fed only by the network's inputs (the first convolution on the images) need
      // not compute gradients that nobody asked for.
      bool only_inputs = true;
      for (const auto& [p, k] : node_inputs_[i]) only_inputs = only_inputs && p < inputs_.size();
      saved_[i].need_input_grads = !only_inputs;
    }
    if (emulate) {
      for (Tensor& a : args) a = convert(a, cdt, DType::f32);
    }
    std::vector<Tensor> outs = layer->forward(args, rc, saved_[i]);
    if (emulate) {
      for (Tensor& o : outs) o = convert(o, DType::f32, cdt);
    }
    TNT_CHECK(outs.size() == nodes_[i]->shapes.size(),
              "layer '{}' ({}) returned {} outputs, its call in network '{}' has {}", layer->name(),
              layer->type(), outs.size(), name_, nodes_[i]->shapes.size());
    args.clear();
    out_shapes_[i].clear();
    out_dtypes_[i].clear();
    for (const Tensor& t : outs) {
      out_shapes_[i].push_back(t.shape());
      out_dtypes_[i].push_back(t.dtype());
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
    result.push_back(convert(values[output_node_[o]][static_cast<size_t>(outputs_[o].index)], cdt, DType::f32));
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
    // The outputs were handed out as f32; inside, gradients travel in the compute dtype
    // (also for an output that is a network input, which forward() cast on entry).
    TNT_INPUT_CHECK(compute_dtype_ == DType::f32 || grad_outputs[o].dtype() == DType::f32,
                    "network '{}': gradient {} is {}; a network in mixed precision takes f32 gradients for its outputs",
                    name_, o, grad_outputs[o].str());
    const DType want_dtype = p < inputs_.size()
                                 ? (inputs_[p].dtype() == DType::f32 ? compute_dtype_ : inputs_[p].dtype())
                                 : out_dtypes_[p][k];
    accumulate(grads[p][k], convert(grad_outputs[o], DType::f32, want_dtype));
  }
  const DType cdt = compute_dtype_;
  const bool emulate = cdt != DType::f32 && device_.is_cpu();
  // Hook indices are positions in trainable_parameters(), counted now: a program may freeze
  // or unfreeze a parameter (Parameter::trainable) after the network was made.
  std::vector<size_t> first_trainable;  // per layer
  if (hook) first_trainable = first_trainable_of_layers();

  for (size_t i = n; i-- > inputs_.size();) {
    Layer* layer = nodes_[i]->layer;
    std::vector<Tensor>& g = grads[i];
    if (std::any_of(g.begin(), g.end(), [](const Tensor& t) { return t.defined(); })) {
      for (size_t k = 0; k < g.size(); ++k) {
        if (!g[k].defined()) g[k] = Tensor::zeros(out_shapes_[i][k], out_dtypes_[i][k], device_);
      }
      if (emulate) {
        for (Tensor& t : g) t = convert(t, cdt, DType::f32);
      }
      std::vector<Tensor> gin = layer->backward(g, rc, saved_[i]);
      TNT_CHECK(gin.size() == node_inputs_[i].size(),
                "layer '{}' ({}) returned {} input gradients for {} inputs", layer->name(),
                layer->type(), gin.size(), node_inputs_[i].size());
      if (emulate) {
        for (Tensor& t : gin) t = convert(t, DType::f32, cdt);
      }
      for (size_t j = 0; j < gin.size(); ++j) {
        if (!gin[j].defined()) continue;
        const auto& [p, k] = node_inputs_[i][j];
        accumulate(grads[p][static_cast<size_t>(k)], gin[j]);
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
  for (size_t i = 0; i < inputs_.size(); ++i) input_grads.push_back(convert(grads[i][0], cdt, DType::f32));
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
  memory_format_ = format;
  have_saved_ = false;
}

// The compute-dtype copies of the weights, from the f32 masters, before every forward: the
// optimizer may have changed the masters, and a cast of all of ResNet-50's weights costs
// about as much as one of its smaller convolutions.
void Network::refresh_compute_copies() {
  for (Layer* layer : layers_) {
    for (Parameter* p : layer->parameters()) {
      if (!p->cast_for_compute || p->value.dtype() == compute_dtype_) continue;
      if (!p->compute.defined() || p->compute.dtype() != compute_dtype_ || p->compute.shape() != p->value.shape() ||
          p->compute.device() != p->value.device()) {
        p->compute = Tensor::empty(p->value.shape(), compute_dtype_, p->value.device());
      }
      ops::copy_cast(p->value, p->compute);
    }
  }
}

}  // namespace tnt
