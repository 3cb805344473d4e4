// Conv2D on the CPU: oneDNN convolution forward, backward-data and backward-weights. The
// three primitives are chosen once per (input shape, layer configuration) and cached. We
// let oneDNN pick its memory layouts (format_tag::any: blocked nChw8c/16c layouts are
// several times faster than plain NCHW for channel counts of 16 and more) and reorder from
// and to the plain NCHW / OIHW tensors we expose; the reordered input is kept from forward
// for the weight gradient. The algorithm is always oneDNN's direct convolution: its
// "auto" choice picks Winograd on AVX-512 for 3x3 kernels, which measured slower for the
// Fashion-MNIST CNN (it pads 1 input channel to 16) and is less accurate. oneDNN's CPU
// convolutions partition work statically, so with a fixed thread count every run gives
// the same bits: TNT_DETERMINISTIC needs nothing more here.
//
// bf16 (mixed precision on a CPU with bf16 instructions, TNT_CPU_BF16): x, y, dy and dx in
// bf16, the weights the network's bf16 copy, bias and the weight and bias gradients f32;
// oneDNN sums in f32 and rounds each output once.
//
// Memory formats: x and dx may be contiguous (NCHW) or channels_last (NHWC); y is in the
// network's format (rc.memory_format), dx in x's. The user tensors are described with their
// strides (cpu::plain_desc), so the primitives (chosen with format_tag::any, hence the same
// for both formats) only see other reorders at their edges; the arithmetic is the same.
#include "tarantella/layers/conv2d.hpp"
#include "nn/layer_types.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "backend/dispatch.hpp"
#include "layers/conv2d_cuda.hpp"
#include "tarantella/ops.hpp"

namespace tnt {

namespace {

struct ConvPrims {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd;
  dnnl::convolution_backward_weights bwd_w;
};

int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p) { return (in + 2 * p - k) / s + 1; }

}  // namespace

Conv2D::Conv2D(int64_t filters, int64_t kernel_size, Conv2DOptions options, std::string name)
    : Layer(std::move(name)), filters_(filters), kernel_(kernel_size), options_(options) {
  default_name("conv2d");
  TNT_INPUT_CHECK(filters > 0, "Conv2D '{}': filters must be positive, got {}", name_, filters);
  TNT_INPUT_CHECK(kernel_size > 0, "Conv2D '{}': kernel_size must be positive, got {}", name_, kernel_size);
  TNT_INPUT_CHECK(options.stride > 0, "Conv2D '{}': stride must be positive, got {}", name_, options.stride);
  TNT_INPUT_CHECK(options.padding >= 0, "Conv2D '{}': padding must be >= 0, got {}", name_, options.padding);
}

std::vector<Shape> Conv2D::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1 && in[0].size() == 4, "Conv2D '{}': expects one input (N, C, H, W)", name_);
  const Shape& s = in[0];
  int64_t ho = conv_out(s[2], kernel_, options_.stride, options_.padding);
  int64_t wo = conv_out(s[3], kernel_, options_.stride, options_.padding);
  TNT_INPUT_CHECK(ho > 0 && wo > 0, "Conv2D '{}': input {} is smaller than the {}x{} kernel (padding {})", name_,
            shape_str(s), kernel_, kernel_, options_.padding);
  return {{s[0], filters_, ho, wo}};
}

bool Conv2D::cpu_computes_in(DType dtype) const {
  return dtype == DType::f32 || (dtype == DType::bf16 && cpu::native_bf16());
}

void Conv2D::build(const std::vector<Shape>& in) {
  output_shapes(in);  // validates
  in_channels_ = in[0][1];
  TNT_INPUT_CHECK(in_channels_ > 0, "Conv2D '{}': input {} has no channels", name_, shape_str(in[0]));
  weight_ = &add_parameter("weight", {filters_, in_channels_, kernel_, kernel_}, options_.kernel_initializer);
  weight_->cast_for_compute = true;  // mixed precision: the engines multiply by a half copy
  if (options_.use_bias) bias_ = &add_parameter("bias", {filters_}, options_.bias_initializer);
}

