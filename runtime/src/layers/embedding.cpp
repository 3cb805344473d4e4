// Embedding with shared weights on the CPU (see embedding.hpp for the semantics). Lookup:
// a copy of rows; its weight gradient is a scatter-add, done by threads that each own a
// block of hidden columns and walk the rows in order (race-free and deterministic).
// Projection: oneDNN matmuls as Dense without bias.
#include "tarantella/layers/embedding.hpp"
#include "nn/layer_types.hpp"

#include "backend/dispatch.hpp"
#include "layers/embedding_cuda.hpp"
#include "layers/matmul_cpu.hpp"

#include <cmath>

namespace tnt {

namespace {

bool is_id_type(DType d) { return d == DType::i32 || d == DType::i64; }

int64_t id_at(const Tensor& ids, int64_t i) {
  return ids.dtype() == DType::i32 ? ids.data<int32_t>()[i] : ids.data<int64_t>()[i];
}

}  // namespace

namespace detail {

// Every id of a host id tensor in [0, vocab), else an InputError naming the first bad one.
void check_ids(const Tensor& ids, int64_t vocab, const std::string& layer) {
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = id_at(ids, i);
    TNT_INPUT_CHECK(id >= 0 && id < vocab, "Embedding '{}': token id {} at position {} is outside the vocabulary [0, {})",
                    layer, id, i, vocab);
  }
}

}  // namespace detail

Embedding::Embedding(int64_t vocab_size, int64_t hidden_size, std::string name)
    : Layer(std::move(name)), vocab_(vocab_size), hidden_(hidden_size) {
  default_name("embedding");
  TNT_INPUT_CHECK(vocab_size > 0 && hidden_size > 0, "Embedding '{}': vocab size {} and hidden size {} must be positive",
            name_, vocab_size, hidden_size);
}

double Embedding::scale() const { return std::sqrt(static_cast<double>(hidden_)); }

Parameter& Embedding::weight() {
  TNT_CHECK(weight_ != nullptr, "Embedding '{}': not built", name_);
  return *weight_;
}

std::vector<Shape> Embedding::output_shapes(const std::vector<Shape>& in) const {
  return output_shapes_for(in, {DType::i64});
}

std::vector<Shape> Embedding::output_shapes_for(const std::vector<Shape>& in, const std::vector<DType>& dtypes) const {
  TNT_CHECK(in.size() == 1 && dtypes.size() == 1, "Embedding '{}': expects one input (ids or activations)", name_);
  Shape out = in[0];
  if (is_id_type(dtypes[0])) {
    out.push_back(hidden_);  // (..., ) ids -> (..., hidden)
  } else {
    TNT_CHECK(!out.empty() && out.back() == hidden_,
              "Embedding '{}': a floating input is projected onto the vocabulary and must end in {} features, got {}",
              name_, hidden_, shape_str(in[0]));
    out.back() = vocab_;  // (..., hidden) -> (..., vocab)
  }
  return {out};
}

void Embedding::build(const std::vector<Shape>&) {
  weight_ = &add_parameter("weight", {vocab_, hidden_}, Initializer::normal(0.0, 1.0 / std::sqrt(hidden_)));
  // Mixed precision: the CUDA projection multiplies by a half copy, and the lookup writes
  // activations in the copy's dtype.
  weight_->cast_for_compute = true;
}

