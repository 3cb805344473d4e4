// Position encoding (see position_encoding.hpp): the table is built on the host in double
// and cached per (T, D) and device, so both engines add the very same float values.
#include "tarantella/layers/position_encoding.hpp"
#include "nn/layer_types.hpp"

#include "backend/dispatch.hpp"
#include "layers/position_encoding_cuda.hpp"

#include <cmath>
#include <map>
#include <utility>

namespace tnt {

Tensor position_encoding(int64_t length, int64_t hidden_size, double min_timescale, double max_timescale) {
  TNT_CHECK(length >= 0 && hidden_size > 0 && hidden_size % 2 == 0,
            "position_encoding: length {} must be >= 0 and the hidden size {} positive and even", length, hidden_size);
  const int64_t n = hidden_size / 2;
  const double inc = std::log(max_timescale / min_timescale) / static_cast<double>(std::max<int64_t>(n - 1, 1));
  Tensor p = Tensor::empty({length, hidden_size}, DType::f32);  // (T, D)
  float* ps = p.data<float>();
  for (int64_t t = 0; t < length; ++t) {
    for (int64_t k = 0; k < n; ++k) {
      const double angle = static_cast<double>(t) * min_timescale * std::exp(-static_cast<double>(k) * inc);
      ps[t * hidden_size + k] = static_cast<float>(std::sin(angle));
      ps[t * hidden_size + n + k] = static_cast<float>(std::cos(angle));
    }
  }
  return p;
}

namespace {
struct TableCache {
  std::map<std::pair<int64_t, int64_t>, Tensor> tables;
};
}  // namespace

PositionEncoding::PositionEncoding(std::string name) : Layer(std::move(name)) { default_name("position_encoding"); }

std::vector<Shape> PositionEncoding::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1 && in[0].size() == 3 && in[0][2] % 2 == 0,
            "PositionEncoding '{}': expects one input (B, T, D) with D even, got {}", name_,
            in.empty() ? std::string("none") : shape_str(in[0]));
  return {in[0]};
}

const Tensor& PositionEncoding::table(int64_t length, int64_t hidden_size, Device device) {
  std::shared_ptr<void>& slot = engine_cache(device.kind);
  if (!slot) slot = std::make_shared<TableCache>();
  auto& tables = std::static_pointer_cast<TableCache>(slot)->tables;
  auto it = tables.find({length, hidden_size});
  if (it == tables.end() || it->second.device() != device) {
    Tensor host = position_encoding(length, hidden_size);
    tables[{length, hidden_size}] = device.is_cpu() ? host : host.to(device);
    it = tables.find({length, hidden_size});
  }
  return it->second;
}

std::vector<Tensor> PositionEncoding::forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                                              SavedState& saved) {
  check_inputs(inputs, 1);
  const Tensor& x = inputs[0];  // (B, T, D)
  output_shapes({x.shape()});
  ensure_built({x.shape()});
  TNT_CUDA_DISPATCH(x.device(), cuda::position_encoding_forward(*this, inputs, rc, saved));
  const int64_t td = x.dim(1) * x.dim(2), n = x.numel();
  const float* p = table(x.dim(1), x.dim(2), x.device()).data<float>();  // (T, D)
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) ys[i] = xs[i] + p[i % td];
  saved.tensors.clear();
  return {y};
}

std::vector<Tensor> PositionEncoding::backward(const std::vector<Tensor>& grad_outputs, const RunContext&,
                                               SavedState&) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "PositionEncoding '{}': backward needs one gradient",
            name_);
  return {grad_outputs[0].clone()};
}

// Model files (nn/layer_types.hpp).
namespace {
const auto kPositionEncoding = detail::LayerTypeRegistration::plain<PositionEncoding>("PositionEncoding");
}  // namespace

}  // namespace tnt
