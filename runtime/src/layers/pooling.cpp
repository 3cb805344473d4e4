// Max and average pooling on the CPU: oneDNN pooling on the plain NCHW tensors (max pooling
// keeps oneDNN's workspace, the argmax of each window, for backward), primitives cached per
// shape. GlobalAveragePool: a plain loop.
#include "tarantella/layers/pooling.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "layers/cuda_engines.hpp"

namespace tnt {

namespace {

struct PoolPrims {
  dnnl::pooling_forward::primitive_desc fwd_pd;
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward::primitive_desc bwd_pd;
  dnnl::pooling_backward bwd;
};

std::shared_ptr<PoolPrims> pool_prims(bool max, const Shape& x, const Shape& y, int64_t k, int64_t s, int64_t p) {
  std::string key = fmt::format("pool|{}|{}|{}|{}|{}", max, cpu::key_of(x), k, s, p);
  return cpu::dnnl_cached<PoolPrims>(key, [&] {
    const auto alg = max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
    dnnl::memory::desc src = cpu::plain_desc(x), dst = cpu::plain_desc(y);
    dnnl::memory::dims strides{s, s}, kernel{k, k}, pad{p, p};
    dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, alg, src, dst, strides, kernel, pad, pad);
    dnnl::pooling_forward::primitive_desc fwd_pd(fd, cpu::dnnl_engine());
    dnnl::pooling_backward::desc bd(alg, src, dst, strides, kernel, pad, pad);
    dnnl::pooling_backward::primitive_desc bwd_pd(bd, cpu::dnnl_engine(), fwd_pd);
    return PoolPrims{fwd_pd, dnnl::pooling_forward(fwd_pd), bwd_pd, dnnl::pooling_backward(bwd_pd)};
  });
}

std::vector<Tensor> pool_forward(const Layer& layer, bool max, int64_t k, int64_t s, int64_t p, const Tensor& x,
                                 const Shape& y_shape, SavedState& saved) {
  (void)layer;
  Tensor y = Tensor::empty(y_shape, DType::f32);  // (N, C, Ho, Wo)
  saved.tensors = {x, Tensor()};
  if (x.numel() == 0) return {y};
  auto prims = pool_prims(max, x.shape(), y_shape, k, s, p);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, cpu::wrap(x)}, {DNNL_ARG_DST, cpu::wrap(y)}};
  Tensor ws;
  if (max) args.emplace(DNNL_ARG_WORKSPACE, cpu::scratch(prims->fwd_pd.workspace_desc(), ws));
  cpu::execute(prims->fwd, args);
  saved.tensors = {x, ws};
  saved.extra = prims;
  return {y};
}

std::vector<Tensor> pool_backward(const Layer& layer, bool max, const Shape& y_shape, const Tensor& dy,
                                  SavedState& saved) {
  TNT_CHECK(saved.tensors.size() == 2, "{} '{}': backward without a forward", layer.type(), layer.name());
  const Tensor& x = saved.tensors[0];
  TNT_CHECK(dy.shape() == y_shape && dy.dtype() == DType::f32, "{} '{}': gradient {} for output {}", layer.type(),
            layer.name(), dy.str(), shape_str(y_shape));
  Tensor dx = Tensor::empty(x.shape(), DType::f32);
  if (x.numel() == 0) return {dx};
  auto prims = std::static_pointer_cast<PoolPrims>(saved.extra);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, cpu::wrap(dy)}, {DNNL_ARG_DIFF_SRC, cpu::wrap(dx)}};
  if (max) args.emplace(DNNL_ARG_WORKSPACE, cpu::wrap(saved.tensors[1], prims->bwd_pd.workspace_desc()));
  cpu::execute(prims->bwd, args);
  return {dx};
}

}  // namespace

Pool2DBase::Pool2DBase(int64_t pool_size, int64_t stride, int64_t padding, std::string name)
    : Layer(std::move(name)), pool_(pool_size), stride_(stride == 0 ? pool_size : stride), padding_(padding) {}

std::vector<Shape> Pool2DBase::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1 && in[0].size() == 4, "{} '{}': expects one input (N, C, H, W)", type(), name_);
  const Shape& s = in[0];
  const int64_t ho = (s[2] + 2 * padding_ - pool_) / stride_ + 1;
  const int64_t wo = (s[3] + 2 * padding_ - pool_) / stride_ + 1;
  TNT_CHECK(s[2] + 2 * padding_ >= pool_ && s[3] + 2 * padding_ >= pool_ && ho > 0 && wo > 0,
            "{} '{}': input {} is smaller than the {}x{} window (padding {})", type(), name_, shape_str(s), pool_, pool_,
            padding_);
  return {{s[0], s[1], ho, wo}};
}

