#include "backend/cuda/cudnn_graph.hpp"

#include "tarantella/check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

namespace tnt::cuda::graph {

std::string last_error_message() {
  char buf[1024] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return std::string(buf);
}

void check(cudnnStatus_t st, const std::string& what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  const std::string last = last_error_message();
  TNT_THROW("cuDNN graph: {}: {}{}", what, cudnnGetErrorString(st), last.empty() ? "" : " (" + last + ")");
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
  check(cudnnBackendCreateDescriptor(type, &desc_), fmt::format("{}: create descriptor type {}", name_,
                                                                static_cast<int>(type)));
}

Descriptor::~Descriptor() { release(); }

void Descriptor::release() {
  if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
  desc_ = nullptr;
}

Descriptor::Descriptor(Descriptor&& o) noexcept
    : desc_(std::exchange(o.desc_, nullptr)),
      name_(std::move(o.name_)),
      finalized_(o.finalized_),
      set_(std::move(o.set_)) {}

Descriptor& Descriptor::operator=(Descriptor&& o) noexcept {
  if (this != &o) {
    release();
    desc_ = std::exchange(o.desc_, nullptr);
    name_ = std::move(o.name_);
    finalized_ = o.finalized_;
    set_ = std::move(o.set_);
  }
  return *this;
}

Descriptor& Descriptor::set(Attr a, cudnnBackendAttributeType_t type, int64_t count, const void* values) {
  check(cudnnBackendSetAttribute(desc_, a.id, type, count, values), fmt::format("{}: set {}", name_, a.name));
  set_.emplace_back(a.name);
  return *this;
}

Descriptor& Descriptor::set_float(Attr a, float v) {
  set(a, CUDNN_TYPE_FLOAT, 1, &v);
  set_.back() += fmt::format("={}", v);
  return *this;
}

Descriptor& Descriptor::set_bool(Attr a, bool v) {
  // cuDNN reads CUDNN_TYPE_BOOLEAN as a C++ bool.
  return set(a, CUDNN_TYPE_BOOLEAN, 1, &v);
}

Descriptor& Descriptor::set_desc(Attr a, const Descriptor& d) {
  TNT_CHECK(d.get() != nullptr, "cuDNN graph: {}: set {} to an empty descriptor", name_, a.name);
  cudnnBackendDescriptor_t raw = d.get();
  check(cudnnBackendSetAttribute(desc_, a.id, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw),
        fmt::format("{}: set {} to {}", name_, a.name, d.name()));
  set_.emplace_back(a.name);
  return *this;
}

Descriptor& Descriptor::set_descs(Attr a, const std::vector<const Descriptor*>& ds) {
  std::vector<cudnnBackendDescriptor_t> raw;
  raw.reserve(ds.size());
  for (const Descriptor* d : ds) raw.push_back(d->get());
  return set(a, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(raw.size()), raw.data());
}

Descriptor& Descriptor::finalize() {
  check(cudnnBackendFinalize(desc_), fmt::format("{}: finalize", name_));
  finalized_ = true;
  return *this;
}

const Descriptor& GraphParts::tensor(const TensorSpec& s) {
  tensors.push_back(make_tensor(s));
  tensor_names.push_back(s.name);
  return tensors.back();
}

const Descriptor& GraphParts::virt(const std::string& name, std::vector<int64_t> dims, cudnnDataType_t dt,
                                   std::vector<int64_t> strides) {
  TensorSpec s;
  s.uid = next_virtual++;
  s.name = name;
  s.dtype = dt;
  s.strides = strides.empty() ? packed_strides(dims) : std::move(strides);
  s.dims = std::move(dims);
  s.is_virtual = true;
  return tensor(s);
}

const Descriptor& GraphParts::scalar(int64_t uid, const std::string& name, cudnnDataType_t dt) {
  TensorSpec s;
  s.uid = uid;
  s.name = name;
  s.dtype = dt;
  s.dims = {1, 1, 1, 1};
  s.strides = {1, 1, 1, 1};
  s.by_value = true;
  return tensor(s);
}

void GraphParts::op(Descriptor d, const std::string& name) {
  ops.push_back(std::move(d));
  op_names.push_back(name);
}

std::vector<const Descriptor*> GraphParts::op_list() const {
  std::vector<const Descriptor*> v;
  for (const auto& d : ops) v.push_back(&d);
  return v;
}

cudnnDataType_t data_type(DType d, const char* what) {
  switch (d) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::i32: return CUDNN_DATA_INT32;
    case DType::i64: return CUDNN_DATA_INT64;
    default: TNT_THROW("cuDNN graph: {}: dtype {} has no graph data type", what, dtype_name(d));
  }
}