namespace {

// dtype: of the activations and the weights (f32 or bf16); bias and gradients of the
// weights are f32 either way.
std::shared_ptr<ConvPrims> conv_prims(const std::string& layer, const Shape& x, DType dtype, int64_t filters,
                                      int64_t k, int64_t s, int64_t p, bool bias) {
  std::string key = fmt::format("conv2d|{}|{}|{}|{}|{}|{}|{}", cpu::key_of(x), dtype_name(dtype), filters, k, s, p,
                                bias);
  return cpu::dnnl_cached<ConvPrims>(key, [&] {
    return cpu::bf16_primitive(fmt::format("Conv2D '{}'", layer), dtype == DType::bf16, [&] {
    using md = dnnl::memory::desc;
    using tag = dnnl::memory::format_tag;
    const auto f32 = dnnl::memory::data_type::f32;
    const auto t = cpu::dnnl_type(dtype);
    const int64_t ho = conv_out(x[2], k, s, p), wo = conv_out(x[3], k, s, p);
    md src({x[0], x[1], x[2], x[3]}, t, tag::any);
    md w({filters, x[1], k, k}, t, tag::any);
    md dw({filters, x[1], k, k}, f32, tag::any);
    md b({filters}, f32, tag::x);
    md dst({x[0], filters, ho, wo}, t, tag::any);
    dnnl::memory::dims strides{s, s}, pad{p, p};
    const auto alg = dnnl::algorithm::convolution_direct;
    dnnl::engine& eng = cpu::dnnl_engine();

    auto fd = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src, w, b, dst, strides,
                                                     pad, pad)
                   : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src, w, dst, strides,
                                                     pad, pad);
    dnnl::convolution_forward::primitive_desc fwd_pd(fd, eng);
    dnnl::convolution_backward_data::desc bdd(alg, src, w, dst, strides, pad, pad);
    dnnl::convolution_backward_data::primitive_desc bwd_data_pd(bdd, eng, fwd_pd);
    auto bwd = bias ? dnnl::convolution_backward_weights::desc(alg, src, dw, b, dst, strides, pad, pad)
                    : dnnl::convolution_backward_weights::desc(alg, src, dw, dst, strides, pad, pad);
    dnnl::convolution_backward_weights::primitive_desc bwd_w_pd(bwd, eng, fwd_pd);
    return ConvPrims{fwd_pd, dnnl::convolution_forward(fwd_pd), bwd_data_pd,
                     dnnl::convolution_backward_data(bwd_data_pd), bwd_w_pd,
                     dnnl::convolution_backward_weights(bwd_w_pd)};
    });
  });
}

// Memory for a result in `desc`: the plain tensor itself when the layouts agree.
dnnl::memory result_memory(const Tensor& plain, const dnnl::memory::desc& desc, Tensor& keep) {
  dnnl::memory user = cpu::wrap(plain);
  if (user.get_desc() == desc) return user;
  return cpu::scratch(desc, keep);
}

}  // namespace

std::vector<Tensor> Conv2D::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  const Tensor& x = inputs[0];  // (N, C, H, W)
  TNT_CHECK(x.ndim() == 4, "Conv2D '{}': expects (N, C, H, W), got {}", name_, x.str());
  ensure_built({x.shape()});
  check_inputs(inputs, 1);
  TNT_CHECK(x.dim(1) == in_channels_, "Conv2D '{}': built for {} input channels, got {}", name_, in_channels_,
            x.str());
  Shape y_shape = output_shapes({x.shape()})[0];
  TNT_CUDA_DISPATCH(x.device(), cuda::conv2d_forward(*this, inputs, rc, saved));

  const DType dt = x.dtype();
  TNT_CHECK(dt == DType::f32 || dt == DType::bf16, "Conv2D '{}': the CPU engine takes f32 or bf16, not {}", name_,
            x.str());
  Tensor y = Tensor::empty(y_shape, dt, Device::cpu(), rc.memory_format);  // (N, F, Ho, Wo)
  saved.tensors = {x, Tensor()};
  if (x.dim(0) == 0) return {y};
  auto prims = conv_prims(name_, x.shape(), dt, filters_, kernel_, options_.stride, options_.padding,
                          bias_ != nullptr);
  const auto& pd = prims->fwd_pd;
  Tensor src_keep, w_keep, dst_keep;
  dnnl::memory src = cpu::reorder_to(cpu::wrap(x), pd.src_desc(), &src_keep);
  dnnl::memory w = cpu::reorder_to(cpu::wrap(compute_value(*weight_, dt, name_)), pd.weights_desc(), &w_keep);
  dnnl::memory dst = result_memory(y, pd.dst_desc(), dst_keep);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dst}};
  if (bias_) args.emplace(DNNL_ARG_BIAS, cpu::wrap(bias_->value, pd.bias_desc()));
  cpu::execute(prims->fwd, args);
  if (dst_keep.defined()) cpu::reorder_into(dst, cpu::wrap(y));
  saved.tensors = {x, src_keep};  // src_keep: x in the primitive's layout, when it differs
  saved.extra = prims;
  return {y};
}

