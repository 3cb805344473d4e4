// The layer interface. A layer owns its parameters (trainable) and buffers (state such as
// BatchNorm running statistics); both are saved in checkpoints under hierarchical names
// "<layer name>.<local name>" in PyTorch's layouts (conv weight [out, in, kh, kw], linear
// weight [out, in]). A composite layer (a Transformer block) registers child layers with
// add_child(); their names nest: "<block>.<child>.<local>".
//
// forward/backward take a SavedState that belongs to ONE call site in a graph, so a layer
// used at two places (shared weights, as in the Transformer) keeps two states, and its
// parameter gradients accumulate (+=) over both calls. Each engine (CPU: oneDNN or plain
// C++; CUDA: cuDNN/cuBLAS/our kernels) is chosen by the device of the inputs; the CPU and
// CUDA engines of one layer never share a SavedState.
//
// Gradients returned by backward are fresh tensors the caller may keep and modify, except
// that a layer which only reshapes (Flatten) returns a view of its grad_output, and Add
// returns its grad_output itself to its first input: copy before writing into those.
#pragma once

#include "tarantella/initializers.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

struct SymTensor;  // a symbolic tensor of the functional API (tarantella/graph.hpp)

struct Parameter {
  std::string name;   // local name: "weight", "bias", "running_mean"
  Tensor value;
  Tensor grad;        // same shape, dtype and device as value; undefined for buffers
  Initializer initializer;
  bool trainable = true;
  // Mixed precision (Network::set_compute_dtype). A layer whose CUDA engine multiplies by
  // this parameter in the compute dtype (Conv2D and Dense weights) sets cast_for_compute;
  // the network then keeps `compute`, a copy of value in the compute dtype, refreshed from
  // value at the start of every forward. value and grad stay f32 (the master weights).
  bool cast_for_compute = false;
  Tensor compute;
};

// The tensor an engine computing in `dtype` multiplies by: value itself when its dtype is
// `dtype`, else the network's compute copy (checked: defined, same shape, that dtype).
const Tensor& compute_value(const Parameter& param, DType dtype, const std::string& layer_name);

// What a forward or backward pass needs to know besides its inputs.
struct RunContext {
  bool training = false;
  uint64_t seed = 0;     // the run's seed (Dropout keys its mask on seed, layer name, step)
  int64_t step = 0;      // global training step
  // Global index of this rank's first sample within the global batch. Dropout offsets its
  // random counters by it, so p ranks on B samples draw the same masks as 1 rank on B.
  int64_t sample_offset = 0;
  Device device;         // the model's device
  // The network's memory format for 4-D activations (Network::set_memory_format): what a
  // Conv2D produces. Layers that keep their input's format (BatchNorm, pooling, the
  // element-wise activations, Add) follow their input instead; a layer that does not
  // support channels_last is given contiguous tensors whatever this says.
  MemoryFormat memory_format = MemoryFormat::contiguous;
  // Mixed precision: the network's floating outputs stay in its compute dtype instead of
  // being widened to f32 at the edge (Network::set_compute_dtype). The Model asks for it
  // in training and evaluation when its loss reads half predictions
  // (Loss::reads_half_predictions): the f32 copy of a Transformer's (tokens, 33,708) logits
  // and their f32 gradient were a step's largest tensors.
  bool half_outputs = false;
};

struct SavedState {
  std::vector<Tensor> tensors;   // what backward needs (inputs, outputs, masks, statistics)
  std::shared_ptr<void> extra;   // engine-specific state (primitive caches, descriptors)
  // The caller sets this to false when no input of this call needs a gradient (a network's
  // first layer: the images); a layer may then skip that work (the input gradient of the
  // first convolution costs as much as its weight gradient) and return undefined tensors.
  bool need_input_grads = true;
};

// A parameter or buffer with its full name, as networks and optimizers list them.
struct NamedParameter {
  std::string name;  // full name: "<layer name>.<local name>"
  Parameter* param;
};

class Layer;
using LayerPtr = std::shared_ptr<Layer>;

// Derives from enable_shared_from_this so that a call through operator() on a layer held by
// shared_ptr lets the network keep it alive.
class Layer : public std::enable_shared_from_this<Layer> {
 public:
  explicit Layer(std::string name = "");
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  virtual std::string type() const = 0;  // "Conv2D", "Dense", ...
  // A layer created without a name gets "<type lowercase>_<k>" (a per-type counter) and
  // has_default_name() true, so a network may rename it (by position, as PyTorch).
  const std::string& name() const { return name_; }
  void set_name(std::string name) {
    name_ = std::move(name);
    default_name_ = false;
  }
  bool has_default_name() const { return default_name_; }

