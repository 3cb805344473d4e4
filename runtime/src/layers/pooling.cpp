// Pooling on the CPU. Max pooling is a plain loop over NCHW planes that records each
// window's argmax (an index within the plane) for backward: on plain NCHW it runs several
// times faster than oneDNN 2.6's pooling, which is built for blocked layouts, and it fixes
// the tie rule (the first maximum in row-major order). Average pooling uses oneDNN
// (primitives cached per shape). GlobalAveragePool: a plain loop.
//
// Memory formats: y and dx take x's format. Channels_last max pooling is its own loop over
// (N, Ho, Wo) with the channels innermost, visiting each window in the same row-major order
// with the same comparisons, so values, ties, NaN rule and argmax (the index within the
// (H, W) plane, laid out like y) are those of the NCHW loop; its backward adds the gradients
// of one input element in the same order too, so both formats give the same bits. Average
// pooling hands oneDNN the NHWC strides.
#include "tarantella/layers/pooling.hpp"
#include "nn/layer_types.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "backend/dispatch.hpp"
#include "layers/max_pool_2x2_cpu.hpp"
#include "layers/pooling_cuda.hpp"

namespace tnt {

namespace {

struct PoolPrims {  // average pooling
  dnnl::pooling_forward::primitive_desc fwd_pd;
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward::primitive_desc bwd_pd;
  dnnl::pooling_backward bwd;
};

std::shared_ptr<PoolPrims> pool_prims(bool max, const Shape& x, const Shape& y, MemoryFormat format, int64_t k,
                                      int64_t s, int64_t p) {
  std::string key = fmt::format("pool|{}|{}|{}|{}|{}|{}", max, cpu::key_of(x), memory_format_name(format), k, s, p);
  return cpu::dnnl_cached<PoolPrims>(key, [&] {
    const auto alg = max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
    dnnl::memory::desc src = cpu::plain_desc(x, format), dst = cpu::plain_desc(y, format);
    dnnl::memory::dims strides{s, s}, kernel{k, k}, pad{p, p};
    dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, alg, src, dst, strides, kernel, pad, pad);
    dnnl::pooling_forward::primitive_desc fwd_pd(fd, cpu::dnnl_engine());
    dnnl::pooling_backward::desc bd(alg, src, dst, strides, kernel, pad, pad);
    dnnl::pooling_backward::primitive_desc bwd_pd(bd, cpu::dnnl_engine(), fwd_pd);
    return PoolPrims{fwd_pd, dnnl::pooling_forward(fwd_pd), bwd_pd, dnnl::pooling_backward(bwd_pd)};
  });
}

// y (P, Ho, Wo) = max over windows of x (P, H, W), P = N * C planes; arg holds the
// winning index within each plane.
void max_pool_plain(const float* x, float* y, int32_t* arg, int64_t planes, int64_t h, int64_t w, int64_t ho,
                    int64_t wo, int64_t k, int64_t s, int64_t p) {
  if (k == 2 && s == 2 && p == 0) {  // the common case, eight windows at a time
    detail::max_pool_2x2_planes(x, y, arg, planes, h, w);
    return;
  }
#pragma omp parallel for schedule(static) if (planes * ho * wo * k * k > 32768)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xp = x + pl * h * w;
    float* yp = y + pl * ho * wo;
    int32_t* ap = arg + pl * ho * wo;
    for (int64_t oh = 0; oh < ho; ++oh) {
      const int64_t h0 = std::max<int64_t>(oh * s - p, 0), h1 = std::min(oh * s - p + k, h);
      for (int64_t ow = 0; ow < wo; ++ow) {
        const int64_t w0 = std::max<int64_t>(ow * s - p, 0), w1 = std::min(ow * s - p + k, w);
        int64_t best_i = h0 * w + w0;
        float best = xp[best_i];
        for (int64_t i = h0; i < h1; ++i) {
          for (int64_t j = w0; j < w1; ++j) {
            const float v = xp[i * w + j];
            if (v > best || (v != v && best == best)) {  // a NaN wins, as in PyTorch
              best = v;
              best_i = i * w + j;
            }
          }
        }
        yp[oh * wo + ow] = best;
        ap[oh * wo + ow] = static_cast<int32_t>(best_i);
      }
    }
  }
}