namespace {
void check_pool_config(const std::string& type, const std::string& name, int64_t pool, int64_t stride,
                       int64_t padding) {
  TNT_CHECK(pool > 0, "{} '{}': pool_size must be positive, got {}", type, name, pool);
  TNT_CHECK(stride > 0, "{} '{}': stride must be positive (0 = pool_size), got {}", type, name, stride);
  // A window wholly inside the padding would have nothing to pool (PyTorch's rule).
  TNT_CHECK(padding >= 0 && 2 * padding <= pool, "{} '{}': padding {} must lie in [0, pool_size / 2]", type, name,
            padding);
}
}  // namespace

MaxPool2D::MaxPool2D(int64_t pool_size, int64_t stride, int64_t padding, std::string name)
    : Pool2DBase(pool_size, stride, padding, std::move(name)) {
  default_name("max_pool2d");
  check_pool_config("MaxPool2D", name_, pool_, stride_, padding_);
}

std::vector<Tensor> MaxPool2D::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  Shape y_shape = output_shapes({inputs[0].shape()})[0];
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::max_pool2d_forward(*this, inputs, rc, saved));
  return pool_forward(*this, true, pool_, stride_, padding_, inputs[0], y_shape, saved);
}

std::vector<Tensor> MaxPool2D::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && !saved.tensors.empty(),
            "MaxPool2D '{}': backward needs one gradient and a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::max_pool2d_backward(*this, grad_outputs, rc, saved));
  return pool_backward(*this, true, output_shapes({saved.tensors[0].shape()})[0], grad_outputs[0], saved);
}

AvgPool2D::AvgPool2D(int64_t pool_size, int64_t stride, int64_t padding, std::string name)
    : Pool2DBase(pool_size, stride, padding, std::move(name)) {
  default_name("avg_pool2d");
  check_pool_config("AvgPool2D", name_, pool_, stride_, padding_);
}

std::vector<Tensor> AvgPool2D::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  Shape y_shape = output_shapes({inputs[0].shape()})[0];
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::avg_pool2d_forward(*this, inputs, rc, saved));
  return pool_forward(*this, false, pool_, stride_, padding_, inputs[0], y_shape, saved);
}

std::vector<Tensor> AvgPool2D::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && !saved.tensors.empty(),
            "AvgPool2D '{}': backward needs one gradient and a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::avg_pool2d_backward(*this, grad_outputs, rc, saved));
  return pool_backward(*this, false, output_shapes({saved.tensors[0].shape()})[0], grad_outputs[0], saved);
}

GlobalAveragePool::GlobalAveragePool(std::string name) : Layer(std::move(name)) {
  default_name("global_average_pool");
}

std::vector<Shape> GlobalAveragePool::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1 && in[0].size() == 4 && in[0][2] * in[0][3] > 0,
            "GlobalAveragePool '{}': expects one input (N, C, H, W) with H, W > 0", name_);
  return {{in[0][0], in[0][1]}};
}

std::vector<Tensor> GlobalAveragePool::forward(const std::vector<Tensor>& inputs, const RunContext& rc,
                                               SavedState& saved) {
  check_inputs(inputs, 1);
  Shape y_shape = output_shapes({inputs[0].shape()})[0];
  ensure_built({inputs[0].shape()});
  TNT_CUDA_DISPATCH(inputs[0].device(), cuda::global_average_pool_forward(*this, inputs, rc, saved));
  const Tensor& x = inputs[0];
  const int64_t planes = y_shape[0] * y_shape[1], hw = x.dim(2) * x.dim(3);
  Tensor y = Tensor::empty(y_shape, DType::f32);  // (N, C)
  const float* xs = x.data<float>();  // (N*C, H*W)
  float* ys = y.data<float>();
#pragma omp parallel for schedule(static) if (planes * hw > 32768)
  for (int64_t i = 0; i < planes; ++i) {
    float acc = 0;
    for (int64_t j = 0; j < hw; ++j) acc += xs[i * hw + j];
    ys[i] = acc / static_cast<float>(hw);
  }
  saved.tensors.clear();
  saved.extra = std::make_shared<Shape>(x.shape());  // backward needs only the shape
  return {y};
}

std::vector<Tensor> GlobalAveragePool::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                                SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && saved.extra,
            "GlobalAveragePool '{}': backward needs one gradient and a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::global_average_pool_backward(*this, grad_outputs, rc, saved));
  const Shape xs = *std::static_pointer_cast<Shape>(saved.extra);
  const Tensor& dy = grad_outputs[0];
  TNT_CHECK(dy.shape() == Shape({xs[0], xs[1]}) && dy.dtype() == DType::f32,
            "GlobalAveragePool '{}': gradient {} for output ({}, {})", name_, dy.str(), xs[0], xs[1]);
  const int64_t planes = xs[0] * xs[1], hw = xs[2] * xs[3];
  Tensor dx = Tensor::empty(xs, DType::f32);  // (N, C, H, W)
  const float* g = dy.data<float>();
  float* d = dx.data<float>();
  const float inv = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static) if (planes * hw > 32768)
  for (int64_t i = 0; i < planes; ++i)
    for (int64_t j = 0; j < hw; ++j) d[i * hw + j] = g[i] * inv;
  return {dx};
}

}  // namespace tnt
