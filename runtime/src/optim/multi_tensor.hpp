// Multi-tensor optimizer steps: every parameter of a step in one kernel launch per rule.
//
// The per-parameter CUDA kernels cost one launch per tensor (ResNet-50: 161 per step, and
// as many again for clipping). Here the step's tensors are cut into chunks of a fixed size,
// each chunk a row of a table in device memory, and one launch walks the table with one
// block per chunk. The table holds pointers and counts only; the scalars of the step (the
// learning rate, Adam's bias corrections) travel as kernel arguments, as up to kMaxRules
// rules per launch, and each row names the rule its tensor follows. Parameters are told
// apart by (decay, t): whether weight decay applies to them and their update count after
// this step, which is all a rule depends on besides the optimizer's options.
//
// Parameters, gradients and optimizer slots are allocated once, so the table stays valid
// step after step: MultiTensorCache uploads it when the tensors change (their storage, their
// counts, the set of parameters, e.g. one frozen through Parameter::trainable, or the rule
// of one) and reuses it otherwise. Planning is plain host code (tests/optim/
// test_multi_tensor_plan.cpp); the kernels (optim_cuda.cu) only read the table.
#pragma once

#include "tarantella/device.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <type_traits>
#include <vector>

namespace tnt::optim {

// Elements per chunk (one CUDA block each). Large enough that a block's setup is small
// against its work, small enough that a large parameter spreads over many blocks.
constexpr int64_t kChunkElements = int64_t{1} << 16;
// Rules one launch carries as its argument; a step with more (decay, t) classes takes the
// per-parameter path.
constexpr int kMaxRules = 8;

// One tensor of the step as the plan sees it: a parameter, its gradient and up to two
// optimizer slots of the same element count (SGD: momentum_buffer or none; Adam: exp_avg,
// exp_avg_sq). Null stands for a slot the optimizer does not have.
struct MtTensor {
  float* param = nullptr;
  float* grad = nullptr;
  float* slot0 = nullptr;
  float* slot1 = nullptr;
  int64_t numel = 0;
  int32_t rule = 0;  // index into the launch's rules
  bool operator==(const MtTensor&) const = default;
};

// One row of the device table: the work of one block. The pointers are already advanced to
// the chunk's first element (a null slot stays null).
struct MtChunk {
  float* param;
  float* grad;
  float* slot0;
  float* slot1;
  int64_t count;   // 1 .. chunk_elements
  int32_t tensor;  // index of the tensor in the plan
  int32_t rule;
};
// Host and device read the same bytes: a plain layout with no padding to disagree on.
static_assert(std::is_standard_layout_v<MtChunk> && std::is_trivially_copyable_v<MtChunk>);
static_assert(sizeof(MtChunk) == 48);

struct MtPlan {
  int64_t chunk_elements = kChunkElements;
  std::vector<MtTensor> tensors;
  // Tensor by tensor, each one's chunks in element order; an empty tensor has none.
  std::vector<MtChunk> chunks;
  // (tensors + 1): tensor t owns chunks [first_chunk[t], first_chunk[t + 1]).
  std::vector<int32_t> first_chunk;
};

// Throws for a negative count, a null parameter or gradient of a non-empty tensor, a rule
// outside [0, kMaxRules), chunk_elements < 1, or more chunks than a launch can have.
MtPlan make_plan(std::vector<MtTensor> tensors, int64_t chunk_elements = kChunkElements);

// Whether plan is the plan of these tensors (then its uploaded table can be reused).
bool plan_matches(const MtPlan& plan, const std::vector<MtTensor>& tensors, int64_t chunk_elements);

// The table as the kernels read it: chunks, then first_chunk, in one buffer of bytes.
std::vector<uint8_t> table_bytes(const MtPlan& plan);
inline size_t first_chunk_offset(const MtPlan& plan) { return plan.chunks.size() * sizeof(MtChunk); }

// What one rule of a step depends on besides the options and the learning rate.
struct RuleClass {
  bool decay = true;  // weight decay applies (the optimizer's decay filter)
  int64_t t = 1;      // the parameter's update count, this update included
  bool operator==(const RuleClass&) const = default;
};

// The distinct classes in order of first appearance, and each tensor's index among them
// (written to rule_of, one per element of per_tensor).
std::vector<RuleClass> rule_classes(const std::vector<RuleClass>& per_tensor, std::vector<int32_t>& rule_of);

// The uploaded table as a kernel launch takes it.
struct MtLaunch {
  const MtChunk* chunks = nullptr;       // (n_chunks), in the device's memory
  const int32_t* first_chunk = nullptr;  // (n_tensors + 1), in the device's memory
  int64_t n_chunks = 0;
  int32_t n_tensors = 0;
  int64_t chunk_elements = kChunkElements;
  Device device;
};

// One step as Optimizer::update_multi_tensor receives it: the table and the rule classes
// its rows refer to (rule k of a launch is built from classes[k]).
struct MultiTensorStep {
  MtLaunch launch;
  std::vector<RuleClass> classes;
};

// The table of the last step, on the device of its tensors, kept while they stay the same.
class MultiTensorCache {
 public:
  // The launch for these tensors: the cached table when plan_matches, else a new plan
  // uploaded to device (a synchronous copy, only when the tensors changed).
  MtLaunch launch_for(const std::vector<MtTensor>& tensors, Device device,
                      int64_t chunk_elements = kChunkElements);
  int64_t uploads() const { return uploads_; }  // how many tables were made (for tests)
  const MtPlan& plan() const { return plan_; }

 private:
  MtPlan plan_;
  Tensor table_;  // u8 (table_bytes) on device_
  Device device_;
  bool valid_ = false;
  int64_t uploads_ = 0;
};

}  // namespace tnt::optim