std::vector<int64_t> packed_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

Descriptor make_tensor(const TensorSpec& s) {
  TNT_CHECK(s.dims.size() == s.strides.size() && !s.dims.empty(), "cuDNN graph: tensor {}: {} dims, {} strides",
            s.name, s.dims.size(), s.strides.size());
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, fmt::format("tensor {} (uid {})", s.name, s.uid));
  t.set_data_type(TNT_ATTR(CUDNN_ATTR_TENSOR_DATA_TYPE), s.dtype)
      .set_int64s(TNT_ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS), s.dims)
      .set_int64s(TNT_ATTR(CUDNN_ATTR_TENSOR_STRIDES), s.strides)
      .set_int64(TNT_ATTR(CUDNN_ATTR_TENSOR_UNIQUE_ID), s.uid)
      .set_int64(TNT_ATTR(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), s.alignment);
  // Set only when true, as cudnn-frontend does: the descriptors then match attribute for
  // attribute what cuDNN's tested callers give its engines.
  if (s.is_virtual) t.set_bool(TNT_ATTR(CUDNN_ATTR_TENSOR_IS_VIRTUAL), true);
  if (s.by_value) t.set_bool(TNT_ATTR(CUDNN_ATTR_TENSOR_IS_BY_VALUE), true);
  t.finalize();
  return t;
}

Descriptor make_pointwise(const std::string& name, cudnnPointwiseMode_t mode, cudnnDataType_t math,
                          const Descriptor& x, const Descriptor* b, const Descriptor* t, const Descriptor& y,
                          int64_t axis) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise " + name);
  pw.set(TNT_ATTR(CUDNN_ATTR_POINTWISE_MODE), CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set_data_type(TNT_ATTR(CUDNN_ATTR_POINTWISE_MATH_PREC), math);
  if (axis >= 0) pw.set_int64(TNT_ATTR(CUDNN_ATTR_POINTWISE_AXIS), axis);
  pw.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), pw)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), x);
  if (b != nullptr) op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_BDESC), *b);
  if (t != nullptr) op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_TDESC), *t);
  // cudnn-frontend sets both scale factors to 1 (f32) on every pointwise operation; cuDNN's
  // defaults should be the same, but its pattern matcher has only ever been shown the former.
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_YDESC), y)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1), 1.0f)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2), 1.0f)
      .finalize();
  return op;
}

Descriptor make_matmul(const std::string& name, const Descriptor& a, const Descriptor& b, const Descriptor& c) {
  Descriptor mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul " + name);
  mm.set_data_type(TNT_ATTR(CUDNN_ATTR_MATMUL_COMP_TYPE), CUDNN_DATA_FLOAT).finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_MATMUL_ADESC), a)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_MATMUL_BDESC), b)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_MATMUL_CDESC), c)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_MATMUL_DESC), mm)
      .finalize();
  return op;
}

Descriptor make_reduction(const std::string& name, cudnnReduceTensorOp_t reduce, const Descriptor& x,
                          const Descriptor& y) {
  Descriptor rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction " + name);
  rd.set(TNT_ATTR(CUDNN_ATTR_REDUCTION_OPERATOR), CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce)
      .set_data_type(TNT_ATTR(CUDNN_ATTR_REDUCTION_COMP_TYPE), CUDNN_DATA_FLOAT)
      .finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_XDESC), x)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_YDESC), y)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_DESC), rd)
      .finalize();
  return op;
}