// dx (P, H, W) = dy (P, Ho, Wo) scattered to the recorded argmax positions. With 2x2
// windows at stride 2 (disjoint) each element is written once instead of zeroed and added
// to, with the same bits.
void max_pool_plain_backward(const float* dy, const int32_t* arg, float* dx, int64_t planes, int64_t h, int64_t w,
                             int64_t ho, int64_t wo, bool disjoint_2x2) {
  if (disjoint_2x2) {
    detail::max_pool_2x2_planes_backward(dy, arg, dx, planes, h, w);
    return;
  }
  const int64_t hw = h * w, ohw = ho * wo;
#pragma omp parallel for schedule(static) if (planes * hw > 32768)
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dp = dx + pl * hw;
    std::fill(dp, dp + hw, 0.0f);
    const float* gp = dy + pl * ohw;
    const int32_t* ap = arg + pl * ohw;
    for (int64_t o = 0; o < ohw; ++o) dp[ap[o]] += gp[o];
  }
}

// Channels_last: y (N, Ho, Wo, C) = max over windows of x (N, H, W, C); arg (N, Ho, Wo, C)
// holds the winning index within the (H, W) plane. The window is visited as in
// max_pool_plain's general loop (rows, then columns; the first element starts), with the
// same comparison per channel, so each channel's result and argmax are the NCHW loop's.
void max_pool_nhwc(const float* x, float* y, int32_t* arg, int64_t n, int64_t c, int64_t h, int64_t w, int64_t ho,
                   int64_t wo, int64_t k, int64_t s, int64_t p) {
  const int64_t rows = n * ho;
#pragma omp parallel for schedule(static) if (rows * wo * c * k * k > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / ho, oh = r % ho;
    const float* xb = x + b * h * w * c;
    const int64_t h0 = std::max<int64_t>(oh * s - p, 0), h1 = std::min(oh * s - p + k, h);
    for (int64_t ow = 0; ow < wo; ++ow) {
      const int64_t w0 = std::max<int64_t>(ow * s - p, 0), w1 = std::min(ow * s - p + k, w);
      float* yo = y + ((b * ho + oh) * wo + ow) * c;
      int32_t* ao = arg + ((b * ho + oh) * wo + ow) * c;
      const float* first = xb + (h0 * w + w0) * c;
      const auto first_i = static_cast<int32_t>(h0 * w + w0);
      for (int64_t ch = 0; ch < c; ++ch) {
        yo[ch] = first[ch];
        ao[ch] = first_i;
      }
      for (int64_t i = h0; i < h1; ++i) {
        for (int64_t j = w0; j < w1; ++j) {
          const float* xp = xb + (i * w + j) * c;
          const auto idx = static_cast<int32_t>(i * w + j);
          for (int64_t ch = 0; ch < c; ++ch) {
            const float v = xp[ch], best = yo[ch];
            const bool take = v > best || (v != v && best == best);  // a NaN wins, as in PyTorch
            yo[ch] = take ? v : best;
            ao[ch] = take ? idx : ao[ch];
          }
        }
      }
    }
  }
}

// dx (N, H, W, C) = dy (N, Ho, Wo, C) scattered to the recorded argmax positions; per input
// element the additions come in increasing output position, as in max_pool_plain_backward.
void max_pool_nhwc_backward(const float* dy, const int32_t* arg, float* dx, int64_t n, int64_t c, int64_t hw,
                            int64_t ohw) {
#pragma omp parallel for schedule(static) if (n * hw * c > 32768)
  for (int64_t b = 0; b < n; ++b) {
    float* db = dx + b * hw * c;
    std::fill(db, db + hw * c, 0.0f);
    const float* gb = dy + b * ohw * c;
    const int32_t* ab = arg + b * ohw * c;
    for (int64_t o = 0; o < ohw; ++o) {
      for (int64_t ch = 0; ch < c; ++ch) db[static_cast<int64_t>(ab[o * c + ch]) * c + ch] += gb[o * c + ch];
    }
  }
}

