// BatchNorm on the CPU: oneDNN batch normalisation (training: batch statistics out;
// inference: running statistics in, as use_global_stats) and its backward. oneDNN returns
// the biased batch variance; the running variance takes the unbiased one (PyTorch).
// A channels_last input is described to oneDNN with its NHWC strides; y and dx take x's
// format, and so should the output gradient (the executor converts; a stray one is converted).
#include "tarantella/layers/batch_norm.hpp"
#include "nn/layer_types.hpp"

#include "backend/cpu/dnnl_context.hpp"
#include "backend/dispatch.hpp"
#include "layers/batch_norm_cpu.hpp"
#include "layers/batch_norm_cuda.hpp"
#include "tarantella/ops.hpp"

namespace tnt {

namespace {

struct BnPrims {
  dnnl::batch_normalization_forward::primitive_desc fwd_pd;
  dnnl::batch_normalization_forward fwd;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd;
  dnnl::batch_normalization_backward bwd;
  // With the ReLU flag: whether it gives the layers' bits (relu_keeps_kernel); made with the
  // primitives, read-only after.
  bool keeps_kernel = false;
};

struct BnSaved {
  std::shared_ptr<BnPrims> prims;
  bool training = false;
  Tensor workspace;  // oneDNN's ReLU mask, where it applied ReLU (fuse_norm_relu)
};

std::shared_ptr<BnPrims> bn_prims(const Shape& x, MemoryFormat format, float eps, bool affine, bool global_stats,
                                  bool relu) {
  std::string key = fmt::format("batch_norm|{}|{}|{}|{}|{}|{}", cpu::key_of(x), memory_format_name(format), eps,
                                affine, global_stats, relu);
  return cpu::dnnl_cached<BnPrims>(key, [&] {
    auto flags = affine ? (dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift)
                        : dnnl::normalization_flags::none;
    if (global_stats) flags = flags | dnnl::normalization_flags::use_global_stats;
    if (relu) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
    dnnl::memory::desc md = cpu::plain_desc(x, format);
    dnnl::batch_normalization_forward::desc fd(dnnl::prop_kind::forward_training, md, eps, flags);
    dnnl::batch_normalization_forward::primitive_desc fwd_pd(fd, cpu::dnnl_engine());
    dnnl::batch_normalization_backward::desc bd(affine ? dnnl::prop_kind::backward : dnnl::prop_kind::backward_data,
                                                md, md, eps, flags);
    dnnl::batch_normalization_backward::primitive_desc bwd_pd(bd, cpu::dnnl_engine(), fwd_pd);
    BnPrims p{fwd_pd, dnnl::batch_normalization_forward(fwd_pd), bwd_pd, dnnl::batch_normalization_backward(bwd_pd)};
    if (relu) {
      // The flag's kernels against the plain layer's: the same JIT kernels in both directions.
      // oneDNN's C++ kernels (NCHW, NHWC with channels off 16) take ReLU as v <= 0 ? 0 : v,
      // which passes a NaN where ReLU's x > 0 ? x : 0 gives 0, and their NHWC backward sums
      // in another order with the flag; their chains take the pass (relu_keeps_kernel).
      const auto plain = flags & ~dnnl::normalization_flags::fuse_norm_relu;
      dnnl::batch_normalization_forward::primitive_desc pf(
          {dnnl::prop_kind::forward_training, md, eps, plain}, cpu::dnnl_engine());
      dnnl::batch_normalization_backward::primitive_desc pb(
          {affine ? dnnl::prop_kind::backward : dnnl::prop_kind::backward_data, md, md, eps, plain},
          cpu::dnnl_engine(), pf);
      const std::string name = fwd_pd.impl_info_str();
      p.keeps_kernel = name.find("jit") != std::string::npos && name == pf.impl_info_str() &&
                       bwd_pd.impl_info_str() == pb.impl_info_str();
    }
    return p;
  });
}

// oneDNN's shape of x: (N, C) is (N, C, 1).
Shape dnnl_shape(const Tensor& x) {
  Shape shape = x.shape();
  if (shape.size() == 2) shape.push_back(1);
  return shape;
}

// Whether oneDNN's ReLU flag gives the layers' bits here: where its batch norm runs the same
// JIT kernels with and without the flag (bn_prims). Elsewhere the chain applies ReLU in a
// pass of its own. Tested (nn_layer_fusion) at 8, 12 and 16 channels in both formats, with
// NaN and infinities.
bool relu_keeps_kernel(BatchNorm& bn, const Tensor& x, const RunContext& rc) {
  return bn_prims(dnnl_shape(x), x.memory_format(), static_cast<float>(bn.epsilon()), bn.affine(), !rc.training, true)
      ->keeps_kernel;
}

// The layer's forward on the CPU, after begin_forward. relu: oneDNN applies ReLU to y
// (y > 0 ? y : 0, before y is stored) and keeps a mask of where it passed, for the
// backward. saved: {x, mean, var}, extra BnSaved.
Tensor forward_cpu(BatchNorm& bn, const Tensor& x, const RunContext& rc, bool relu, SavedState& saved) {
  const int64_t c = bn.num_features();
  const int64_t per_channel = x.numel() / c;  // N * H * W
  auto prims =
      bn_prims(dnnl_shape(x), x.memory_format(), static_cast<float>(bn.epsilon()), bn.affine(), !rc.training, relu);
  Tensor y = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
  Tensor mean = rc.training ? Tensor::empty({c}, DType::f32) : bn.running_mean().value;  // (C)
  Tensor var = rc.training ? Tensor::empty({c}, DType::f32) : bn.running_var().value;    // (C)
  auto s = std::make_shared<BnSaved>();
  if (per_channel > 0) {
    const auto& pd = prims->fwd_pd;
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, cpu::wrap(x, pd.src_desc())},
                                               {DNNL_ARG_DST, cpu::wrap(y, pd.dst_desc())},
                                               {DNNL_ARG_MEAN, cpu::wrap(mean, pd.mean_desc())},
                                               {DNNL_ARG_VARIANCE, cpu::wrap(var, pd.variance_desc())}};
    if (bn.affine()) {
      args.emplace(DNNL_ARG_SCALE, cpu::wrap(bn.weight()->value, cpu::plain_desc({c})));
      args.emplace(DNNL_ARG_SHIFT, cpu::wrap(bn.bias()->value, cpu::plain_desc({c})));
    }
    if (relu) args.emplace(DNNL_ARG_WORKSPACE, cpu::scratch(pd.workspace_desc(), s->workspace));
    cpu::execute(prims->fwd, args);
  }
  if (rc.training) {
    const float m = static_cast<float>(bn.momentum());
    const float unbias = static_cast<float>(static_cast<double>(per_channel) / static_cast<double>(per_channel - 1));
    float* rm = bn.running_mean().value.data<float>();
    float* rv = bn.running_var().value.data<float>();
    const float* bm = mean.data<float>();
    const float* bv = var.data<float>();
    for (int64_t i = 0; i < c; ++i) {
      rm[i] = (1 - m) * rm[i] + m * bm[i];
      rv[i] = (1 - m) * rv[i] + m * bv[i] * unbias;
    }
  }
  saved.tensors = {x, mean, var};
  s->prims = prims;
  s->training = rc.training;
  saved.extra = s;
  return y;
}

