// A small owner of cuDNN's graph (backend) API descriptors: create, set attributes,
// finalize, and the few builders our operation graphs need (tensors, pointwise, matmul,
// reduction, RNG, reshape), then heuristics -> execution plan -> variant pack.
//
// Why not the legacy API: fused multi-operation graphs (flash attention, convolution +
// bias + activation chains) exist only here. Why not cudnn-frontend: it is not shipped with
// the toolkit and the backend C API is small enough for what we build.
//
// Every failure throws a tnt::Error naming the descriptor and the step (which attribute,
// finalize, which engine config) with cuDNN's status string and cuDNN's own last error
// message (cudnnGetLastErrorString), because graph failures are only diagnosable with the
// engine's reason and they happen on a lent GPU that we cannot rerun at will.
#pragma once

#include "tarantella/dtype.hpp"

#include <cudnn.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace tnt::cuda::graph {

// An attribute and its name, for messages: TNT_ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS).
struct Attr {
  cudnnBackendAttributeName_t id;
  const char* name;
};
#define TNT_ATTR(a) ::tnt::cuda::graph::Attr{a, #a}

// Throws "cuDNN graph: <what>: <status> (<cuDNN's last message>)" unless st is success.
void check(cudnnStatus_t st, const std::string& what);
// cuDNN's last error message of this thread, or "" (and clears it).
std::string last_error_message();

// A move-only owner of one backend descriptor. `name` says which one in messages.
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(cudnnBackendDescriptorType_t type, std::string name);
  ~Descriptor();
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& o) noexcept;
  Descriptor& operator=(Descriptor&& o) noexcept;

  cudnnBackendDescriptor_t get() const { return desc_; }
  const std::string& name() const { return name_; }
  bool finalized() const { return finalized_; }

  Descriptor& set(Attr a, cudnnBackendAttributeType_t type, int64_t count, const void* values);
  Descriptor& set_int64(Attr a, int64_t v) { return set(a, CUDNN_TYPE_INT64, 1, &v); }
  Descriptor& set_int64s(Attr a, const std::vector<int64_t>& v) {
    return set(a, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), v.data());
  }
  Descriptor& set_bool(Attr a, bool v);
  Descriptor& set_float(Attr a, float v);
  Descriptor& set_double(Attr a, double v) { return set(a, CUDNN_TYPE_DOUBLE, 1, &v); }
  Descriptor& set_data_type(Attr a, cudnnDataType_t v) { return set(a, CUDNN_TYPE_DATA_TYPE, 1, &v); }
  Descriptor& set_desc(Attr a, const Descriptor& d);
  Descriptor& set_descs(Attr a, const std::vector<const Descriptor*>& ds);
  Descriptor& set_handle(Attr a, cudnnHandle_t h) { return set(a, CUDNN_TYPE_HANDLE, 1, &h); }
  Descriptor& finalize();
  // The attributes set so far, in order ("CUDNN_ATTR_X", or "CUDNN_ATTR_X=v" for f32 scalars):
  // what cuDNN does not read back (alignment, pointwise scale factors) can still be pinned.
  const std::vector<std::string>& attributes_set() const { return set_; }

 private:
  void release();
  cudnnBackendDescriptor_t desc_ = nullptr;
  std::string name_;
  bool finalized_ = false;
  std::vector<std::string> set_;
};

// cuDNN's data type for a tensor of ours (f32, f16, bf16, i32, i64, bool).
cudnnDataType_t data_type(DType d, const char* what);

// Packed strides of dims, last dimension fastest.
std::vector<int64_t> packed_strides(const std::vector<int64_t>& dims);

struct TensorSpec {
  int64_t uid = 0;
  std::string name;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  bool is_virtual = false;
  bool by_value = false;  // a host scalar passed in the variant pack (pointer to the value)
  int64_t alignment = 16;
};
Descriptor make_tensor(const TensorSpec& s);

// The descriptors of one graph under construction, kept alive together (finalized operations
// refer to their tensors), its operations in order, and the names of both (for tests and
// messages). Virtual tensors get uids from first_virtual on.
struct GraphParts {
  explicit GraphParts(int64_t first_virtual) : next_virtual(first_virtual) {}
  std::deque<Descriptor> tensors, ops;
  std::vector<std::string> op_names, tensor_names;
  int64_t next_virtual;

