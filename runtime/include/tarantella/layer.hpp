// The layer interface. A layer owns its parameters (trainable) and buffers (state such as
// BatchNorm running statistics); both are saved in checkpoints under hierarchical names
// "<layer name>.<local name>" in PyTorch's layouts (conv weight [out, in, kh, kw], linear
// weight [out, in]).
//
// forward/backward take a SavedState that belongs to ONE call site in a graph, so a layer
// used at two places (shared weights, as in the Transformer) keeps two states, and its
// parameter gradients accumulate (+=) over both calls. Each engine (CPU: oneDNN or plain
// C++; CUDA: cuDNN/cuBLAS/our kernels) is chosen by the device of the inputs.
#pragma once

#include "tarantella/init.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tnt {

struct SymTensor;  // a symbolic tensor of the functional API (tarantella/graph.hpp)

struct Parameter {
  std::string name;   // local name: "weight", "bias", "running_mean"
  Tensor value;
  Tensor grad;        // same shape, dtype and device as value; undefined for buffers
  Initializer initializer;
  bool trainable = true;
};

// What a forward or backward pass needs to know besides its inputs.
struct RunContext {
  bool training = false;
  uint64_t seed = 0;     // the run's seed (Dropout keys its mask on seed, layer name, step)
  int64_t step = 0;      // global training step
  Device device;         // the model's device
};

struct SavedState {
  std::vector<Tensor> tensors;   // what backward needs (inputs, outputs, masks, statistics)
  std::shared_ptr<void> extra;   // engine-specific state (primitive caches, descriptors)
};

class Layer {
 public:
  explicit Layer(std::string name = "");
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  virtual std::string type() const = 0;  // "Conv2D", "Dense", ...
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  // Shapes include the batch dimension (its value is whatever the caller gives).
  virtual std::vector<Shape> output_shapes(const std::vector<Shape>& input_shapes) const = 0;
  // Creates parameters and buffers for these input shapes (values are set later by
  // initialize(), from the initialiser, the seed and the full parameter name).
  virtual void build(const std::vector<Shape>& input_shapes) { (void)input_shapes; }
  bool built() const { return built_; }
  void ensure_built(const std::vector<Shape>& input_shapes);

  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                                      SavedState& saved) = 0;
  // Returns one gradient per input (undefined Tensor for inputs without gradient, such
  // as integer labels) and ADDS this call's parameter gradients to Parameter::grad.
  virtual std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                       SavedState& saved) = 0;

  std::vector<Parameter*> parameters();  // trainable and frozen weights, in creation order
  std::vector<Parameter*> buffers();
  // Sets every parameter and buffer from its initialiser keyed by (seed, "<name>.<local>").
  void initialize(uint64_t seed);
  // Moves parameters, gradients and buffers to device.
  virtual void to(Device device);
  Device device() const { return device_; }
  // Number of elements of all parameters.
  int64_t parameter_count() const;

  // Functional API: record a call of this layer on symbolic inputs (graph.hpp).
  SymTensor operator()(const SymTensor& input);
  std::vector<SymTensor> operator()(const std::vector<SymTensor>& inputs);

 protected:
  Parameter& add_parameter(const std::string& local_name, const Shape& shape, Initializer init,
                           DType dtype = DType::f32);
  Parameter& add_buffer(const std::string& local_name, const Shape& shape, Initializer init,
                        DType dtype = DType::f32);

  std::string name_;
  bool built_ = false;
  Device device_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::unique_ptr<Parameter>> buffers_;
};

using LayerPtr = std::shared_ptr<Layer>;

}  // namespace tnt