// Max: saved = {argmax (N, C, Ho, Wo) i32 in x's format}, extra = input shape.
// Avg: saved = {x}, extra = the oneDNN primitives.
std::vector<Tensor> pool_forward(bool max, int64_t k, int64_t s, int64_t p, const Tensor& x, const Shape& y_shape,
                                 SavedState& saved) {
  const MemoryFormat format = x.memory_format();
  Tensor y = Tensor::empty(y_shape, DType::f32, Device::cpu(), format);  // (N, C, Ho, Wo)
  if (max) {
    Tensor arg = Tensor::empty(y_shape, DType::i32, Device::cpu(), format);  // (N, C, Ho, Wo)
    if (x.numel() > 0 && x.is_channels_last()) {
      max_pool_nhwc(x.data<float>(), y.data<float>(), arg.data<int32_t>(), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
                    y_shape[2], y_shape[3], k, s, p);
    } else if (x.numel() > 0) {
      max_pool_plain(x.data<float>(), y.data<float>(), arg.data<int32_t>(), x.dim(0) * x.dim(1), x.dim(2),
                     x.dim(3), y_shape[2], y_shape[3], k, s, p);
    }
    saved.tensors = {arg};
    saved.extra = std::make_shared<Shape>(x.shape());
    return {y};
  }
  saved.tensors = {x};
  saved.extra.reset();
  if (x.numel() == 0) return {y};
  auto prims = pool_prims(false, x.shape(), y_shape, format, k, s, p);
  cpu::execute(prims->fwd, {{DNNL_ARG_SRC, cpu::wrap(x)}, {DNNL_ARG_DST, cpu::wrap(y)}});
  saved.extra = prims;
  return {y};
}

std::vector<Tensor> pool_backward(const Pool2DBase& layer, bool max, const Tensor& dy_any, SavedState& saved) {
  TNT_CHECK(saved.tensors.size() == 1, "{} '{}': backward without a forward", layer.type(), layer.name());
  const Shape x_shape = max ? *std::static_pointer_cast<Shape>(saved.extra) : saved.tensors[0].shape();
  const Shape y_shape = layer.output_shapes({x_shape})[0];
  TNT_CHECK(dy_any.shape() == y_shape && dy_any.dtype() == DType::f32, "{} '{}': gradient {} for output {}",
            layer.type(), layer.name(), dy_any.str(), shape_str(y_shape));
  // x's format (that of the saved argmax or input); the executor's gradient already is.
  const MemoryFormat format = saved.tensors[0].memory_format();
  const Tensor dy = dy_any.to_memory_format(format);
  Tensor dx = Tensor::empty(x_shape, DType::f32, Device::cpu(), format);  // (N, C, H, W)
  if (dx.numel() == 0) return {dx};
  if (max && format == MemoryFormat::channels_last) {
    max_pool_nhwc_backward(dy.data<float>(), saved.tensors[0].data<int32_t>(), dx.data<float>(), x_shape[0],
                           x_shape[1], x_shape[2] * x_shape[3], y_shape[2] * y_shape[3]);
    return {dx};
  }
  if (max) {
    const bool disjoint_2x2 = layer.pool_size() == 2 && layer.stride() == 2 && layer.padding() == 0;
    max_pool_plain_backward(dy.data<float>(), saved.tensors[0].data<int32_t>(), dx.data<float>(),
                            x_shape[0] * x_shape[1], x_shape[2], x_shape[3], y_shape[2], y_shape[3], disjoint_2x2);
    return {dx};
  }
  auto prims = std::static_pointer_cast<PoolPrims>(saved.extra);
  cpu::execute(prims->bwd, {{DNNL_ARG_DIFF_DST, cpu::wrap(dy)}, {DNNL_ARG_DIFF_SRC, cpu::wrap(dx)}});
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
  TNT_INPUT_CHECK(pool > 0, "{} '{}': pool_size must be positive, got {}", type, name, pool);
  TNT_INPUT_CHECK(stride > 0, "{} '{}': stride must be positive (0 = pool_size), got {}", type, name, stride);
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
  return pool_forward(true, pool_, stride_, padding_, inputs[0], y_shape, saved);
}

std::vector<Tensor> MaxPool2D::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && !saved.tensors.empty(),
            "MaxPool2D '{}': backward needs one gradient and a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::max_pool2d_backward(*this, grad_outputs, rc, saved));
  return pool_backward(*this, true, grad_outputs[0], saved);
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
  return pool_forward(false, pool_, stride_, padding_, inputs[0], y_shape, saved);
}

