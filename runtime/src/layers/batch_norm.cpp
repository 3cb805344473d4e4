// BatchNorm on the CPU: oneDNN batch normalisation (training: batch statistics out;
// inference: running statistics in, as use_global_stats) and its backward. oneDNN returns
// the biased batch variance; the running variance takes the unbiased one (PyTorch).
// A channels_last input is described to oneDNN with its NHWC strides; y and dx take x's
// format, and so should the output gradient (the executor converts; a stray one is converted).
#include "tarantella/layers/batch_norm.hpp"
#include "nn/layer_types.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "backend/dispatch.hpp"
#include "layers/batch_norm_cuda.hpp"
#include "tarantella/ops.hpp"

namespace tnt {

namespace {

struct BnPrims {
  dnnl::batch_normalization_forward::primitive_desc fwd_pd;
  dnnl::batch_normalization_forward fwd;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd;
  dnnl::batch_normalization_backward bwd;
};

struct BnSaved {
  std::shared_ptr<BnPrims> prims;
  bool training = false;
};

std::shared_ptr<BnPrims> bn_prims(const Shape& x, MemoryFormat format, float eps, bool affine, bool global_stats) {
  std::string key = fmt::format("batch_norm|{}|{}|{}|{}|{}", cpu::key_of(x), memory_format_name(format), eps, affine,
                                global_stats);
  return cpu::dnnl_cached<BnPrims>(key, [&] {
    auto flags = affine ? (dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift)
                        : dnnl::normalization_flags::none;
    if (global_stats) flags = flags | dnnl::normalization_flags::use_global_stats;
    dnnl::memory::desc md = cpu::plain_desc(x, format);
    dnnl::batch_normalization_forward::desc fd(dnnl::prop_kind::forward_training, md, eps, flags);
    dnnl::batch_normalization_forward::primitive_desc fwd_pd(fd, cpu::dnnl_engine());
    dnnl::batch_normalization_backward::desc bd(affine ? dnnl::prop_kind::backward : dnnl::prop_kind::backward_data,
                                                md, md, eps, flags);
    dnnl::batch_normalization_backward::primitive_desc bwd_pd(bd, cpu::dnnl_engine(), fwd_pd);
    return BnPrims{fwd_pd, dnnl::batch_normalization_forward(fwd_pd), bwd_pd,
                   dnnl::batch_normalization_backward(bwd_pd)};
  });
}

}  // namespace

BatchNorm::BatchNorm(BatchNormOptions options, std::string name) : Layer(std::move(name)), options_(options) {
  default_name("batch_norm");
  TNT_CHECK(options.momentum >= 0 && options.momentum <= 1, "BatchNorm '{}': momentum {} is not in [0, 1]", name_,
            options.momentum);
  TNT_CHECK(options.epsilon > 0, "BatchNorm '{}': epsilon must be positive, got {}", name_, options.epsilon);
}

std::vector<Shape> BatchNorm::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1 && in[0].size() >= 2, "BatchNorm '{}': expects one input (N, C, ...)", name_);
  return {in[0]};
}

void BatchNorm::build(const std::vector<Shape>& in) {
  output_shapes(in);
  num_features_ = in[0][1];
  TNT_CHECK(num_features_ > 0, "BatchNorm '{}': input {} has no channels", name_, shape_str(in[0]));
  if (options_.affine) {
    weight_ = &add_parameter("weight", {num_features_}, options_.weight_initializer);
    bias_ = &add_parameter("bias", {num_features_}, options_.bias_initializer);
  }
  running_mean_ = &add_buffer("running_mean", {num_features_}, Initializer::zeros());
  running_var_ = &add_buffer("running_var", {num_features_}, Initializer::ones());
  num_batches_tracked_ = &add_buffer("num_batches_tracked", {}, Initializer::zeros(), DType::i64);
  to(device());  // puts the counter in host memory
}

