#include "layers/conv_bn_graph_cuda.hpp"

#include "backend/cuda/cudnn_graph.hpp"
#include "tarantella/check.hpp"

#include <fmt/format.h>

#include <deque>

namespace tnt::cuda {

namespace g = graph;

namespace {

// The graph's user tensors by role, fixed so that a later variant pack can name them.
enum : int64_t {
  kX = 1,       // the convolution's (or BatchNorm's) input activations
  kW = 2,       // filter
  kY = 3,       // the convolution's output
  kSum = 4,     // per-channel sum (GEN_STATS' output, BN_FINALIZE's input)
  kSqSum = 5,   // per-channel sum of squares
  kScale = 6,   // the scale applied to x on the fly (BN_FINALIZE's eq_scale of the previous layer)
  kBias = 7,    // the bias applied to x on the fly
  kDY = 8,      // the gradient arriving at the convolution's output
  kDX = 9,      // dgrad's result (after dReLU where fused)
  kDW = 10,     // wgrad's result
  kMean = 11,   // the saved mean of the BatchNorm that produced x from its input
  kInvStd = 12, // its saved inverse standard deviation
  kGamma = 13,  // its learned scale (and, in BN_FINALIZE, the learned scale of this BatchNorm)
  kBeta = 14,   // its learned bias
  kDGamma = 15,
  kDBeta = 16,
  kEqDyScale = 17,
  kEqXScale = 18,
  kEqBias = 19,
  kPrevRunningMean = 20,
  kPrevRunningVar = 21,
  kNextRunningMean = 22,
  kNextRunningVar = 23,
  kEqScaleOut = 24,
  kEqBiasOut = 25,
  kSavedMean = 26,
  kSavedInvStd = 27,
  kEpsilon = 28,
  kMomentum = 29,
  kAccumCount = 30,
  kFirstVirtual = 100,
};

cudnnDataType_t dt(DType d) { return g::data_type(d, "conv+BN graph"); }

// One graph's descriptors (graph::GraphParts), virtual uids from kFirstVirtual, with the
// layouts these graphs use.
struct Parts : g::GraphParts {
  Parts() : g::GraphParts(kFirstVirtual) {}
  // NHWC activations (n, c, h, w), channels fastest.
  const g::Descriptor& nhwc(int64_t uid, const std::string& name, cudnnDataType_t type, int64_t n, int64_t c, int64_t h,
                            int64_t w, bool is_virtual = false) {
    g::TensorSpec s;
    s.uid = is_virtual ? next_virtual++ : uid;
    s.name = name;
    s.dtype = type;
    s.dims = {n, c, h, w};
    s.strides = {h * w * c, 1, w * c, c};
    s.is_virtual = is_virtual;
    return tensor(s);
  }
  // One value per channel, (1, c, 1, 1) with the same channels-last strides.
  const g::Descriptor& channel(int64_t uid, const std::string& name, cudnnDataType_t type, int64_t c,
                               bool is_virtual = false) {
    return nhwc(uid, name, type, 1, c, 1, 1, is_virtual);
  }
};

g::ConvSpec conv_spec(const ConvBnShape& s) {
  return g::ConvSpec{{s.padding, s.padding}, {s.stride, s.stride}, {1, 1}};
}

// relu(x scale + bias) as three pointwise nodes, as the fused patterns spell the previous
// BatchNorm's application: returns the virtual result.
const g::Descriptor& scale_bias_relu(Parts& p, const g::Descriptor& x, const ConvBnShape& s, const ConvBnVariant& v) {
  const cudnnDataType_t mid = dt(v.intermediate);
  const g::Descriptor& scale = p.channel(kScale, "scale", dt(v.affine), s.c);
  const g::Descriptor& bias = p.channel(kBias, "bias", dt(v.affine), s.c);
  const g::Descriptor& scaled = p.nhwc(0, "x * scale", mid, s.n, s.c, s.h, s.w, true);
  p.op(g::make_pointwise("x * scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, x, &scale, nullptr, scaled),
       "POINTWISE MUL (x * scale)");
  const g::Descriptor& biased = p.nhwc(0, "+ bias", mid, s.n, s.c, s.h, s.w, true);
  p.op(g::make_pointwise("+ bias", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, scaled, &bias, nullptr, biased),
       "POINTWISE ADD (+ bias)");
  const g::Descriptor& relu = p.nhwc(0, "relu", mid, s.n, s.c, s.h, s.w, true);
  p.op(g::make_pointwise("relu", CUDNN_POINTWISE_RELU_FWD, CUDNN_DATA_FLOAT, biased, nullptr, nullptr, relu),
       "POINTWISE RELU_FWD");
  return relu;
}

void build_forward(Parts& p, ConvBnGraphKind kind, const ConvBnShape& s, const ConvBnVariant& v) {
  const cudnnDataType_t io = dt(v.io);
  const bool sbr = kind == ConvBnGraphKind::sbr_conv_genstats || kind == ConvBnGraphKind::sbr_conv;
  const bool stats = kind == ConvBnGraphKind::sbr_conv_genstats || kind == ConvBnGraphKind::conv_genstats;
  const g::Descriptor& x = p.nhwc(kX, "x", io, s.n, s.c, s.h, s.w);
  const g::Descriptor& w = p.nhwc(kW, "w", io, s.k, s.c, s.r, s.s);
  const g::Descriptor& in = sbr ? scale_bias_relu(p, x, s, v) : x;
  const g::Descriptor& y = p.nhwc(kY, "y", io, s.n, s.k, s.p(), s.q());
  const g::Descriptor conv = g::make_convolution("conv", conv_spec(s));
  p.op(g::make_conv_fprop("conv fprop", conv, in, w, y), "CONV_FPROP");
  if (stats) {
    const g::Descriptor& sum = p.channel(kSum, "sum", CUDNN_DATA_FLOAT, s.k);
    const g::Descriptor& sq = p.channel(kSqSum, "sq_sum", CUDNN_DATA_FLOAT, s.k);
    p.op(g::make_gen_stats("genstats", y, sum, sq), "GEN_STATS (sum, sq_sum of y)");
  }
}

void build_finalize(Parts& p, const ConvBnShape& s) {
  const int64_t k = s.k;
  auto f32 = [&](int64_t uid, const char* name) -> const g::Descriptor& {
    return p.channel(uid, name, CUDNN_DATA_FLOAT, k);
  };
  g::BnFinalizeTensors t{};
  t.sum = &f32(kSum, "sum");
  t.sq_sum = &f32(kSqSum, "sq_sum");
  t.scale = &f32(kGamma, "gamma");
  t.bias = &f32(kBeta, "beta");
  t.prev_running_mean = &f32(kPrevRunningMean, "running mean");
  t.prev_running_var = &f32(kPrevRunningVar, "running var");
  t.eq_scale = &f32(kEqScaleOut, "eq scale");
  t.eq_bias = &f32(kEqBiasOut, "eq bias");
  t.saved_mean = &f32(kSavedMean, "saved mean");
  t.saved_inv_std = &f32(kSavedInvStd, "saved inv std");
  t.next_running_mean = &f32(kNextRunningMean, "next running mean");
  t.next_running_var = &f32(kNextRunningVar, "next running var");
  t.epsilon = &p.scalar(kEpsilon, "epsilon", CUDNN_DATA_FLOAT);
  t.factor = &p.scalar(kMomentum, "momentum", CUDNN_DATA_FLOAT);
  t.accum_count = &p.scalar(kAccumCount, "accum count", CUDNN_DATA_INT64);
  p.op(g::make_bn_finalize("bn finalize", t), "BN_FINALIZE_STATISTICS (training)");
}

void build_dgrad(Parts& p, ConvBnGraphKind kind, const ConvBnShape& s, const ConvBnVariant& v) {
  const cudnnDataType_t io = dt(v.io);
  const cudnnDataType_t mid = dt(v.intermediate);
  const g::Descriptor& dy = p.nhwc(kDY, "dy", io, s.n, s.k, s.p(), s.q());
  const g::Descriptor& w = p.nhwc(kW, "w", io, s.k, s.c, s.r, s.s);
  const g::Descriptor conv = g::make_convolution("conv", conv_spec(s));
  if (kind == ConvBnGraphKind::dgrad) {
    const g::Descriptor& dx = p.nhwc(kDX, "dx", io, s.n, s.c, s.h, s.w);
    p.op(g::make_conv_dgrad("conv dgrad", conv, dy, w, dx), "CONV_DGRAD");
    return;
  }
  const g::Descriptor& dgrad = p.nhwc(0, "dgrad", mid, s.n, s.c, s.h, s.w, true);
  p.op(g::make_conv_dgrad("conv dgrad", conv, dy, w, dgrad), "CONV_DGRAD");
  const g::Descriptor& x = p.nhwc(kX, "x", io, s.n, s.c, s.h, s.w);
  const g::Descriptor& dz = p.nhwc(kDX, "dz", io, s.n, s.c, s.h, s.w);
  if (kind == ConvBnGraphKind::dgrad_drelu) {
    // x here is what the forward ReLU read (its sign is all dReLU needs).
    p.op(g::make_pointwise_backward("drelu", CUDNN_POINTWISE_RELU_BWD, CUDNN_DATA_FLOAT, dgrad, x, dz),
         "POINTWISE RELU_BWD");
    return;
  }
  // The BatchNorm output the forward ReLU read, recomputed from its input x, spelt as
  // cudnn-frontend's sample spells it: ((x ADD mean) * inv_std) * gamma + beta. Whether the
  // engine subtracts that operand or the caller must pass -mean is for the GPU integration
  // to check (cuDNN 9.19 serves this graph nowhere deviceless: docs/gpu.md).
  const g::Descriptor& mean = p.channel(kMean, "mean", CUDNN_DATA_FLOAT, s.c);
  const g::Descriptor& inv_std = p.channel(kInvStd, "inv std", CUDNN_DATA_FLOAT, s.c);
  const g::Descriptor& gamma = p.channel(kGamma, "gamma", CUDNN_DATA_FLOAT, s.c);
  const g::Descriptor& beta = p.channel(kBeta, "beta", CUDNN_DATA_FLOAT, s.c);
  const g::Descriptor& centred = p.nhwc(0, "x - mean", mid, s.n, s.c, s.h, s.w, true);
  p.op(g::make_pointwise("x - mean", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, x, &mean, nullptr, centred),
       "POINTWISE ADD (x, mean)");
  const g::Descriptor& normed = p.nhwc(0, "* inv std", mid, s.n, s.c, s.h, s.w, true);
  p.op(g::make_pointwise("* inv std", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, centred, &inv_std, nullptr, normed),
       "POINTWISE MUL (* inv std)");
  const g::Descriptor& scaled = p.nhwc(0, "* gamma", mid, s.n, s.c, s.h, s.w, true);
  p.op(g::make_pointwise("* gamma", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, normed, &gamma, nullptr, scaled),
       "POINTWISE MUL (* gamma)");
  const g::Descriptor& bn = p.nhwc(0, "+ beta", mid, s.n, s.c, s.h, s.w, true);
  p.op(g::make_pointwise("+ beta", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, scaled, &beta, nullptr, bn),
       "POINTWISE ADD (+ beta)");
  p.op(g::make_pointwise_backward("drelu", CUDNN_POINTWISE_RELU_BWD, CUDNN_DATA_FLOAT, dgrad, bn, dz),
       "POINTWISE RELU_BWD");
  g::BnBwdWeightsTensors t{};
  t.x = &x;
  t.dy = &dz;
  t.mean = &mean;
  t.inv_std = &inv_std;
  t.scale = &gamma;
  // BN_BWD_WEIGHTS' outputs in the variant's affine type: cudnn-frontend's sample leaves
  // them to the graph's I/O type.
  const cudnnDataType_t out = dt(v.affine);
  t.dscale = &p.channel(kDGamma, "dgamma", out, s.c);
  t.dbias = &p.channel(kDBeta, "dbeta", out, s.c);
  t.eq_dy_scale = &p.channel(kEqDyScale, "eq dy scale", out, s.c);
  t.eq_x_scale = &p.channel(kEqXScale, "eq x scale", out, s.c);
  t.eq_bias = &p.channel(kEqBias, "eq bias", out, s.c);
  p.op(g::make_bn_bwd_weights("dbn weights", t), "BN_BWD_WEIGHTS");
}

void build_wgrad(Parts& p, ConvBnGraphKind kind, const ConvBnShape& s, const ConvBnVariant& v) {
  const cudnnDataType_t io = dt(v.io);
  const g::Descriptor& x = p.nhwc(kX, "x", io, s.n, s.c, s.h, s.w);
  const g::Descriptor& in = kind == ConvBnGraphKind::sbr_wgrad ? scale_bias_relu(p, x, s, v) : x;
  const g::Descriptor& dy = p.nhwc(kDY, "dy", io, s.n, s.k, s.p(), s.q());
  const g::Descriptor& dw = p.nhwc(kDW, "dw", io, s.k, s.c, s.r, s.s);
  const g::Descriptor conv = g::make_convolution("conv", conv_spec(s));
  p.op(g::make_conv_wgrad("conv wgrad", conv, in, dy, dw), "CONV_WGRAD");
}

void build(Parts& p, ConvBnGraphKind kind, const ConvBnShape& s, const ConvBnVariant& v) {
  TNT_CHECK(s.n > 0 && s.c > 0 && s.h > 0 && s.w > 0 && s.k > 0 && s.r > 0 && s.s > 0 && s.stride > 0 &&
                s.padding >= 0 && s.p() > 0 && s.q() > 0,
            "conv+BN graph: bad convolution shape {}", s.str());
  switch (kind) {
    case ConvBnGraphKind::conv_genstats:
    case ConvBnGraphKind::sbr_conv_genstats:
    case ConvBnGraphKind::sbr_conv:
    case ConvBnGraphKind::conv: build_forward(p, kind, s, v); break;
    case ConvBnGraphKind::bn_finalize: build_finalize(p, s); break;
    case ConvBnGraphKind::dgrad_drelu_dbn:
    case ConvBnGraphKind::dgrad_drelu:
    case ConvBnGraphKind::dgrad: build_dgrad(p, kind, s, v); break;
    case ConvBnGraphKind::sbr_wgrad:
    case ConvBnGraphKind::wgrad: build_wgrad(p, kind, s, v); break;
  }
}

// Whether a variant's choices appear in graph k at all: a variant that differs from one
// already tried only where k has no tensor would plan the same graph twice.
bool uses_intermediate(ConvBnGraphKind k) {
  return k != ConvBnGraphKind::conv_genstats && k != ConvBnGraphKind::conv && k != ConvBnGraphKind::bn_finalize &&
         k != ConvBnGraphKind::dgrad && k != ConvBnGraphKind::wgrad;
}
bool uses_affine(ConvBnGraphKind k) {
  return k == ConvBnGraphKind::sbr_conv_genstats || k == ConvBnGraphKind::sbr_conv || k == ConvBnGraphKind::sbr_wgrad ||
         k == ConvBnGraphKind::dgrad_drelu_dbn;
}
std::vector<ConvBnVariant> variants_of(ConvBnGraphKind k, DType io) {
  std::vector<ConvBnVariant> out;
  for (ConvBnVariant v : conv_bn_variants(io)) {
    if (!uses_intermediate(k) && v.intermediate != DType::f32) continue;
    if (!uses_affine(k) && v.affine != DType::f32) continue;
    out.push_back(v);
  }
  return out;
}

}  // namespace

std::string ConvBnShape::str() const {
  return fmt::format("N{} C{} {}x{} -> K{} {}x{}/s{}/p{} ({}x{})", n, c, h, w, k, r, s, stride, padding, p(), q());
}

const char* conv_bn_graph_kind_name(ConvBnGraphKind k) {
  switch (k) {
    case ConvBnGraphKind::conv_genstats: return "conv+genstats";
    case ConvBnGraphKind::sbr_conv_genstats: return "scale+bias+relu+conv+genstats";
    case ConvBnGraphKind::sbr_conv: return "scale+bias+relu+conv";
    case ConvBnGraphKind::conv: return "conv";
    case ConvBnGraphKind::bn_finalize: return "bn_finalize";
    case ConvBnGraphKind::dgrad_drelu_dbn: return "dgrad+drelu+dbn_weights";
    case ConvBnGraphKind::dgrad_drelu: return "dgrad+drelu";
    case ConvBnGraphKind::dgrad: return "dgrad";
    case ConvBnGraphKind::sbr_wgrad: return "scale+bias+relu+wgrad";
    case ConvBnGraphKind::wgrad: return "wgrad";
  }
  return "?";
}

std::vector<ConvBnGraphKind> conv_bn_fallbacks(ConvBnGraphKind k) {
  using K = ConvBnGraphKind;
  switch (k) {
    case K::conv_genstats: return {K::conv};
    case K::sbr_conv_genstats: return {K::sbr_conv, K::conv_genstats, K::conv};
    case K::sbr_conv: return {K::conv};
    case K::dgrad_drelu_dbn: return {K::dgrad_drelu, K::dgrad};
    case K::dgrad_drelu: return {K::dgrad};
    case K::sbr_wgrad: return {K::wgrad};
    default: return {};
  }
}

std::string ConvBnVariant::str() const {
  return fmt::format("I/O {}, scale/bias {}, intermediate {}", dtype_name(io), dtype_name(affine),
                     dtype_name(intermediate));
}

std::vector<ConvBnVariant> conv_bn_variants(DType io) {
  TNT_CHECK(io == DType::bf16 || io == DType::f16, "conv+BN graph: I/O dtype {} (bf16 or f16)", dtype_name(io));
  return {{io, DType::f32, DType::f32}, {io, io, DType::f32}, {io, io, io}, {io, DType::f32, io}};
}

ConvBnGraphText conv_bn_graph(ConvBnGraphKind kind, const ConvBnShape& shape, const ConvBnVariant& variant) {
  Parts p;
  build(p, kind, shape, variant);
  ConvBnGraphText t;
  t.ops = p.op_names;
  size_t i = 0;
  for (const auto& d : p.tensors) t.tensors.push_back(p.tensor_names[i++] + ": " + g::describe_tensor(d));
  return t;
}

std::string ConvBnPlanInfo::str() const {
  std::string s = fmt::format("{}: {} [{}] engine {} (mode {} config {}), workspace {} B{}", conv_bn_graph_kind_name(asked),
                              conv_bn_graph_kind_name(served), variant.str(), engine, mode, config, workspace,
                              compiled_only ? ", compiled only" : "");
  return s;
}

ConvBnPlanInfo conv_bn_plan_deviceless(ConvBnGraphKind kind, const ConvBnShape& shape, const std::string& device_json,
                                       bool fallbacks, DType io) {
  const g::Descriptor props = g::make_device_properties(shape.str(), device_json);
  std::vector<ConvBnGraphKind> kinds{kind};
  if (fallbacks) {
    for (ConvBnGraphKind f : conv_bn_fallbacks(kind)) kinds.push_back(f);
  }
  ConvBnPlanInfo info;
  info.asked = kind;
  for (ConvBnGraphKind k : kinds) {
    for (const ConvBnVariant& v : variants_of(k, io)) {
      const std::string what = fmt::format("{} {} [{}]", conv_bn_graph_kind_name(k), shape.str(), v.str());
      try {
        Parts p;
        build(p, k, shape, v);
        const g::Descriptor graph = g::make_operation_graph(what, nullptr, p.op_list());
        const g::Plan plan = g::make_plan_deviceless(what, props, graph);
        info.served = k;
        info.variant = v;
        info.engine = plan.engine;
        info.mode = static_cast<int64_t>(plan.mode);
        info.config = plan.config;
        info.workspace = plan.workspace;
        info.compiled_only = plan.compiled_only;
        return info;
      } catch (const std::exception& e) {
        info.refused.push_back(fmt::format("{} [{}]: {}", conv_bn_graph_kind_name(k), v.str(), e.what()));
      }
    }
  }
  std::string all;
  for (const auto& r : info.refused) all += "\n  " + r;
  TNT_THROW("conv+BN graph: cuDNN plans none of {} for {}:{}", conv_bn_graph_kind_name(kind), shape.str(), all);
}

}  // namespace tnt::cuda