Descriptor make_rng_bernoulli(const std::string& name, double probability, const Descriptor& seed,
                              const Descriptor& offset, const Descriptor& y) {
  Descriptor rng(CUDNN_BACKEND_RNG_DESCRIPTOR, "rng " + name);
  const cudnnRngDistribution_t dist = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
  rng.set(TNT_ATTR(CUDNN_ATTR_RNG_DISTRIBUTION), CUDNN_TYPE_RNG_DISTRIBUTION, 1, &dist)
      .set_double(TNT_ATTR(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY), probability)
      .finalize();
  // The seed as a tensor (not the INT64 attribute) so that one plan serves every step's seed.
  Descriptor op(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_RNG_YDESC), y)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_RNG_SEED), seed)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC), offset)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_RNG_DESC), rng)
      .finalize();
  return op;
}

Descriptor make_reshape(const std::string& name, const Descriptor& x, const Descriptor& y) {
  Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_RESHAPE_XDESC), x)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_RESHAPE_YDESC), y)
      .finalize();
  return op;
}

Descriptor make_pointwise_backward(const std::string& name, cudnnPointwiseMode_t mode, cudnnDataType_t math,
                                   const Descriptor& dy, const Descriptor& x, const Descriptor& dx) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise " + name);
  pw.set(TNT_ATTR(CUDNN_ATTR_POINTWISE_MODE), CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set_data_type(TNT_ATTR(CUDNN_ATTR_POINTWISE_MATH_PREC), math)
      .finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), pw)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC), dy)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), x)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_DXDESC), dx)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1), 1.0f)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2), 1.0f)
      .finalize();
  return op;
}

Descriptor make_convolution(const std::string& name, const ConvSpec& c) {
  const size_t dims = c.padding.size();
  TNT_CHECK(dims > 0 && c.stride.size() == dims && c.dilation.size() == dims,
            "cuDNN graph: convolution {}: {} paddings, {} strides, {} dilations (one each per spatial dimension)",
            name, c.padding.size(), c.stride.size(), c.dilation.size());
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = static_cast<int64_t>(dims);
  Descriptor d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "convolution " + name);
  d.set_data_type(TNT_ATTR(CUDNN_ATTR_CONVOLUTION_COMP_TYPE), CUDNN_DATA_FLOAT)
      .set(TNT_ATTR(CUDNN_ATTR_CONVOLUTION_CONV_MODE), CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set_int64(TNT_ATTR(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS), spatial)
      .set_int64s(TNT_ATTR(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS), c.padding)
      .set_int64s(TNT_ATTR(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS), c.padding)
      .set_int64s(TNT_ATTR(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES), c.stride)
      .set_int64s(TNT_ATTR(CUDNN_ATTR_CONVOLUTION_DILATIONS), c.dilation)
      .finalize();
  return d;
}

Descriptor make_conv_fprop(const std::string& name, const Descriptor& conv, const Descriptor& x, const Descriptor& w,
                           const Descriptor& y) {
  Descriptor op(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X), x)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W), w)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y), y)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC), conv)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA), 1.0f)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA), 0.0f)
      .finalize();
  return op;
}

Descriptor make_conv_dgrad(const std::string& name, const Descriptor& conv, const Descriptor& dy, const Descriptor& w,
                           const Descriptor& dx) {
  Descriptor op(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY), dy)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W), w)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX), dx)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC), conv)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA), 1.0f)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA), 0.0f)
      .finalize();
  return op;
}

Descriptor make_conv_wgrad(const std::string& name, const Descriptor& conv, const Descriptor& x, const Descriptor& dy,
                           const Descriptor& dw) {
  Descriptor op(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, "operation " + name);
  op.set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X), x)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY), dy)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW), dw)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC), conv)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA), 1.0f)
      .set_float(TNT_ATTR(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA), 0.0f)
      .finalize();
  return op;
}

Descriptor make_gen_stats(const std::string& name, const Descriptor& x, const Descriptor& sum,
                          const Descriptor& sq_sum) {
  const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  Descriptor op(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, "operation " + name);
  op.set(TNT_ATTR(CUDNN_ATTR_OPERATION_GENSTATS_MODE), CUDNN_TYPE_GENSTATS_MODE, 1, &mode)
      .set_data_type(TNT_ATTR(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC), CUDNN_DATA_FLOAT)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_GENSTATS_XDESC), x)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC), sum)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC), sq_sum)
      .finalize();
  return op;
}

