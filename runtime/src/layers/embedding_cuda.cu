// Embedding on CUDA (semantics in embedding_cuda.hpp). The lookup's weight gradient sums,
// for each distinct id, its rows in row order: the forward copies the ids to the host (they
// are checked there anyway) and uploads the rows grouped by id, so one thread per (id,
// column) adds a fixed sequence. Projection: cuBLAS products as Dense's.
#include "layers/embedding_cuda.hpp"

#include "backend/cuda/kernels.hpp"
#include "layers/gemm_cuda.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tnt {
namespace detail {
void check_ids(const Tensor& ids, int64_t vocab, const std::string& layer);  // embedding.cpp
}
}  // namespace tnt

namespace tnt::cuda {

namespace {

struct EmbeddingSaved {
  bool lookup = true;
  Tensor x;        // projection: the input (R, D)
  Tensor order;    // lookup: (R') i64, rows with id != 0 grouped by id, each group in row order
  Tensor groups;   // lookup: (G + 1) i64, start of each group in order; groups[G] = R'
  Tensor group_id; // lookup: (G) i64, the id of each group
  int64_t rows = 0;
};

template <typename T, typename I>
__global__ void lookup_kernel(const I* __restrict__ ids,   // (R)
                              const float* __restrict__ w,  // (V, D)
                              T* __restrict__ y,            // (R, D)
                              int64_t rows, int64_t d, float scale) {
  TNT_KERNEL_LOOP(i, rows * d) {
    const int64_t r = i / d, j = i % d;
    const int64_t id = static_cast<int64_t>(ids[r]);
    y[i] = from_float<T>(id == 0 ? 0.0f : w[id * d + j] * scale);
  }
}

template <typename T>
__global__ void scatter_kernel(const T* __restrict__ dy,             // (R, D)
                               const int64_t* __restrict__ order,    // (R')
                               const int64_t* __restrict__ groups,   // (G + 1)
                               const int64_t* __restrict__ group_id, // (G)
                               float* __restrict__ dw,               // (V, D)
                               int64_t num_groups, int64_t d, float scale) {
  TNT_KERNEL_LOOP(i, num_groups * d) {
    const int64_t g = i / d, j = i % d;
    float acc = 0.0f;
    for (int64_t k = groups[g]; k < groups[g + 1]; ++k) acc += to_float(dy[order[k] * d + j]);
    dw[group_id[g] * d + j] += acc * scale;
  }
}

Tensor upload(const std::vector<int64_t>& v, Device device) {
  Tensor host = Tensor::empty({static_cast<int64_t>(v.size())}, DType::i64);
  std::copy(v.begin(), v.end(), host.data<int64_t>());
  return host.to(device);
}

}  // namespace

std::vector<Tensor> embedding_forward(Embedding& layer, const std::vector<Tensor>& inputs, const RunContext& rc,
                                      SavedState& saved) {
  (void)rc;
  const Tensor& x = inputs.at(0);
  const Parameter& weight = layer.weight();
  int device = common_device({&x, &weight.value}, "Embedding");
  const int64_t d = layer.hidden_size(), v = layer.vocab_size();
  auto s = std::make_shared<EmbeddingSaved>();
  if (x.dtype() == DType::i32 || x.dtype() == DType::i64) {
    Tensor ids = x.to(Device::cpu());
    detail::check_ids(ids, v, layer.name());
    const int64_t rows = x.numel();
    // Rows grouped by id (stable: row order within an id), padding rows left out.
    std::vector<int64_t> id(static_cast<size_t>(rows)), order;
    for (int64_t r = 0; r < rows; ++r)
      id[r] = ids.dtype() == DType::i32 ? ids.data<int32_t>()[r] : ids.data<int64_t>()[r];
    for (int64_t r = 0; r < rows; ++r)
      if (id[r] != 0) order.push_back(r);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
    std::vector<int64_t> groups, group_id;
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 0 || id[order[k]] != id[order[k - 1]]) {
        groups.push_back(static_cast<int64_t>(k));
        group_id.push_back(id[order[k]]);
      }
    }
    groups.push_back(static_cast<int64_t>(order.size()));
    s->lookup = true;
    s->rows = rows;
    s->order = upload(order.empty() ? std::vector<int64_t>{0} : order, x.device());
    s->groups = upload(groups, x.device());
    s->group_id = upload(group_id.empty() ? std::vector<int64_t>{0} : group_id, x.device());
    // Half activations when the network keeps a half copy of the weight (mixed precision).
    const DType out_dtype = weight.compute.defined() && is_half(weight.compute.dtype()) ? weight.compute.dtype()
                                                                                        : DType::f32;
    Shape out_shape = x.shape();
    out_shape.push_back(d);
    Tensor y = Tensor::empty(out_shape, out_dtype, x.device());  // (R, D)
    const int64_t n = rows * d;
    if (n > 0) {
      TNT_CUDA_DISPATCH_FLOAT(out_dtype, "Embedding", {
        TNT_CUDA_DISPATCH_LABEL(x.dtype(), "Embedding", {
          lookup_kernel<scalar_t, label_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
              static_cast<const label_t*>(x.raw()), static_cast<const float*>(weight.value.raw()),
              static_cast<scalar_t*>(y.raw()), rows, d, static_cast<float>(layer.scale()));
        });
      });
      TNT_CUDA_CHECK_LAUNCH();
    }
    saved.tensors = {ids};
    saved.extra = s;
    return {y};
  }
  const Tensor& w = compute_value(weight, x.dtype(), layer.name());  // (V, D)
  const int64_t rows = x.numel() / d;
  Shape out_shape = x.shape();
  out_shape.back() = v;
  Tensor logits = Tensor::empty(out_shape, x.dtype(), x.device());  // (R, V) = x W^T
  gemm_rm(device, x.dtype(), x.dtype(), false, true, rows, v, d, 1.0f, x.raw(), 0, w.raw(), 0, 0.0f, logits.raw(), 0);
  s->lookup = false;
  s->x = x;
  s->rows = rows;
  saved.tensors = {x};
  saved.extra = s;
  return {logits};
}