std::vector<Tensor> Conv2D::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                     SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "Conv2D '{}': backward needs one gradient", name_);
  TNT_CHECK(saved.tensors.size() == 2, "Conv2D '{}': backward without a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::conv2d_backward(*this, grad_outputs, rc, saved));
  const Tensor& x = saved.tensors[0];  // (N, C, H, W)
  const Tensor& dy = grad_outputs[0];  // (N, F, Ho, Wo), either format (described with its strides)
  Shape y_shape = output_shapes({x.shape()})[0];
  const DType dt = x.dtype();
  TNT_CHECK(dy.shape() == y_shape && dy.dtype() == dt, "Conv2D '{}': gradient {} for output {}", name_, dy.str(),
            shape_str(y_shape));
  // (N, C, H, W), in x's format
  Tensor dx = saved.need_input_grads ? Tensor::empty(x.shape(), dt, Device::cpu(), x.memory_format())
                                     : Tensor::empty({0}, dt);
  if (x.dim(0) == 0) return {dx};
  auto prims = std::static_pointer_cast<ConvPrims>(saved.extra);

  // Input gradient (skipped when nobody needs it).
  dnnl::memory dy_user = cpu::wrap(dy);
  Tensor dyd_keep;
  dnnl::memory dyd;
  if (saved.need_input_grads) {
    const auto& dpd = prims->bwd_data_pd;
    Tensor wd_keep, dx_keep;
    dyd = cpu::reorder_to(dy_user, dpd.diff_dst_desc(), &dyd_keep);
    dnnl::memory wd = cpu::reorder_to(cpu::wrap(compute_value(*weight_, dt, name_)), dpd.weights_desc(), &wd_keep);
    dnnl::memory dsrc = result_memory(dx, dpd.diff_src_desc(), dx_keep);
    cpu::execute(prims->bwd_data, {{DNNL_ARG_DIFF_DST, dyd}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dsrc}});
    if (dx_keep.defined()) cpu::reorder_into(dsrc, cpu::wrap(dx));
  } else {
    dx = Tensor();
  }

  // Weight and bias gradients, computed into temporaries and added (the primitive
  // overwrites, and a layer called twice must accumulate).
  const auto& wpd = prims->bwd_w_pd;
  Tensor dyw_keep, src_keep, dw_keep;
  dnnl::memory dyw = dyd && wpd.diff_dst_desc() == dyd.get_desc() ? dyd : cpu::reorder_to(dy_user, wpd.diff_dst_desc(), &dyw_keep);
  dnnl::memory src;
  if (saved.tensors[1].defined() && wpd.src_desc() == prims->fwd_pd.src_desc()) {
    src = cpu::wrap_scratch(saved.tensors[1], wpd.src_desc());
  } else {
    src = cpu::reorder_to(cpu::wrap(x), wpd.src_desc(), &src_keep);
  }
  // The weight gradient in the primitive's layout: a plain (F, C, k, k) tensor where that is
  // the layout, else oneDNN's blocked scratch, added into the parameter's gradient by a reorder.
  Tensor dw;
  dnnl::memory dwm;
  if (wpd.diff_weights_desc() == cpu::plain_desc(weight_->value.shape())) {
    dw = Tensor::empty(weight_->value.shape(), DType::f32);  // (F, C, k, k)
    dwm = cpu::wrap(dw);
  } else {
    dwm = cpu::scratch(wpd.diff_weights_desc(), dw_keep);
  }
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, dyw}, {DNNL_ARG_DIFF_WEIGHTS, dwm}};
  Tensor db;
  if (bias_) {
    db = Tensor::empty({filters_}, DType::f32);  // (F)
    args.emplace(DNNL_ARG_DIFF_BIAS, cpu::wrap(db, wpd.diff_bias_desc()));
  }
  cpu::execute(prims->bwd_w, args);
  if (dw_keep.defined()) {
    cpu::reorder_add_into(dwm, cpu::wrap(weight_->grad));  // from the primitive's layout, added
  } else {
    ops::axpy(1.0, dw, weight_->grad);
  }
  if (bias_) ops::axpy(1.0, db, bias_->grad);
  return {dx};
}

// Model files (nn/layer_types.hpp).
namespace {
LayerConfig conv2d_config(const Layer& layer) {
  const auto& l = detail::layer_as<Conv2D>(layer);
  LayerConfig c;
  c.set_int("filters", l.filters());
  c.set_int("kernel_size", l.kernel_size());
  c.set_int("stride", l.stride());
  c.set_int("padding", l.padding());
  c.set_bool("use_bias", l.use_bias());
  c.set_initializer("kernel_initializer", l.options().kernel_initializer);
  c.set_initializer("bias_initializer", l.options().bias_initializer);
  return c;
}

LayerPtr conv2d_from(const std::string& name, const LayerConfig& c) {
  Conv2DOptions o;
  o.stride = c.get_int("stride");
  o.padding = c.get_int("padding");
  o.use_bias = c.get_bool("use_bias");
  o.kernel_initializer = c.get_initializer("kernel_initializer");
  o.bias_initializer = c.get_initializer("bias_initializer");
  return std::make_shared<Conv2D>(c.get_int("filters"), c.get_int("kernel_size"), o, name);
}

const detail::LayerTypeRegistration kConv2D("Conv2D", conv2d_config, conv2d_from);
}  // namespace

}  // namespace tnt