Descriptor make_bn_finalize(const std::string& name, const BnFinalizeTensors& t) {
  const cudnnBnFinalizeStatsMode_t mode = CUDNN_BN_FINALIZE_STATISTICS_TRAINING;
  Descriptor op(CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR, "operation " + name);
  op.set(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_STATS_MODE), CUDNN_TYPE_BN_FINALIZE_STATS_MODE, 1, &mode)
      .set_data_type(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_MATH_PREC), CUDNN_DATA_FLOAT)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SUM_DESC), *t.sum)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC), *t.sq_sum)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_SCALE_DESC), *t.eq_scale)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_BIAS_DESC), *t.eq_bias)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_MEAN_DESC), *t.saved_mean)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC), *t.saved_inv_std)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_SCALE_DESC), *t.scale)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_BIAS_DESC), *t.bias)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC), *t.prev_running_mean)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC), *t.prev_running_var)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC), *t.next_running_mean)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC), *t.next_running_var)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_EPSILON_DESC), *t.epsilon)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC), *t.factor)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC), *t.accum_count)
      .finalize();
  return op;
}

Descriptor make_bn_bwd_weights(const std::string& name, const BnBwdWeightsTensors& t) {
  Descriptor op(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, "operation " + name);
  op.set_data_type(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC), CUDNN_DATA_FLOAT)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC), *t.eq_dy_scale)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC), *t.eq_x_scale)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS), *t.eq_bias)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC), *t.mean)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC), *t.inv_std)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC), *t.scale)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC), *t.x)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC), *t.dy)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC), *t.dscale)
      .set_desc(TNT_ATTR(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC), *t.dbias)
      .finalize();
  return op;
}

Descriptor make_operation_graph(const std::string& name, cudnnHandle_t handle,
                                const std::vector<const Descriptor*>& ops) {
  Descriptor g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph " + name);
  g.set_descs(TNT_ATTR(CUDNN_ATTR_OPERATIONGRAPH_OPS), ops);
  if (handle != nullptr) g.set_handle(TNT_ATTR(CUDNN_ATTR_OPERATIONGRAPH_HANDLE), handle);
  g.finalize();
  return g;
}

Descriptor make_device_properties(const std::string& name, const std::string& json) {
  Descriptor d(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties " + name);
  d.set(TNT_ATTR(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION), CUDNN_TYPE_CHAR, static_cast<int64_t>(json.size()),
        json.data())
      .finalize();
  return d;
}

namespace {

// The engine configs heuristics `mode` proposes for op_graph, in its order of preference.
std::vector<Descriptor> engine_configs(const std::string& name, const Descriptor& op_graph,
                                       cudnnBackendHeurMode_t mode, const Descriptor* device_properties) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
                  fmt::format("heuristics mode {} {}", static_cast<int>(mode), name));
  heur.set_desc(TNT_ATTR(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH), op_graph)
      .set(TNT_ATTR(CUDNN_ATTR_ENGINEHEUR_MODE), CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (device_properties != nullptr) heur.set_desc(TNT_ATTR(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP), *device_properties);
  heur.finalize();
  int64_t count = 0;
  check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr),
        heur.name() + ": count CUDNN_ATTR_ENGINEHEUR_RESULTS");
  TNT_CHECK(count > 0, "cuDNN graph: {}: no engine config for this graph ({})", heur.name(), last_error_message());
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, fmt::format("engine config {} (mode {}) of {}", i,
                                                                         static_cast<int>(mode), name));
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                 raw.data()),
        heur.name() + ": get CUDNN_ATTR_ENGINEHEUR_RESULTS");
  configs.resize(static_cast<size_t>(std::min(got, count)));
  // cuDNN 9.19 counts results for graphs none of its engines take, then returns none of them
  // (deviceless, e.g. a fused pattern not served on the described GPU): say so, not "0 configs".
  TNT_CHECK(!configs.empty(), "cuDNN graph: {}: heuristics counted {} engine configs but returned none{}", heur.name(),
            count, [] {
              const std::string m = last_error_message();
              return m.empty() ? std::string() : " (" + m + ")";
            }());
  return configs;
}

}  // namespace