std::vector<Tensor> embedding_backward(Embedding& layer, const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                       SavedState& saved) {
  (void)rc;
  const auto& s = *static_cast<const EmbeddingSaved*>(saved.extra.get());
  const Tensor& dy = grad_outputs.at(0);
  Parameter& weight = layer.weight();
  int device = common_device({&dy, &weight.grad}, "Embedding backward");
  const int64_t d = layer.hidden_size(), v = layer.vocab_size();
  TNT_CHECK(weight.grad.dtype() == DType::f32, "Embedding '{}': the weight gradient must be f32", layer.name());
  if (s.lookup) {
    TNT_CHECK(dy.numel() == s.rows * d, "Embedding '{}': gradient {} for {} ids", layer.name(), dy.str(), s.rows);
    const int64_t num_groups = s.groups.numel() - 1;
    const int64_t n = num_groups * d;
    if (n > 0) {
      TNT_CUDA_DISPATCH_FLOAT(dy.dtype(), "Embedding", {
        scatter_kernel<scalar_t><<<grid_for(n, kBlock, device), kBlock, 0, compute_stream(device)>>>(
            static_cast<const scalar_t*>(dy.raw()), static_cast<const int64_t*>(s.order.raw()),
            static_cast<const int64_t*>(s.groups.raw()), static_cast<const int64_t*>(s.group_id.raw()),
            static_cast<float*>(weight.grad.raw()), num_groups, d, static_cast<float>(layer.scale()));
      });
      TNT_CUDA_CHECK_LAUNCH();
    }
    return {Tensor()};
  }
  const Tensor& x = s.x;  // (R, D)
  const Tensor& w = compute_value(weight, x.dtype(), layer.name());
  TNT_CHECK(dy.numel() == s.rows * v && dy.dtype() == x.dtype(), "Embedding '{}': gradient {} for logits ({}, {})",
            layer.name(), dy.str(), s.rows, v);
  Tensor dx;
  if (saved.need_input_grads) {
    dx = Tensor::empty(x.shape(), x.dtype(), x.device());  // (R, D) = dy (R, V) W (V, D)
    gemm_rm(device, x.dtype(), x.dtype(), false, false, s.rows, d, v, 1.0f, dy.raw(), 0, w.raw(), 0, 0.0f, dx.raw(),
            0);
  }
  // dW (V, D) += dy^T (V, R) x (R, D), accumulated in f32
  gemm_rm(device, x.dtype(), DType::f32, true, false, v, d, s.rows, 1.0f, dy.raw(), 0, x.raw(), 0, 1.0f,
          weight.grad.raw(), 0);
  return {dx};
}

}  // namespace tnt::cuda