  const Descriptor& tensor(const TensorSpec& s);
  // A virtual tensor (never in memory): dims, packed strides unless given.
  const Descriptor& virt(const std::string& name, std::vector<int64_t> dims, cudnnDataType_t dt = CUDNN_DATA_FLOAT,
                         std::vector<int64_t> strides = {});
  // A host scalar passed by value, dims (1, 1, 1, 1).
  const Descriptor& scalar(int64_t uid, const std::string& name, cudnnDataType_t dt);
  void op(Descriptor d, const std::string& name);
  std::vector<const Descriptor*> op_list() const;
};

// A finalized pointwise operation y = mode(x[, b[, t]]), computed in `math` (float for
// arithmetic, boolean for comparisons). axis >= 0 sets CUDNN_ATTR_POINTWISE_AXIS (GEN_INDEX).
Descriptor make_pointwise(const std::string& name, cudnnPointwiseMode_t mode, cudnnDataType_t math,
                          const Descriptor& x, const Descriptor* b, const Descriptor* t, const Descriptor& y,
                          int64_t axis = -1);
// c = a b over the last two dimensions, batched over the others, computed in float.
Descriptor make_matmul(const std::string& name, const Descriptor& a, const Descriptor& b, const Descriptor& c);
// y = reduce(x) over the dimensions where y has extent 1, computed in float.
Descriptor make_reduction(const std::string& name, cudnnReduceTensorOp_t op, const Descriptor& x,
                          const Descriptor& y);
// y = Bernoulli(probability) draws (1 = keep), Philox seeded by the seed and offset tensors.
Descriptor make_rng_bernoulli(const std::string& name, double probability, const Descriptor& seed,
                              const Descriptor& offset, const Descriptor& y);
// y = x viewed with y's dims and strides (a transpose, for the graph's matmul operands).
Descriptor make_reshape(const std::string& name, const Descriptor& x, const Descriptor& y);

// The backward pointwise operations (RELU_BWD, ...): dx = mode(dy, x), with cuDNN's DY / X /
// DX operand attributes (not X / B / Y, which these modes do not read), computed in `math`.
Descriptor make_pointwise_backward(const std::string& name, cudnnPointwiseMode_t mode, cudnnDataType_t math,
                                   const Descriptor& dy, const Descriptor& x, const Descriptor& dx);

// A 2-D (or N-D: one value per spatial dimension in each vector) cross-correlation, as every
// framework's "convolution" is, computed in f32; padding the same before and after.
struct ConvSpec {
  std::vector<int64_t> padding, stride, dilation;
};
Descriptor make_convolution(const std::string& name, const ConvSpec& c);
// y = conv(x, w), dx = conv^T(dy, w) (dgrad), dw = x (*) dy (wgrad); alpha 1, beta 0 (the
// output overwritten, never accumulated), as f32 scalars as cudnn-frontend passes them.
Descriptor make_conv_fprop(const std::string& name, const Descriptor& conv, const Descriptor& x, const Descriptor& w,
                           const Descriptor& y);
Descriptor make_conv_dgrad(const std::string& name, const Descriptor& conv, const Descriptor& dy, const Descriptor& w,
                           const Descriptor& dx);
Descriptor make_conv_wgrad(const std::string& name, const Descriptor& conv, const Descriptor& x, const Descriptor& dy,
                           const Descriptor& dw);
// Per-channel sum and sum of squares of x (over N, H, W), in f32: the statistics a following
// BatchNorm needs, taken while x is still in the producing kernel's registers.
Descriptor make_gen_stats(const std::string& name, const Descriptor& x, const Descriptor& sum,
                          const Descriptor& sq_sum);
// BatchNorm's training statistics from GEN_STATS' sums over accum_count values per channel:
// the equivalent scale and bias (y = eq_scale x + eq_bias), the saved mean and inverse
// standard deviation for the backward, and the running mean and variance moved by the
// exponential-average factor. epsilon, factor (f32) and accum_count (i64) are scalar tensors.
struct BnFinalizeTensors {
  const Descriptor *sum, *sq_sum, *scale, *bias, *prev_running_mean, *prev_running_var;
  const Descriptor *eq_scale, *eq_bias, *saved_mean, *saved_inv_std, *next_running_mean, *next_running_var;
  const Descriptor *epsilon, *factor, *accum_count;
};
Descriptor make_bn_finalize(const std::string& name, const BnFinalizeTensors& t);
// BatchNorm's backward reductions (dscale, dbias) and the coefficients of its input
// gradient, dx = eq_dy_scale dy + eq_x_scale x + eq_bias, from x, dy and the saved statistics.
struct BnBwdWeightsTensors {
  const Descriptor *x, *dy, *mean, *inv_std, *scale;
  const Descriptor *dscale, *dbias, *eq_dy_scale, *eq_x_scale, *eq_bias;
};
Descriptor make_bn_bwd_weights(const std::string& name, const BnBwdWeightsTensors& t);

