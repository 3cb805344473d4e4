// The model graph: Keras' functional API and Sequential.
//
//   auto x = tnt::Input({1, 28, 28});
//   auto h = (*conv1)(x);                       // records a call; builds conv1's parameters
//   auto y = (*add)({h, (*shortcut)(x)});       // any DAG: residual connections
//   tnt::Network net({x}, {y}, "resnet");
//
// A call of a layer on symbolic tensors makes a node. The network orders its nodes by a
// depth-first walk from its outputs that puts every node after its inputs (visited in the
// order they were passed), so the order depends only on the graph's structure: the same on
// every rank whatever order the program made its calls in. Forward runs the nodes in that
// order, backward in the reverse one. A layer called at two places (or shared by two
// networks) keeps one SavedState per call, and its parameter gradients add up over its
// calls; they are final after the backward of its FIRST call in this order, which is where
// the gradient hook fires (the Reducer starts communicating there; hooks thus come roughly
// in reverse registration order, the order of the Reducer's buckets).
//
// Names: a layer's name is the prefix of its parameters' full names ("layer1.0.conv1" +
// ".weight"; a composite layer's children add theirs), as in a PyTorch state_dict. Two
// different layers of one network may not share a name. An unnamed layer gets a name when
// a network is made: its position in a Sequential ("0", "1", ... as nn.Sequential), or its
// type and a counter in a functional network ("conv2d", "conv2d_1", ... as Keras).
//
// A network keeps alive every layer it calls that lives in a shared_ptr (Layer derives from
// enable_shared_from_this); a layer that does not (on the stack, a plain member) must
// outlive the networks that use it.
#pragma once

#include "tarantella/layer.hpp"
#include "tarantella/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

namespace detail {
struct GraphNode;
struct FusionPlan;
struct FusedChain;
}

// Whether a network runs chains of layers that one engine call can run as that one call
// (on CUDA BatchNorm -> ReLU and BatchNorm -> Add -> ReLU: cuDNN's fused batch norm on NHWC
// training, and Dropout -> Add; on the CPU the same BatchNorm chains, oneDNN's batch norm
// with its ReLU or one pass for the sum and ReLU, Dropout -> Add, and ReLU -> MaxPool2D
// 2x2). automatic: the chains with an engine on the network's device, unless
// TNT_LAYER_FUSION=0; on: every chain, those without an engine there run layer by layer (for
// tests). A member that is a subclass of its type runs as a layer. Results match the layer-by-layer run up to rounding: cuDNN's
// fused call rounds once where the layers round after each (docs/gpu.md); the CPU's chains
// give the layers' bits.
enum class LayerFusion { automatic, on, off };

// One output of one node. The shape has -1 for the batch dimension (and for every other
// dimension that follows the batch size).
struct SymTensor {
  SymTensor() = default;
  SymTensor(std::shared_ptr<detail::GraphNode> node_, int index_) : node(std::move(node_)), index(index_) {}
  // The one output of a call, so that `SymTensor y = (*add)({a, b});` reads as in Keras;
  // throws when the call has several outputs.
  SymTensor(const std::vector<SymTensor>& outputs);  // NOLINT(google-explicit-constructor)

  std::shared_ptr<detail::GraphNode> node;
  int index = 0;  // which output of the node

  bool defined() const { return node != nullptr; }
  const Shape& shape() const;
  DType dtype() const;
  std::string str() const;  // "(None, 32, 28, 28) f32 from conv1"
};

// A symbolic input: per_sample_shape excludes the batch dimension.
SymTensor Input(const Shape& per_sample_shape, DType dtype = DType::f32, const std::string& name = "");

// Records a call of a layer held by shared_ptr (the network then keeps it alive).
SymTensor call(const LayerPtr& layer, const SymTensor& input);
std::vector<SymTensor> call(const LayerPtr& layer, const std::vector<SymTensor>& inputs);

// hook(trainable_index, param), called for trainable parameters only: trainable_index is
// the position of param in trainable_parameters() at the time of the backward. That is the
// order in which the Model registers gradients with its Reducer, so the index goes to
// Reducer::mark_ready as it is.
using GradientHook = std::function<void(size_t trainable_index, Parameter& param)>;

class Network {
 public:
  Network(const std::vector<SymTensor>& inputs, const std::vector<SymTensor>& outputs,
          std::string name = "network");
  virtual ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  const std::string& name() const { return name_; }