std::vector<Tensor> Embedding::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  TNT_CHECK(inputs.size() == 1 && inputs[0].defined(), "Embedding '{}': expects one defined input", name_);
  const Tensor& x = inputs[0];
  ensure_built({x.shape()});
  TNT_CHECK(x.device() == device_, "Embedding '{}': its weight is on {} but its input is on {}", name_, device_.str(),
            x.device().str());
  const bool lookup = is_id_type(x.dtype());
  if (!lookup) {
    check_inputs(inputs, 1);
    output_shapes_for({x.shape()}, {x.dtype()});
  }
  TNT_CUDA_DISPATCH(x.device(), cuda::embedding_forward(*this, inputs, rc, saved));
  const float* w = weight_->value.data<float>();  // (V, D)
  const int64_t d = hidden_;
  if (lookup) {
    detail::check_ids(x, vocab_, name_);
    const int64_t rows = x.numel();
    Shape out_shape = x.shape();
    out_shape.push_back(d);
    Tensor y = Tensor::empty(out_shape, DType::f32);  // (R, D)
    float* ys = y.data<float>();
    const float s = static_cast<float>(scale());
#pragma omp parallel for schedule(static) if (rows * d > 32768)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = id_at(x, r);
      float* yr = ys + r * d;
      const float* wr = w + id * d;
      if (id == 0) {
        for (int64_t j = 0; j < d; ++j) yr[j] = 0.0f;
      } else {
        for (int64_t j = 0; j < d; ++j) yr[j] = wr[j] * s;
      }
    }
    saved.tensors = {x};
    saved.extra = std::make_shared<bool>(true);
    return {y};
  }
  const int64_t rows = x.numel() / d;
  Shape out_shape = x.shape();
  out_shape.back() = vocab_;
  Tensor logits = Tensor::empty(out_shape, DType::f32);  // (R, V) = x (R, D) W^T (D, V)
  cpu::batched_matmul(x.data<float>(), false, w, true, logits.data<float>(), 1, rows, vocab_, d, false);
  saved.tensors = {x};
  saved.extra = std::make_shared<bool>(false);
  return {logits};
}

std::vector<Tensor> Embedding::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "Embedding '{}': backward needs one gradient",
            name_);
  TNT_CHECK(saved.tensors.size() == 1 && saved.extra, "Embedding '{}': backward without a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::embedding_backward(*this, grad_outputs, rc, saved));
  const bool lookup = *std::static_pointer_cast<bool>(saved.extra);
  const Tensor& x = saved.tensors[0];
  const Tensor& dy = grad_outputs[0];
  const int64_t d = hidden_;
  float* dw = weight_->grad.data<float>();  // (V, D)
  if (lookup) {
    const int64_t rows = x.numel();
    TNT_CHECK(dy.numel() == rows * d && dy.dtype() == DType::f32, "Embedding '{}': gradient {} for {} ids", name_,
              dy.str(), rows);
    const float* g = dy.data<float>();  // (R, D)
    const float s = static_cast<float>(scale());
    // dW[id] += s dy[r] for every r with id != 0. Thread = block of columns, rows in order.
#pragma omp parallel for schedule(static) if (rows * d > 32768)
    for (int64_t j0 = 0; j0 < d; j0 += 32) {
      const int64_t j1 = std::min(d, j0 + 32);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t id = id_at(x, r);
        if (id == 0) continue;
        float* dwr = dw + id * d;
        const float* gr = g + r * d;
        for (int64_t j = j0; j < j1; ++j) dwr[j] += gr[j] * s;
      }
    }
    return {Tensor()};
  }
  const int64_t rows = x.numel() / d;
  TNT_CHECK(dy.numel() == rows * vocab_ && dy.dtype() == DType::f32, "Embedding '{}': gradient {} for logits ({}, {})",
            name_, dy.str(), rows, vocab_);
  Tensor dx;
  if (saved.need_input_grads) {
    dx = Tensor::empty(x.shape(), DType::f32);  // (R, D) = dy (R, V) W (V, D)
    cpu::batched_matmul(dy.data<float>(), false, weight_->value.data<float>(), false, dx.data<float>(), 1, rows, d,
                        vocab_, false);
  }
  // dW (V, D) += dy^T (V, R) x (R, D)
  cpu::batched_matmul(dy.data<float>(), true, x.data<float>(), false, dw, 1, vocab_, d, rows, true);
  return {dx};
}

// Model files (nn/layer_types.hpp).
namespace {
const detail::LayerTypeRegistration kEmbedding(
    "Embedding",
    [](const Layer& l) {
      LayerConfig c;
      c.set_int("vocab_size", detail::layer_as<Embedding>(l).vocab_size());
      c.set_int("hidden_size", detail::layer_as<Embedding>(l).hidden_size());
      return c;
    },
    [](const std::string& name, const LayerConfig& c) -> LayerPtr {
      return std::make_shared<Embedding>(c.get_int("vocab_size"), c.get_int("hidden_size"), name);
    });
}  // namespace

}  // namespace tnt