// dy in x's format -> dx; the parameter gradients are added to the layer's. Where the
// forward applied ReLU, oneDNN passes dy only where its mask says ReLU passed.
Tensor backward_cpu(BatchNorm& bn, const Tensor& dy, SavedState& saved) {
  const Tensor& x = saved.tensors[0];
  auto s = std::static_pointer_cast<BnSaved>(saved.extra);
  const auto& pd = s->prims->bwd_pd;
  Tensor dx = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
  if (x.numel() == 0) return dx;
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, cpu::wrap(x, pd.src_desc())},
                                             {DNNL_ARG_MEAN, cpu::wrap(saved.tensors[1], pd.mean_desc())},
                                             {DNNL_ARG_VARIANCE, cpu::wrap(saved.tensors[2], pd.variance_desc())},
                                             {DNNL_ARG_DIFF_DST, cpu::wrap(dy, pd.diff_dst_desc())},
                                             {DNNL_ARG_DIFF_SRC, cpu::wrap(dx, pd.diff_src_desc())}};
  if (s->workspace.defined()) args.emplace(DNNL_ARG_WORKSPACE, cpu::wrap(s->workspace, pd.workspace_desc()));
  const int64_t c = bn.num_features();
  Tensor dscale, dshift;
  if (bn.affine()) {
    dscale = Tensor::empty({c}, DType::f32);  // (C)
    dshift = Tensor::empty({c}, DType::f32);  // (C)
    dnnl::memory::desc cd = cpu::plain_desc({c});
    args.emplace(DNNL_ARG_SCALE, cpu::wrap(bn.weight()->value, cd));
    args.emplace(DNNL_ARG_SHIFT, cpu::wrap(bn.bias()->value, cd));  // oneDNN 2.6 asks for it
    args.emplace(DNNL_ARG_DIFF_SCALE, cpu::wrap(dscale, cd));
    args.emplace(DNNL_ARG_DIFF_SHIFT, cpu::wrap(dshift, cd));
  }
  cpu::execute(s->prims->bwd, args);
  if (bn.affine()) {
    ops::axpy(1.0, dscale, bn.weight()->grad);
    ops::axpy(1.0, dshift, bn.bias()->grad);
  }
  return dx;
}

}  // namespace