  // Inputs in the order given at construction, with the batch dimension, on device().
  // Keeps every call's SavedState for the following backward when keep_for_backward (by
  // default: rc.training); otherwise each state is dropped as soon as its node has run.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                              std::optional<bool> keep_for_backward = std::nullopt);

  // One gradient per output (an undefined Tensor counts as zeros). ADDS to every
  // parameter's grad (call zero_grad() first) and fires hook once per trainable parameter
  // as soon as its gradient will not be written again in this pass. Returns the gradients
  // of the inputs (undefined where no gradient flows); one may share memory with a tensor of
  // grad_outputs (an Add or Flatten passes its gradient on): copy before writing into either.
  // Releases the saved states.
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                               const GradientHook& hook = nullptr);

  void zero_grad();
  // Mixed precision: dtype f32 (default), bf16 or f16. Floating network inputs (declared
  // f32) are cast to dtype on entry; activations and their gradients are dtype between
  // layers; floating outputs come back as f32, and gradients given for them (f32) are cast
  // to dtype. Parameters and their gradients stay f32 (master weights); a parameter marked
  // cast_for_compute (Conv2D, Dense weights) gets a dtype copy, Parameter::compute,
  // refreshed from value at the start of every forward. On CUDA the engines compute in
  // dtype (tensor cores, f32 accumulation; BatchNorm with f32 statistics and affine
  // parameters, as cuDNN's mixed mode). The CPU engines compute in f32 (the emulation):
  // there each layer's inputs are widened to f32 and its outputs rounded to dtype, so storage
  // rounding and f16 overflow happen as on the GPU while weights and products are not
  // rounded; except in bf16 where the CPU has bf16 instructions (TNT_CPU_BF16), where the
  // layers whose CPU engine takes bf16 (Layer::cpu_computes_in: Conv2D, Dense) multiply by
  // the bf16 copies in oneDNN as a GPU does.
  void set_compute_dtype(DType dtype);
  DType compute_dtype() const { return compute_dtype_; }
  // Memory format of 4-D activations between the layers that support it (default
  // contiguous). channels_last: Conv2D outputs are channels_last, layers that support the
  // format keep it (Layer::supports_memory_format), and the executor converts inputs
  // (forward) and output gradients (backward) of the other layers to contiguous, so
  // conversions happen at the edges of the convolutional part only. Cost: the images in
  // front of the first Conv2D are read by it in either format (it reorders them anyway),
  // and one conversion of the features at each place where a channels_last tensor meets a
  // layer without support (ResNet-50: none, GlobalAveragePool takes it and gives (N, C));
  // backward mirrors it, the gradient of each output being converted to that output's
  // format before its layer's backward, and each input gradient to the format of what it
  // is the gradient of before it is summed. The results equal the contiguous network's up
  // to the summation order the engines pick per format. Network outputs and input gradients
  // come back contiguous; mixed-precision casts keep the format. Parameters keep PyTorch's
  // layouts (checkpoints unchanged); a CUDA Conv2D keeps its own KRSC copy.
  // channels_last is refused (InputError) for a network in which it changes nothing: no
  // layer that supports it has a 4-D input or output (checked here once the graph exists,
  // else at the first forward).
  void set_memory_format(MemoryFormat format);
  MemoryFormat memory_format() const { return memory_format_; }
  // Whether backward() computes the gradients of the network's inputs (default true). The
  // training loop turns it off: then the layers fed only by inputs skip that work and
  // backward() returns undefined tensors for the inputs.
  void set_input_gradients(bool enabled) { input_gradients_ = enabled; }
  // Layer fusion (see LayerFusion); the chains are found again at the next forward.
  void set_layer_fusion(LayerFusion mode);
  // The chains that run fused (0 while fusion is off), and how many of them the last
  // training forward ran through an engine call rather than layer by layer (tests,
  // diagnostics).
  int64_t fused_chains();
  int64_t fused_engine_runs() const;
  // Every parameter (trainable and frozen) and buffer, in registration order: layers in the
  // order of their first call, each layer once, its tensors in creation order.
  std::vector<NamedParameter> named_parameters();
  std::vector<NamedParameter> named_buffers();
  std::vector<NamedParameter> trainable_parameters();  // the subset that optimizers update
  std::vector<Layer*> layers();  // each once, in registration order

  void initialize(uint64_t seed);  // every layer from its initialisers, keyed by full names
  // Set by Model::fit: a Model made on this network later draws its weights again, and says
  // so (the trained weights are lost to it).
  void mark_trained() { trained_ = true; }
  bool trained() const { return trained_; }
  void to(Device device);
  Device device() const { return device_; }
  int64_t parameter_count();
  int64_t trainable_parameter_count();
  std::string summary();

  const std::vector<SymTensor>& inputs();
  const std::vector<SymTensor>& outputs();

 protected:
  explicit Network(std::string name);  // a graph set later (Sequential)
  void set_graph(const std::vector<SymTensor>& inputs, const std::vector<SymTensor>& outputs,
                 bool sequential_names);
  bool has_graph() const { return !nodes_.empty(); }
  // Makes sure the graph exists; inputs are the first forward's inputs, or null.
  virtual void prepare(const std::vector<Tensor>* inputs);
  void refresh_compute_copies();

 private:
  // Refuses channels_last for a graph in which no layer that supports it sees a 4-D tensor.
  void check_memory_format() const;
  // Layer fusion (nn/fusion.cpp): whether it is on now, the chains of the graph (made when
  // needed), and a chain's run at its last member, forward and backward.
  bool fusion_active() const;
  detail::FusionPlan* fusion_plan();
  void forward_chain(detail::FusedChain& chain, std::vector<std::vector<Tensor>>& values,
                     std::vector<std::vector<int>>& remaining, const RunContext& lrc, bool keep);
  void backward_chain(detail::FusedChain& chain, std::vector<std::vector<Tensor>>& grads, const RunContext& lrc);
  // Per layer of layers(): the position in trainable_parameters() of its first trainable
  // parameter (the count of trainable ones before it).
  std::vector<size_t> first_trainable_of_layers();

  std::string name_;
  Device device_;
  std::vector<SymTensor> inputs_, outputs_;
  std::vector<std::shared_ptr<detail::GraphNode>> nodes_;  // topological order, inputs first
  // Per node: (producing node, its output) of each input.
  std::vector<std::vector<std::pair<size_t, int>>> node_inputs_;
  std::vector<std::vector<int>> consumers_;   // per node output: how many inputs it feeds
  std::vector<std::vector<bool>> pinned_;     // per node output: a network output
  std::vector<size_t> output_node_;           // per network output: its node
  std::vector<Layer*> layers_;                // unique, registration order
  std::vector<size_t> layer_of_node_;         // index into layers_ (-1 for inputs)
  std::vector<size_t> first_node_of_layer_;
  std::vector<LayerPtr> owned_;
  std::vector<SavedState> saved_;             // per node, from the last forward
  std::vector<std::vector<Shape>> out_shapes_;  // per node output, from the last forward
  std::vector<std::vector<DType>> out_dtypes_;
  std::vector<std::vector<MemoryFormat>> out_formats_;  // per node output (inputs too): as produced
  bool have_saved_ = false;
  bool input_gradients_ = true;
  bool trained_ = false;
  LayerFusion layer_fusion_ = LayerFusion::automatic;
  std::shared_ptr<detail::FusionPlan> fusion_;  // the graph's chains, made at first need
  // On GPUs: the device tables of zero_grad's and refresh_compute_copies' single launches
  // (backend::cuda_zero_spans, cuda_cast_spans), kept per network.
  std::shared_ptr<void> zero_spans_cache_, cast_spans_cache_;
  DType compute_dtype_ = DType::f32;
  MemoryFormat memory_format_ = MemoryFormat::contiguous;
};

// A stack of single-input, single-output layers. The graph is made on first use: from the
// first forward's input, or from build(). Unnamed layers are named by position.
class Sequential : public Network {
 public:
  explicit Sequential(std::string name = "sequential");
  Sequential(std::vector<LayerPtr> layers, std::string name = "sequential");
  Sequential& add(LayerPtr layer);
  void build(const Shape& per_sample_shape, DType dtype = DType::f32);
  bool is_built() const { return has_graph(); }
  size_t size() const { return pending_.size(); }

 protected:
  void prepare(const std::vector<Tensor>* inputs) override;

 private:
  std::vector<LayerPtr> pending_;
};

}  // namespace tnt
