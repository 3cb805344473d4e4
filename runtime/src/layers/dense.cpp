// Dense on the CPU: three oneDNN matmuls (cached per shape). The weight is stored (units,
// in) as PyTorch's Linear; forward multiplies by its transpose, which for oneDNN is the
// same buffer described with swapped strides. The weight gradient accumulates through a
// sum post-op, so a layer called twice adds both calls' gradients without a temporary.
//
// bf16 (mixed precision on a CPU with bf16 instructions, TNT_CPU_BF16): x, y, dy and dx in
// bf16, multiplied by the network's bf16 copy of the weight with f32 sums; the bias and the
// gradients of the parameters are f32. With an activation or dropout the product is kept in
// f32, the epilogue runs there (as in f32) and the output is rounded once; its gradient is
// widened for the epilogue's backward and rounded to bf16 for the two products.
#include "tarantella/layers/dense.hpp"
#include "nn/layer_types.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "backend/dispatch.hpp"
#include "layers/dense_cuda.hpp"
#include "layers/dense_epilogue.hpp"
#include "layers/dropout_cpu.hpp"
#include "core/half.hpp"
#include "tarantella/ops.hpp"

#include <memory>

namespace tnt {

Dense::Dense(int64_t units, DenseOptions options, std::string name)
    : Layer(std::move(name)), units_(units), options_(options) {
  default_name("dense");
  TNT_INPUT_CHECK(units > 0, "Dense '{}': units must be positive, got {}", name_, units);
  TNT_INPUT_CHECK(options_.dropout >= 0.0 && options_.dropout < 1.0, "Dense '{}': dropout rate {} is not in [0, 1)",
                  name_, options_.dropout);
}

const char* dense_activation_name(DenseActivation a) {
  switch (a) {
    case DenseActivation::linear: return "linear";
    case DenseActivation::relu: return "relu";
  }
  return "?";
}

DenseActivation dense_activation_from_name(const std::string& name) {
  if (name == "linear") return DenseActivation::linear;
  if (name == "relu") return DenseActivation::relu;
  TNT_INPUT_CHECK(false, "Dense: activation '{}' is not one of linear, relu", name);
  return DenseActivation::linear;
}

std::vector<Shape> Dense::output_shapes(const std::vector<Shape>& in) const {
  TNT_INPUT_CHECK(in.size() == 1 && !in[0].empty(), "Dense '{}': expects one input of shape (..., in)", name_);
  Shape out = in[0];
  out.back() = units_;
  return {out};
}

void Dense::build(const std::vector<Shape>& in) {
  TNT_CHECK(in.size() == 1 && !in[0].empty() && in[0].back() > 0,
            "Dense '{}': expects one input of shape (..., in) with in > 0", name_);
  in_features_ = in[0].back();
  weight_ = &add_parameter("weight", {units_, in_features_}, options_.kernel_initializer);
  weight_->cast_for_compute = true;  // mixed precision: the engines multiply by a half copy
  if (options_.use_bias) bias_ = &add_parameter("bias", {units_}, options_.bias_initializer);
}

bool Dense::cpu_computes_in(DType dtype) const {
  return dtype == DType::f32 || (dtype == DType::bf16 && cpu::native_bf16());
}

namespace {
// db (cols) += column sums of g (rows, cols); each thread owns a block of columns, rows in order.
template <class T, class Widen>
void add_column_sums(const T* g, int64_t rows, int64_t cols, float* db, Widen widen) {
  {
    const int64_t n = cols, r = rows;
#pragma omp parallel for schedule(static) if (n * r > 65536)
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
      const int64_t j1 = std::min(n, j0 + 64);
      float acc[64] = {};
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += widen(g[i * n + j]);
      for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
    }
  }
}

// A matmul of bf16 operands where oneDNN has no bf16 on this CPU fails with the knob named.
void dense_matmul(const std::string& name, bool bf16, const dnnl::memory& a, const dnnl::memory& b,
                  const dnnl::memory* bias, const dnnl::memory& c, bool accumulate) {
  cpu::bf16_primitive(fmt::format("Dense '{}'", name), bf16, [&] {
    cpu::matmul(a, b, bias, c, accumulate);
    return 0;
  });
}
}  // namespace