void BatchNorm::to(Device device) {
  Layer::to(device);
  if (num_batches_tracked_ && !num_batches_tracked_->value.device().is_cpu()) {
    num_batches_tracked_->value = num_batches_tracked_->value.to(Device::cpu());
  }
}

void BatchNorm::begin_forward(const Tensor& x, const RunContext& rc) {
  TNT_CHECK(x.ndim() >= 2, "BatchNorm '{}': expects (N, C, ...), got {}", name_, x.str());
  ensure_built({x.shape()});
  TNT_CHECK(x.dim(1) == num_features_, "BatchNorm '{}': built for {} channels, got {}", name_, num_features_, x.str());
  const int64_t per_channel = x.numel() / num_features_;  // N * H * W
  if (rc.training && per_channel <= 1) {
    // A user's choice (the batch per rank, the image size), not a bug: no source location.
    std::string map = "1";
    if (x.ndim() > 2) {
      map.clear();
      for (int64_t d = 2; d < x.ndim(); ++d) map += fmt::format("{}{}", d > 2 ? "x" : "", x.dim(d));
    }
    TNT_INPUT_ERROR("BatchNorm '{}': training needs more than one value per channel, got input {}: the batch per rank "
                    "({}) times the feature map ({}) must exceed 1; give each rank a larger batch or larger inputs",
                    name_, x.str(), x.dim(0), map);
  }
  if (rc.training) ++num_batches_tracked_->value.data<int64_t>()[0];
}

std::vector<Tensor> BatchNorm::forward(const std::vector<Tensor>& inputs, const RunContext& rc, SavedState& saved) {
  check_inputs(inputs, 1);
  const Tensor& x = inputs[0];  // (N, C, ...)
  TNT_CHECK(x.ndim() >= 2, "BatchNorm '{}': expects (N, C, ...), got {}", name_, x.str());
  ensure_built({x.shape()});
  check_inputs(inputs, 1);
  begin_forward(x, rc);
  const int64_t per_channel = x.numel() / num_features_;  // N * H * W
  TNT_CUDA_DISPATCH(x.device(), cuda::batch_norm_forward(*this, inputs, rc, saved));

  // oneDNN wants at least (N, C, W): a (N, C) input is (N, C, 1).
  Shape shape = x.shape();
  if (shape.size() == 2) shape.push_back(1);
  auto prims =
      bn_prims(shape, x.memory_format(), static_cast<float>(options_.epsilon), options_.affine, !rc.training);
  Tensor y = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
  Tensor mean = rc.training ? Tensor::empty({num_features_}, DType::f32) : running_mean_->value;  // (C)
  Tensor var = rc.training ? Tensor::empty({num_features_}, DType::f32) : running_var_->value;    // (C)
  if (per_channel > 0) {
    const auto& pd = prims->fwd_pd;
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, cpu::wrap(x, pd.src_desc())},
                                               {DNNL_ARG_DST, cpu::wrap(y, pd.dst_desc())},
                                               {DNNL_ARG_MEAN, cpu::wrap(mean, pd.mean_desc())},
                                               {DNNL_ARG_VARIANCE, cpu::wrap(var, pd.variance_desc())}};
    if (options_.affine) {
      args.emplace(DNNL_ARG_SCALE, cpu::wrap(weight_->value, cpu::plain_desc({num_features_})));
      args.emplace(DNNL_ARG_SHIFT, cpu::wrap(bias_->value, cpu::plain_desc({num_features_})));
    }
    cpu::execute(prims->fwd, args);
  }
  if (rc.training) {
    const float m = static_cast<float>(options_.momentum);
    const float unbias = static_cast<float>(static_cast<double>(per_channel) / static_cast<double>(per_channel - 1));
    float* rm = running_mean_->value.data<float>();
    float* rv = running_var_->value.data<float>();
    const float* bm = mean.data<float>();
    const float* bv = var.data<float>();
    for (int64_t c = 0; c < num_features_; ++c) {
      rm[c] = (1 - m) * rm[c] + m * bm[c];
      rv[c] = (1 - m) * rv[c] + m * bv[c] * unbias;
    }
  }
  saved.tensors = {x, mean, var};
  auto s = std::make_shared<BnSaved>();
  s->prims = prims;
  s->training = rc.training;
  saved.extra = s;
  return {y};
}