std::vector<Tensor> AvgPool2D::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && !saved.tensors.empty(),
            "AvgPool2D '{}': backward needs one gradient and a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::avg_pool2d_backward(*this, grad_outputs, rc, saved));
  return pool_backward(*this, false, grad_outputs[0], saved);
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
  Tensor y = Tensor::empty(y_shape, DType::f32);  // (N, C): 2-D, always contiguous
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  if (x.is_channels_last()) {
    // xs (N, H*W, C): each (n, c) sums its H*W values in the same order as below, so the
    // result has the same bits; the channel loop is innermost for contiguous reads.
    const int64_t n = y_shape[0], c = y_shape[1];
#pragma omp parallel for schedule(static) if (planes * hw > 32768)
    for (int64_t b = 0; b < n; ++b) {
      float* yb = ys + b * c;
      std::fill(yb, yb + c, 0.0f);
      const float* xb = xs + b * hw * c;
      for (int64_t j = 0; j < hw; ++j)
        for (int64_t ch = 0; ch < c; ++ch) yb[ch] += xb[j * c + ch];
      for (int64_t ch = 0; ch < c; ++ch) yb[ch] /= static_cast<float>(hw);
    }
  } else {
    // xs (N*C, H*W)
#pragma omp parallel for schedule(static) if (planes * hw > 32768)
    for (int64_t i = 0; i < planes; ++i) {
      float acc = 0;
      for (int64_t j = 0; j < hw; ++j) acc += xs[i * hw + j];
      ys[i] = acc / static_cast<float>(hw);
    }
  }
  saved.tensors.clear();
  // Backward needs only the shape and the format of x.
  saved.extra = std::make_shared<std::pair<Shape, MemoryFormat>>(x.shape(), x.memory_format());
  return {y};
}

std::vector<Tensor> GlobalAveragePool::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                                SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined() && saved.extra,
            "GlobalAveragePool '{}': backward needs one gradient and a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::global_average_pool_backward(*this, grad_outputs, rc, saved));
  // Plain variables, not a structured binding: OpenMP regions below use them (clang cannot
  // capture a binding there).
  const auto& shape_and_format = *std::static_pointer_cast<std::pair<Shape, MemoryFormat>>(saved.extra);
  const Shape& xs = shape_and_format.first;
  const MemoryFormat format = shape_and_format.second;
  const Tensor& dy = grad_outputs[0];
  TNT_CHECK(dy.shape() == Shape({xs[0], xs[1]}) && dy.dtype() == DType::f32,
            "GlobalAveragePool '{}': gradient {} for output ({}, {})", name_, dy.str(), xs[0], xs[1]);
  const int64_t planes = xs[0] * xs[1], hw = xs[2] * xs[3];
  Tensor dx = Tensor::empty(xs, DType::f32, Device::cpu(), format);  // (N, C, H, W) in x's format
  const float* g = dy.data<float>();  // (N, C)
  float* d = dx.data<float>();
  const float inv = 1.0f / static_cast<float>(hw);
  if (format == MemoryFormat::channels_last) {
    const int64_t c = xs[1];
#pragma omp parallel for schedule(static) if (planes * hw > 32768)
    for (int64_t b = 0; b < xs[0]; ++b)
      for (int64_t j = 0; j < hw; ++j)
        for (int64_t ch = 0; ch < c; ++ch) d[(b * hw + j) * c + ch] = g[b * c + ch] * inv;
    return {dx};
  }
#pragma omp parallel for schedule(static) if (planes * hw > 32768)
  for (int64_t i = 0; i < planes; ++i)
    for (int64_t j = 0; j < hw; ++j) d[i * hw + j] = g[i] * inv;
  return {dx};
}

// Model files (nn/layer_types.hpp).
namespace {
LayerConfig pool_config(const Pool2DBase& l) {
  LayerConfig c;
  c.set_int("pool_size", l.pool_size());
  c.set_int("stride", l.stride());
  c.set_int("padding", l.padding());
  return c;
}

template <typename L>
detail::LayerTypeRegistration pooling(const char* type) {
  return {type, [](const Layer& l) { return pool_config(detail::layer_as<L>(l)); },
          [](const std::string& name, const LayerConfig& c) -> LayerPtr {
            return std::make_shared<L>(c.get_int("pool_size"), c.get_int("stride"), c.get_int("padding"), name);
          }};
}

const auto kGlobalAveragePool = detail::LayerTypeRegistration::plain<GlobalAveragePool>("GlobalAveragePool");
const auto kMaxPool2D = pooling<MaxPool2D>("MaxPool2D");
const auto kAvgPool2D = pooling<AvgPool2D>("AvgPool2D");
}  // namespace

}  // namespace tnt