std::vector<Tensor> Dense::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  const Tensor& x = inputs[0];
  ensure_built({x.shape()});
  TNT_INPUT_CHECK(x.ndim() >= 2, "Dense '{}': input {} has no feature dimension: a Dense takes (batch, ..., "
                  "features); a sample of one value is shape (1,), not () (build({{1}}))",
                  name_, x.str());
  TNT_INPUT_CHECK(x.dim(-1) == in_features_, "Dense '{}': input {} does not end in {} features", name_, x.str(),
                  in_features_);
  check_inputs(inputs, 1);
  TNT_CUDA_DISPATCH(x.device(), cuda::dense_forward(*this, inputs, rc, saved));

  const DType dt = x.dtype();
  TNT_CHECK(dt == DType::f32 || dt == DType::bf16, "Dense '{}': the CPU engine takes f32 or bf16, not {}", name_,
            x.str());
  const bool bf16 = dt == DType::bf16;
  const int64_t rows = x.numel() / in_features_;
  Shape out_shape = x.shape();
  out_shape.back() = units_;
  const auto epi = detail::DenseEpilogue::make(*this, rc, out_shape);
  // The product in f32 where an epilogue follows (rounded to bf16 after it), else in x's dtype.
  Tensor y = Tensor::empty(out_shape, epi.any() ? DType::f32 : dt);  // (R, units)
  if (rows > 0) {
    using namespace cpu;
    dnnl::memory a = wrap(x, plain_desc({rows, in_features_}, MemoryFormat::contiguous, dt));  // (R, in)
    // W^T: (in, units) over W's (units, in) buffer
    const dnnl::memory::desc wt({in_features_, units_}, dnnl_type(dt), dnnl::memory::dims{1, in_features_});
    dnnl::memory b = wrap(compute_value(*weight_, dt, name_), wt);
    dnnl::memory c = wrap(y, plain_desc({rows, units_}, MemoryFormat::contiguous, y.dtype()));  // (R, units)
    if (bias_) {
      dnnl::memory bias = wrap(bias_->value, plain_desc({1, units_}));  // (1, units)
      dense_matmul(name_, bf16, a, b, &bias, c, false);
    } else {
      dense_matmul(name_, bf16, a, b, nullptr, c, false);
    }
  }
  saved.tensors = {x};
  saved.extra.reset();
  if (epi.any()) {
    // y > 0 afterwards exactly where the activation was positive and the element kept,
    // which is all the backward needs of ReLU (activation.cpp) and of a kept mask.
    float* ys = y.data<float>();
    const int64_t n = y.numel();
    if (epi.dropout) {
      const bool relu = epi.relu;
      detail::for_each_dropout_keep(epi.key, epi.base, n, epi.rate, [&](int64_t i, bool keep) {
        const float v = relu ? (ys[i] > 0.0f ? ys[i] : 0.0f) : ys[i];
        ys[i] = keep ? v * epi.keep_scale : 0.0f;
      });
    } else {
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) ys[i] = ys[i] > 0.0f ? ys[i] : 0.0f;
    }
    saved.tensors.push_back(y);
    saved.extra = std::make_shared<detail::DenseEpilogue>(epi);
    if (bf16) return {ops::cast(y, DType::bf16)};
  }
  return {y};
}