// The operations' graph, finalized against a handle (needs a GPU), or, with a null handle,
// without one: for heuristics and plans against device properties (make_device_properties).
Descriptor make_operation_graph(const std::string& name, cudnnHandle_t handle,
                                const std::vector<const Descriptor*>& ops);

// A GPU described by its properties (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR from the JSON cuDNN
// serialises them in: maxGridSize, multiProcessorCount, maxSharedMemoryPerBlockOptin,
// deviceVer, driverVer, ...). cuDNN (9.8 and later) proposes engine configs and finalizes
// execution plans for it without the GPU ("deviceless ahead-of-time compilation"): on a
// machine without one, a graph can be checked against the GPU it will run on.
Descriptor make_device_properties(const std::string& name, const std::string& json);

// The first engine config that finalizes into an execution plan, taking heuristics modes in
// order and each mode's configs in its order (mode A first, as cudnn-frontend's SDPA callers
// ask; FALLBACK after it costs nothing when A succeeds and may find an engine A does not
// rank). Throws listing every mode and config tried and cuDNN's reason for each if none does.
struct Plan {
  // The engine config the plan was finalized from, kept for the plan's life (declared first:
  // destroyed after the plan), as cudnn-frontend's execution plans hold theirs: cuDNN does not
  // document that finalize copies it, and a plan reading a freed config would fail only when
  // it runs on a GPU.
  Descriptor engine_config;
  Descriptor plan;
  int64_t workspace = 0;  // bytes
  int64_t engine = -1;    // CUDNN_ATTR_ENGINE_GLOBAL_INDEX of the chosen engine, for logs
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;  // the heuristics mode that proposed it
  int64_t config = -1;    // its rank among that mode's configs
  // Deviceless only: the engine generated its kernel for the described GPU, and finalizing
  // stopped where the kernel is loaded (which needs a CUDA driver; this machine may have none).
  bool compiled_only = false;
};
Plan make_plan(const std::string& name, cudnnHandle_t handle, const Descriptor& op_graph,
               const std::vector<cudnnBackendHeurMode_t>& modes = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK});
// The same for the GPU `device_properties` describes, without it (and without a handle):
// the plan can be serialised or inspected, not executed. Where there is no CUDA driver to
// load the generated kernel into (a machine without a GPU, the driver's stub library in
// place of libcuda.so.1), a config whose plan got as far as loading counts, marked
// compiled_only: cuDNN accepted the graph, chose the engine and generated its code.
Plan make_plan_deviceless(const std::string& name, const Descriptor& device_properties, const Descriptor& op_graph,
                          const std::vector<cudnnBackendHeurMode_t>& modes = {CUDNN_HEUR_MODE_A,
                                                                              CUDNN_HEUR_MODE_FALLBACK});

// Up to max_plans execution plans, for timing: each heuristics mode's configs in order,
// engines that compile their kernel at run time (NVRTC, a second or more each) left out.
// With device_properties (and a null handle) for the described GPU, as make_plan_deviceless.
// What was left out or refused, and why, goes to *refused. Empty when none finalized.
std::vector<Plan> make_plans(const std::string& name, cudnnHandle_t handle, const Descriptor* device_properties,
                             const Descriptor& op_graph, size_t max_plans, std::string* refused = nullptr,
                             const std::vector<cudnnBackendHeurMode_t>& modes = {CUDNN_HEUR_MODE_A,
                                                                                 CUDNN_HEUR_MODE_FALLBACK});

// One line read back from a finalized tensor descriptor through cudnnBackendGetAttribute
// ("uid 7 bf16 [3,1,1,77] strides [77,77,77,1]", then " virtual" / " by-value"), so
// tests pin what cuDNN holds rather than what we meant to set. Works without a GPU.
std::string describe_tensor(const Descriptor& t);
// A finalized convolution descriptor read back ("cross-correlation f32 2-D pad [1,1]/[1,1]
// stride [2,2] dilation [1,1]": pre/post paddings), for tests to pin. Works without a GPU.
std::string describe_convolution(const Descriptor& conv);
// The scale factors we set on a pointwise operation ("alpha1 1 alpha2 1", "-" where unset):
// cuDNN 9.19 does not read them back, so this reports attributes_set().
std::string describe_pointwise(const Descriptor& op);

// Runs plan on handle's stream with the tensors uid -> pointer (device memory, or host for
// by-value tensors) and a workspace of at least plan.workspace bytes.
void execute(const std::string& name, cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace);

}  // namespace tnt::cuda::graph