namespace {

// make_plan with a handle, or (handle null) for the GPU device_properties describes.
Plan plan_for(const std::string& name, cudnnHandle_t handle, const Descriptor* device_properties,
              const Descriptor& op_graph, const std::vector<cudnnBackendHeurMode_t>& modes) {
  std::string tried;
  int64_t total = 0;
  for (cudnnBackendHeurMode_t mode : modes) {
    std::vector<Descriptor> configs;
    try {
      configs = engine_configs(name, op_graph, mode, device_properties);
    } catch (const std::exception& e) {
      tried += fmt::format("\n  heuristics mode {}: {}", static_cast<int>(mode), e.what());
      continue;
    }
    for (size_t i = 0; i < configs.size(); ++i, ++total) {
      int64_t engine = -1;
      try {
        // The config's engine, for the log line (best effort: not every cuDNN reports it).
        Descriptor eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR, fmt::format("engine of config {} of {}", i, name));
        cudnnBackendDescriptor_t e = eng.get();
        int64_t n = 0;
        if (cudnnBackendGetAttribute(configs[i].get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &n, &e) == CUDNN_STATUS_SUCCESS) {
          cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &engine);
        }
        Plan p;
        p.plan = Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                            fmt::format("execution plan {} (mode {}) of {}", i, static_cast<int>(mode), name));
        if (handle != nullptr) p.plan.set_handle(TNT_ATTR(CUDNN_ATTR_EXECUTION_PLAN_HANDLE), handle);
        if (device_properties != nullptr) {
          p.plan.set_desc(TNT_ATTR(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP), *device_properties);
        }
        p.plan.set_desc(TNT_ATTR(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), configs[i]);
        if (device_properties != nullptr) {
          const cudnnStatus_t st = cudnnBackendFinalize(p.plan.get());
          const std::string last = st == CUDNN_STATUS_SUCCESS ? "" : last_error_message();
          if (st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER &&
              (last.find("LoadData") != std::string::npos || last.find("loadModule") != std::string::npos)) {
            p.engine = engine;
            p.mode = mode;
            p.config = static_cast<int64_t>(i);
            p.compiled_only = true;
            return p;
          }
          if (st != CUDNN_STATUS_SUCCESS) {
            TNT_THROW("cuDNN graph: {}: finalize: {}{}", p.plan.name(), cudnnGetErrorString(st),
                      last.empty() ? "" : " (" + last + ")");
          }
        } else {
          p.plan.finalize();
        }
        int64_t n2 = 0;
        check(cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                       &n2, &p.workspace),
              p.plan.name() + ": get CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE");
        p.engine = engine;
        p.mode = mode;
        p.config = static_cast<int64_t>(i);
        p.engine_config = std::move(configs[i]);
        return p;
      } catch (const std::exception& e) {
        tried += fmt::format("\n  mode {} config {} (engine {}): {}", static_cast<int>(mode), i, engine, e.what());
      }
    }
  }
  std::vector<int> mode_ids;
  for (cudnnBackendHeurMode_t m : modes) mode_ids.push_back(static_cast<int>(m));
  TNT_THROW("cuDNN graph: {}: none of the {} engine configs of heuristics modes [{}] finalized:{}", name, total,
            fmt::join(mode_ids, ","), tried);
}

}  // namespace

Plan make_plan(const std::string& name, cudnnHandle_t handle, const Descriptor& op_graph,
               const std::vector<cudnnBackendHeurMode_t>& modes) {
  return plan_for(name, handle, nullptr, op_graph, modes);
}

Plan make_plan_deviceless(const std::string& name, const Descriptor& device_properties, const Descriptor& op_graph,
                          const std::vector<cudnnBackendHeurMode_t>& modes) {
  return plan_for(name, nullptr, &device_properties, op_graph, modes);
}