  // Shapes include the batch dimension (its value is whatever the caller gives).
  virtual std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const = 0;
  // What the graph asks when it records a call. A layer whose output shape depends on its
  // inputs' dtypes overrides it (Embedding: integer ids are looked up, floats projected).
  virtual std::vector<Shape> output_shapes_for(const std::vector<Shape>& input_shapes,
                                               const std::vector<DType>& input_dtypes) const {
    (void)input_dtypes;
    return output_shapes(input_shapes);
  }
  // Creates parameters and buffers for these input shapes on device(), drawn from their
  // initialisers with seed 0 so that the layer is usable at once; initialize(seed) draws
  // them again from the run's seed and the full names.
  virtual void build(const std::vector<Shape>& input_shapes) { (void)input_shapes; }
  bool built() const { return built_; }
  // Builds once; forward() calls it, so a layer can be used without an explicit build.
  void ensure_built(const std::vector<Shape>& input_shapes);

  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                                      SavedState& saved) = 0;
  // Returns one gradient per input (undefined Tensor for inputs without gradient, such
  // as integer labels) and ADDS this call's parameter gradients to Parameter::grad.
  virtual std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                       SavedState& saved) = 0;

  // This layer's own and its children's, in creation order (own first).
  std::vector<Parameter*> parameters();  // trainable and frozen weights
  std::vector<Parameter*> buffers();
  // The same with full names "<name>.<local>" ("<name>.<child>.<local>" for children).
  std::vector<std::pair<std::string, Parameter*>> named_parameters();
  std::vector<std::pair<std::string, Parameter*>> named_buffers();
  const std::vector<LayerPtr>& children() const { return children_; }

  // Sets every parameter and buffer from its initialiser keyed by (seed, full name).
  void initialize(uint64_t seed);
  void zero_grad();
  // Moves parameters, gradients and buffers (children's too) to device.
  virtual void to(Device device);
  Device device() const { return device_; }
  // Number of elements of all parameters (not buffers).
  int64_t parameter_count();

  // Whether this layer's engines take and return 4-D tensors in `format` (see tensor.hpp).
  // The executor gives every other layer contiguous inputs and gradients, so a layer that
  // does not override this never sees channels_last; one that does must accept both
  // formats, return gradients in the format of the forward's inputs, and expect output
  // gradients in the format of its outputs (the executor converts them).
  virtual bool supports_memory_format(MemoryFormat format) const { return format == MemoryFormat::contiguous; }
  // Mixed precision on a CPU rank: whether this layer's CPU engine takes and returns
  // activations in `dtype` itself (Conv2D and Dense in bf16, multiplying by the network's
  // bf16 copy of their weights, where TNT_CPU_BF16 and the CPU allow). The executor widens
  // every other layer's inputs to f32 and rounds its outputs back (the emulation).
  virtual bool cpu_computes_in(DType dtype) const { return dtype == DType::f32; }

  // Per-layer cache for an engine (cuDNN descriptors, chosen algorithms); its owner casts.
  std::shared_ptr<void>& engine_cache(Device::Kind kind) {
    return kind == Device::Kind::cuda ? cuda_cache_ : cpu_cache_;
  }

  // Functional API: record a call of this layer on symbolic inputs (graph.hpp).
  SymTensor operator()(const SymTensor& input);
  std::vector<SymTensor> operator()(const std::vector<SymTensor>& inputs);

 protected:
  Parameter& add_parameter(const std::string& local_name, const Shape& shape, Initializer init,
                           DType dtype = DType::f32);
  Parameter& add_buffer(const std::string& local_name, const Shape& shape, Initializer init,
                        DType dtype = DType::f32);
  Layer& add_child(LayerPtr child);
  // Derived constructors call this: gives "<prefix>_<k>" (a per-prefix counter) when the
  // name is empty. Names only: initial weights of unnamed layers therefore depend on the
  // construction order; give names where that matters.
  void default_name(const std::string& prefix);
  // Checks the input count, that each is defined, f32 unless allowed, and on device().
  void check_inputs(const std::vector<Tensor>& inputs, size_t count) const;

  std::string name_;
  bool default_name_ = false;
  bool built_ = false;
  Device device_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::unique_ptr<Parameter>> buffers_;
  std::vector<LayerPtr> children_;
  std::shared_ptr<void> cpu_cache_;
  std::shared_ptr<void> cuda_cache_;
};

}  // namespace tnt