BatchNorm::BatchNorm(BatchNormOptions options, std::string name) : Layer(std::move(name)), options_(options) {
  default_name("batch_norm");
  TNT_CHECK(options.momentum >= 0 && options.momentum <= 1, "BatchNorm '{}': momentum {} is not in [0, 1]", name_,
            options.momentum);
  TNT_INPUT_CHECK(options.epsilon > 0, "BatchNorm '{}': epsilon must be positive, got {}", name_, options.epsilon);
}

std::vector<Shape> BatchNorm::output_shapes(const std::vector<Shape>& in) const {
  TNT_CHECK(in.size() == 1 && in[0].size() >= 2, "BatchNorm '{}': expects one input (N, C, ...)", name_);
  return {in[0]};
}

void BatchNorm::build(const std::vector<Shape>& in) {
  output_shapes(in);
  num_features_ = in[0][1];
  TNT_INPUT_CHECK(num_features_ > 0, "BatchNorm '{}': input {} has no channels", name_, shape_str(in[0]));
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
  TNT_CUDA_DISPATCH(x.device(), cuda::batch_norm_forward(*this, inputs, rc, saved));
  return {forward_cpu(*this, x, rc, /*relu=*/false, saved)};
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
  return {backward_cpu(*this, dy, saved)};
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

namespace cpu {

namespace {
constexpr int64_t kParallelMin = 32768;  // below this, threads cost more than they save
}  // namespace

bool batch_norm_act_forward(BatchNorm& bn, const Tensor& x, const Tensor& z, const RunContext& rc, SavedState& saved,
                            Tensor& y) {
  if (!x.defined() || !x.device().is_cpu() || x.dtype() != DType::f32 || x.ndim() < 2 || !bn.device().is_cpu()) {
    return false;
  }
  if (z.defined() && (!z.device().is_cpu() || z.dtype() != DType::f32 || z.shape() != x.shape() ||
                      z.memory_format() != x.memory_format())) {
    return false;
  }
  bn.begin_forward(x, rc);
  if (!z.defined() && relu_keeps_kernel(bn, x, rc)) {
    y = forward_cpu(bn, x, rc, /*relu=*/true, saved);
    return true;
  }
  y = forward_cpu(bn, x, rc, /*relu=*/false, saved);
  // y = relu(y + z) (or relu(y)) in place: the Add's sum (a + b is b + a in IEEE
  // arithmetic), then ReLU's x > 0 ? x : 0, each rounded as the layers round them.
  float* ys = y.data<float>();
  const int64_t n = y.numel();
  if (z.defined()) {
    const float* zs = z.data<float>();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float sum = ys[i] + zs[i];
      ys[i] = sum > 0.0f ? sum : 0.0f;
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) ys[i] = ys[i] > 0.0f ? ys[i] : 0.0f;
  }
  saved.tensors.push_back(y);  // {x, mean, var, y}: y > 0 exactly where ReLU passed
  return true;
}

std::vector<Tensor> batch_norm_act_backward(BatchNorm& bn, const Tensor& dy_any, SavedState& saved) {
  TNT_CHECK((saved.tensors.size() == 3 || saved.tensors.size() == 4) && saved.extra,
            "fused chain of BatchNorm '{}': backward without a forward", bn.name());
  const Tensor& x = saved.tensors[0];
  const Tensor dy = dy_any.to_memory_format(x.memory_format());
  TNT_CHECK(dy.shape() == x.shape() && dy.dtype() == DType::f32,
            "fused chain of BatchNorm '{}': gradient {} for output {}", bn.name(), dy.str(), x.str());
  if (saved.tensors.size() == 3) return {backward_cpu(bn, dy, saved)};  // oneDNN masks dy
  // ReLU's backward, then (with an Add) the Add's: the same gradient for both of its inputs
  // (the residual's is this tensor itself: nothing reads it after BatchNorm's backward).
  const Tensor y = saved.tensors[3];
  Tensor d = Tensor::empty(x.shape(), DType::f32, Device::cpu(), x.memory_format());
  const float* ys = y.data<float>();
  const float* g = dy.data<float>();
  float* ds = d.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) ds[i] = ys[i] > 0.0f ? g[i] : 0.0f;
  return {backward_cpu(bn, d, saved), d};
}

}  // namespace cpu

}  // namespace tnt