std::vector<Tensor> BatchNorm::backward(const std::vector<Tensor>& grad_outputs, const RunContext& rc,
                                        SavedState& saved) {
  TNT_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined(), "BatchNorm '{}': backward needs one gradient", name_);
  TNT_CHECK(saved.tensors.size() == 3 && saved.extra, "BatchNorm '{}': backward without a forward", name_);
  TNT_CUDA_DISPATCH(grad_outputs[0].device(), cuda::batch_norm_backward(*this, grad_outputs, rc, saved));
  const Tensor& x = saved.tensors[0];
  const Tensor dy = grad_outputs[0].to_memory_format(x.memory_format());  // the executor's already is
  TNT_CHECK(dy.shape() == x.shape() && dy.dtype() == DType::f32, "BatchNorm '{}': gradient {} for output {}", name_,
            dy.str(), x.str());
  auto s = std::static_pointer_cast<BnSaved>(saved.extra);
  const auto& pd = s->prims->bwd_pd;
  Tensor dx = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
  if (x.numel() == 0) return {dx};
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, cpu::wrap(x, pd.src_desc())},
                                             {DNNL_ARG_MEAN, cpu::wrap(saved.tensors[1], pd.mean_desc())},
                                             {DNNL_ARG_VARIANCE, cpu::wrap(saved.tensors[2], pd.variance_desc())},
                                             {DNNL_ARG_DIFF_DST, cpu::wrap(dy, pd.diff_dst_desc())},
                                             {DNNL_ARG_DIFF_SRC, cpu::wrap(dx, pd.diff_src_desc())}};
  Tensor dscale, dshift;
  if (options_.affine) {
    dscale = Tensor::empty({num_features_}, DType::f32);  // (C)
    dshift = Tensor::empty({num_features_}, DType::f32);  // (C)
    dnnl::memory::desc cd = cpu::plain_desc({num_features_});
    args.emplace(DNNL_ARG_SCALE, cpu::wrap(weight_->value, cd));
    args.emplace(DNNL_ARG_SHIFT, cpu::wrap(bias_->value, cd));  // oneDNN 2.6 asks for it
    args.emplace(DNNL_ARG_DIFF_SCALE, cpu::wrap(dscale, cd));
    args.emplace(DNNL_ARG_DIFF_SHIFT, cpu::wrap(dshift, cd));
  }
  cpu::execute(s->prims->bwd, args);
  if (options_.affine) {
    ops::axpy(1.0, dscale, weight_->grad);
    ops::axpy(1.0, dshift, bias_->grad);
  }
  return {dx};
}

// Model files (nn/layer_types.hpp).
namespace {
LayerConfig batch_norm_config(const Layer& layer) {
  const auto& l = detail::layer_as<BatchNorm>(layer);
  LayerConfig c;
  c.set_double("momentum", l.momentum());
  c.set_double("epsilon", l.epsilon());
  c.set_bool("affine", l.affine());
  c.set_initializer("weight_initializer", l.options().weight_initializer);
  c.set_initializer("bias_initializer", l.options().bias_initializer);
  return c;
}

LayerPtr batch_norm_from(const std::string& name, const LayerConfig& c) {
  BatchNormOptions o;
  o.momentum = c.get_double("momentum");
  o.epsilon = c.get_double("epsilon");
  o.affine = c.get_bool("affine");
  o.weight_initializer = c.get_initializer("weight_initializer");
  o.bias_initializer = c.get_initializer("bias_initializer");
  return std::make_shared<BatchNorm>(o, name);
}

const detail::LayerTypeRegistration kBatchNorm("BatchNorm", batch_norm_config, batch_norm_from);
}  // namespace

}  // namespace tnt