std::vector<Tensor> Dense::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                    SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "Dense '{}': backward needs one gradient", name_);
  TNT_CHECK(!saved.tensors.empty(), "Dense '{}': backward without a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::dense_backward(*this, grad_outputs, rc, saved));
  const Tensor& x = saved.tensors[0];
  const DType dt = x.dtype();
  const bool bf16 = dt == DType::bf16;
  TNT_CHECK(grad_outputs[0].dtype() == dt, "Dense '{}': gradient {} for an input in {}", name_,
            grad_outputs[0].str(), dtype_name(dt));
  Tensor dy = grad_outputs[0];
  const int64_t rows = x.numel() / in_features_;
  if (saved.extra) {  // the activation's and the dropout's gradient first (see forward)
    const auto& epi = *static_cast<const detail::DenseEpilogue*>(saved.extra.get());
    const Tensor& y = saved.tensors.at(1);
    if (bf16) dy = ops::cast(dy, DType::f32);
    TNT_CHECK(dy.numel() == y.numel() && dy.dtype() == DType::f32, "Dense '{}': gradient {} for output {}", name_,
              dy.str(), y.str());
    Tensor dz = Tensor::empty(y.shape(), DType::f32);
    const float* ys = y.data<float>();
    const float* g = dy.data<float>();
    float* d = dz.data<float>();
    const int64_t n = y.numel();
    const float scale = epi.keep_scale;
    if (epi.relu) {
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) d[i] = ys[i] > 0.0f ? (epi.dropout ? g[i] * scale : g[i]) : 0.0f;
    } else {
      detail::for_each_dropout_keep(epi.key, epi.base, n, epi.rate,
                                    [&](int64_t i, bool keep) { d[i] = keep ? g[i] * scale : 0.0f; });
    }
    dy = dz;
  }
  // The bias gradient sums the f32 gradient where the epilogue made one (before rounding).
  const Tensor dy_sum = dy;
  if (bf16) dy = ops::cast(dy, DType::bf16);  // no copy where it already is bf16
  TNT_CHECK(dy.numel() == rows * units_ && dy.dtype() == dt, "Dense '{}': gradient {} for output ({}, {})", name_,
            dy.str(), rows, units_);
  Tensor dx = saved.need_input_grads ? Tensor::empty(x.shape(), dt) : Tensor();  // (R, in)
  if (rows == 0) return {dx};
  using namespace cpu;
  const auto plain = [dt](const Shape& s) { return plain_desc(s, MemoryFormat::contiguous, dt); };
  if (dx.defined()) {
    // dx (R, in) = dy (R, units) x W (units, in)
    dense_matmul(name_, bf16, wrap(dy, plain({rows, units_})), wrap(compute_value(*weight_, dt, name_)), nullptr,
                 wrap(dx, plain({rows, in_features_})), false);
  }
  // dW (units, in) += dy^T (units, R) x x (R, in)
  dnnl::memory dy_t = wrap(dy, dnnl::memory::desc({units_, rows}, dnnl_type(dt), dnnl::memory::dims{1, units_}));
  dense_matmul(name_, bf16, dy_t, wrap(x, plain({rows, in_features_})), nullptr, wrap(weight_->grad), true);
  if (bias_ && dy_sum.dtype() == DType::bf16) {
    const auto* g = static_cast<const uint16_t*>(dy_sum.raw());
    add_column_sums(g, rows, units_, bias_->grad.data<float>(), [](uint16_t v) { return bf16_to_float(v); });
  } else if (bias_) {
    add_column_sums(dy_sum.data<float>(), rows, units_, bias_->grad.data<float>(), [](float v) { return v; });
  }
  return {dx};
}

// Model files (nn/layer_types.hpp).
namespace {
LayerConfig dense_config(const Layer& layer) {
  const auto& l = detail::layer_as<Dense>(layer);
  LayerConfig c;
  c.set_int("units", l.units());
  c.set_bool("use_bias", l.use_bias());
  c.set_initializer("kernel_initializer", l.options().kernel_initializer);
  c.set_initializer("bias_initializer", l.options().bias_initializer);
  c.set_string("activation", dense_activation_name(l.options().activation));
  c.set_double("dropout", l.options().dropout);
  return c;
}

LayerPtr dense_from(const std::string& name, const LayerConfig& c) {
  DenseOptions o;
  o.use_bias = c.get_bool("use_bias");
  o.kernel_initializer = c.get_initializer("kernel_initializer");
  o.bias_initializer = c.get_initializer("bias_initializer");
  // Model files written before Dense had an activation have neither key.
  if (c.has("activation")) o.activation = dense_activation_from_name(c.get_string("activation"));
  if (c.has("dropout")) o.dropout = c.get_double("dropout");
  return std::make_shared<Dense>(c.get_int("units"), o, name);
}

const detail::LayerTypeRegistration kDense("Dense", dense_config, dense_from);
}  // namespace

}  // namespace tnt