namespace {

template <typename T>
std::vector<T> get_values(const Descriptor& d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t type,
                          const char* what, int64_t max_count) {
  std::vector<T> v(static_cast<size_t>(max_count));
  int64_t n = 0;
  check(cudnnBackendGetAttribute(d.get(), a, type, max_count, &n, v.data()), d.name() + ": get " + what);
  v.resize(static_cast<size_t>(n));
  return v;
}

bool get_bool(const Descriptor& d, cudnnBackendAttributeName_t a, const char* what) {
  bool v = false;
  int64_t n = 0;
  check(cudnnBackendGetAttribute(d.get(), a, CUDNN_TYPE_BOOLEAN, 1, &n, &v), d.name() + ": get " + what);
  return n > 0 && v;
}

std::string data_type_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "f32";
    case CUDNN_DATA_HALF: return "f16";
    case CUDNN_DATA_BFLOAT16: return "bf16";
    case CUDNN_DATA_INT32: return "i32";
    case CUDNN_DATA_INT64: return "i64";
    case CUDNN_DATA_BOOLEAN: return "bool";
    default: return fmt::format("dtype#{}", static_cast<int>(t));
  }
}

}  // namespace

std::string describe_tensor(const Descriptor& t) {
  const auto dt = get_values<cudnnDataType_t>(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, "data type", 1);
  const auto dims = get_values<int64_t>(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, "dimensions", 8);
  const auto strides = get_values<int64_t>(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, "strides", 8);
  const auto uid = get_values<int64_t>(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, "unique id", 1);
  const bool virt = get_bool(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, "is virtual");
  const bool by_value = get_bool(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, "is by value");
  // Not the byte alignment: cuDNN 9.19 does not read it back (NOT_SUPPORTED).
  return fmt::format("uid {} {} [{}] strides [{}]{}{}", uid.at(0), data_type_name(dt.at(0)),
                     fmt::join(dims, ","), fmt::join(strides, ","),
                     virt ? " virtual" : "", by_value ? " by-value" : "");
}

std::string describe_convolution(const Descriptor& c) {
  const auto comp = get_values<cudnnDataType_t>(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE,
                                                "compute type", 1);
  // cuDNN 9.19 takes the mode as CUDNN_TYPE_CONVOLUTION_MODE but gives it back only under
  // CUDNN_TYPE_DATA_TYPE (BAD_PARAM_ATTRIBUTE_TYPE otherwise); both are 4-byte enums.
  const auto mode = get_values<cudnnConvolutionMode_t>(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_DATA_TYPE,
                                                       "mode", 1);
  const auto dims = get_values<int64_t>(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, "spatial dims", 1);
  const auto pre = get_values<int64_t>(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, "pre paddings", 8);
  const auto post = get_values<int64_t>(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, "post paddings", 8);
  const auto stride = get_values<int64_t>(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, "strides", 8);
  const auto dil = get_values<int64_t>(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, "dilations", 8);
  return fmt::format("{} {} {}-D pad [{}]/[{}] stride [{}] dilation [{}]",
                     mode.at(0) == CUDNN_CROSS_CORRELATION ? "cross-correlation" : "convolution",
                     data_type_name(comp.at(0)), dims.at(0), fmt::join(pre, ","), fmt::join(post, ","),
                     fmt::join(stride, ","), fmt::join(dil, ","));
}

std::string describe_pointwise(const Descriptor& op) {
  auto value = [&](const std::string& attr) -> std::string {
    for (const auto& a : op.attributes_set()) {
      if (a.rfind(attr + "=", 0) == 0) return a.substr(attr.size() + 1);
    }
    return "-";
  };
  return fmt::format("alpha1 {} alpha2 {}", value("CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1"),
                     value("CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2"));
}

void execute(const std::string& name, cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  TNT_CHECK(uids.size() == pointers.size(), "cuDNN graph: {}: {} uids, {} pointers", name, uids.size(),
            pointers.size());
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack " + name);
  pack.set(TNT_ATTR(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data())
      .set(TNT_ATTR(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
           pointers.data())
      .set(TNT_ATTR(CUDNN_ATTR_VARIANT_PACK_WORKSPACE), CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  check(cudnnBackendExecute(handle, plan.plan.get(), pack.get()), "execute " + name);
}

}  // namespace tnt::cuda::graph
