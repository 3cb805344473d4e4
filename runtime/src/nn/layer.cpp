#include "tarantella/layer.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "tarantella/check.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>

namespace tnt {

const Tensor& compute_value(const Parameter& param, DType dtype, const std::string& layer_name) {
  if (param.value.dtype() == dtype) return param.value;
  const Tensor& c = param.compute;
  TNT_CHECK(c.defined() && c.dtype() == dtype && c.shape() == param.value.shape() &&
                c.device() == param.value.device(),
            "layer '{}': parameter '{}' is {} but the layer computes in {} and has no {} copy of it "
            "(mixed precision needs Network::set_compute_dtype, which keeps these copies)",
            layer_name, param.name, param.value.str(), dtype_name(dtype), dtype_name(dtype));
  return c;
}

Layer::Layer(std::string name) : name_(std::move(name)) {}

void Layer::default_name(const std::string& prefix) {
  if (!name_.empty()) return;
  static std::mutex mutex;
  static std::map<std::string, int64_t> counters;  // names only; never part of the numerics
  std::lock_guard<std::mutex> lock(mutex);
  int64_t k = counters[prefix]++;
  name_ = k == 0 ? prefix : fmt::format("{}_{}", prefix, k);
  default_name_ = true;
}

void Layer::ensure_built(const std::vector<Shape>& input_shapes) {
  if (built_) return;
  build(input_shapes);
  built_ = true;
}

std::vector<std::pair<std::string, Parameter*>> Layer::named_parameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (const auto& p : params_) out.emplace_back(name_ + "." + p->name, p.get());
  for (const LayerPtr& child : children_) {
    for (auto& [n, p] : child->named_parameters()) out.emplace_back(name_ + "." + n, p);
  }
  return out;
}

std::vector<std::pair<std::string, Parameter*>> Layer::named_buffers() {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (const auto& p : buffers_) out.emplace_back(name_ + "." + p->name, p.get());
  for (const LayerPtr& child : children_) {
    for (auto& [n, p] : child->named_buffers()) out.emplace_back(name_ + "." + n, p);
  }
  return out;
}

std::vector<Parameter*> Layer::parameters() {
  std::vector<Parameter*> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<Parameter*> Layer::buffers() {
  std::vector<Parameter*> out;
  for (auto& [n, p] : named_buffers()) out.push_back(p);
  return out;
}

void Layer::initialize(uint64_t seed) {
  for (auto& [n, p] : named_parameters()) p->initializer.apply(p->value, seed, n);
  for (auto& [n, p] : named_buffers()) p->initializer.apply(p->value, seed, n);
}

void Layer::zero_grad() {
  for (Parameter* p : parameters()) {
    if (p->grad.defined()) p->grad.zero_();
  }
}

void Layer::to(Device device) {
  auto move = [&](Parameter& p) {
    if (p.value.defined() && p.value.device() != device) p.value = p.value.to(device);
    if (p.grad.defined() && p.grad.device() != device) p.grad = p.grad.to(device);
    if (p.compute.defined() && p.compute.device() != device) p.compute = Tensor();  // remade by the network
  };
  for (auto& p : params_) move(*p);
  for (auto& p : buffers_) move(*p);
  for (const LayerPtr& child : children_) child->to(device);
  device_ = device;
}

int64_t Layer::parameter_count() {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

Parameter& Layer::add_parameter(const std::string& local_name, const Shape& shape, Initializer init, DType dtype) {
  for (const auto& p : params_) TNT_CHECK(p->name != local_name, "layer '{}': parameter '{}' added twice", name_, local_name);
  auto p = std::make_unique<Parameter>();
  p->name = local_name;
  p->value = Tensor::zeros(shape, dtype, device_);
  p->grad = Tensor::zeros(shape, dtype, device_);
  p->initializer = init;
  p->trainable = true;
  // Usable before initialize(seed) (a BatchNorm weight of zero would silence the layer);
  // initialize(seed) draws again under the full names.
  p->initializer.apply(p->value, 0, name_ + "." + local_name);
  params_.push_back(std::move(p));
  return *params_.back();
}

Parameter& Layer::add_buffer(const std::string& local_name, const Shape& shape, Initializer init, DType dtype) {
  for (const auto& p : buffers_) TNT_CHECK(p->name != local_name, "layer '{}': buffer '{}' added twice", name_, local_name);
  auto p = std::make_unique<Parameter>();
  p->name = local_name;
  p->value = Tensor::zeros(shape, dtype, device_);
  p->initializer = init;
  p->trainable = false;
  p->initializer.apply(p->value, 0, name_ + "." + local_name);
  buffers_.push_back(std::move(p));
  return *buffers_.back();
}

Layer& Layer::add_child(LayerPtr child) {
  TNT_CHECK(child, "layer '{}': add_child of a null layer", name_);
  for (const LayerPtr& c : children_)
    TNT_CHECK(c->name() != child->name(), "layer '{}': two children named '{}'", name_, child->name());
  children_.push_back(std::move(child));
  return *children_.back();
}

void Layer::check_inputs(const std::vector<Tensor>& inputs, size_t count) const {
  if (count > 0) {
    TNT_CHECK(inputs.size() == count, "layer '{}' ({}): expects {} input(s), got {}", name_, type(), count,
              inputs.size());
  } else {
    TNT_CHECK(!inputs.empty(), "layer '{}' ({}): no inputs", name_, type());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    TNT_CHECK(t.defined(), "layer '{}' ({}): input {} is undefined", name_, type(), i);
    DType dt = t.dtype();
    TNT_CHECK(dt == DType::f32 || is_half(dt),
              "layer '{}' ({}): input {} is {}, expected a floating tensor", name_, type(), i, t.str());
    if (t.device().is_cpu() && !cpu_computes_in(dt)) {
      // Only Conv2D and Dense take bf16 on the CPU, and only where TNT_CPU_BF16 lets them.
      const std::string why = dt == DType::bf16 ? cpu::emulation_reason(dt) : "";
      TNT_THROW("layer '{}' ({}): input {} is {}; this layer's CPU engine computes in f32 (on a CPU only Conv2D and "
                "Dense take bf16, and only where they multiply in bf16{})",
                name_, type(), i, t.str(), why.empty() ? "" : ": not here, " + why);
    }
    TNT_CHECK(t.device() == inputs[0].device(), "layer '{}' ({}): inputs on different devices ({} and {})", name_,
              type(), inputs[0].device().str(), t.device().str());
  }
  if (!params_.empty() || !buffers_.empty()) {
    TNT_CHECK(inputs[0].device() == device_,
              "layer '{}' ({}): its weights are on {} but its input is on {} (move the model with to())", name_,
              type(), device_.str(), inputs[0].device().str());
  }
}

}  // namespace tnt
