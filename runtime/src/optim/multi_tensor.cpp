#include "optim/multi_tensor.hpp"

#include "tarantella/check.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace tnt::optim {

namespace {

// p + offset, keeping null null (pointer arithmetic on null is undefined).
float* advance(float* p, int64_t offset) { return p == nullptr ? nullptr : p + offset; }

}  // namespace

MtPlan make_plan(std::vector<MtTensor> tensors, int64_t chunk_elements) {
  TNT_CHECK(chunk_elements >= 1, "multi-tensor plan: chunk size must be >= 1, got {}", chunk_elements);
  TNT_CHECK(tensors.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
            "multi-tensor plan: {} tensors are more than one table can index", tensors.size());
  MtPlan plan;
  plan.chunk_elements = chunk_elements;
  plan.first_chunk.reserve(tensors.size() + 1);
  // A launch has one block per chunk, and CUDA's grid holds at most 2^31 - 1 blocks.
  constexpr int64_t kMaxChunks = std::numeric_limits<int32_t>::max();
  int64_t total_chunks = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const MtTensor& x = tensors[t];
    TNT_CHECK(x.numel >= 0, "multi-tensor plan: tensor {} has {} elements", t, x.numel);
    TNT_CHECK(x.rule >= 0 && x.rule < kMaxRules, "multi-tensor plan: tensor {} has rule {}, outside [0, {})", t,
              x.rule, kMaxRules);
    TNT_CHECK(x.numel == 0 || (x.param != nullptr && x.grad != nullptr),
              "multi-tensor plan: tensor {} ({} elements) has no parameter or gradient storage", t, x.numel);
    total_chunks += (x.numel + chunk_elements - 1) / chunk_elements;
    TNT_CHECK(total_chunks <= kMaxChunks, "multi-tensor plan: {} chunks of {} elements are more than one launch",
              total_chunks, chunk_elements);
  }
  plan.chunks.reserve(static_cast<size_t>(total_chunks));
  for (size_t t = 0; t < tensors.size(); ++t) {
    const MtTensor& x = tensors[t];
    plan.first_chunk.push_back(static_cast<int32_t>(plan.chunks.size()));
    for (int64_t begin = 0; begin < x.numel; begin += chunk_elements) {
      MtChunk c;
      c.param = advance(x.param, begin);
      c.grad = advance(x.grad, begin);
      c.slot0 = advance(x.slot0, begin);
      c.slot1 = advance(x.slot1, begin);
      c.count = std::min(chunk_elements, x.numel - begin);
      c.tensor = static_cast<int32_t>(t);
      c.rule = x.rule;
      plan.chunks.push_back(c);
    }
  }
  plan.first_chunk.push_back(static_cast<int32_t>(plan.chunks.size()));
  plan.tensors = std::move(tensors);
  return plan;
}

bool plan_matches(const MtPlan& plan, const std::vector<MtTensor>& tensors, int64_t chunk_elements) {
  return plan.chunk_elements == chunk_elements && plan.tensors == tensors;
}

std::vector<uint8_t> table_bytes(const MtPlan& plan) {
  const size_t chunk_bytes = plan.chunks.size() * sizeof(MtChunk);
  const size_t index_bytes = plan.first_chunk.size() * sizeof(int32_t);
  std::vector<uint8_t> out(chunk_bytes + index_bytes);
  if (chunk_bytes > 0) std::memcpy(out.data(), plan.chunks.data(), chunk_bytes);
  if (index_bytes > 0) std::memcpy(out.data() + chunk_bytes, plan.first_chunk.data(), index_bytes);
  return out;
}

std::vector<RuleClass> rule_classes(const std::vector<RuleClass>& per_tensor, std::vector<int32_t>& rule_of) {
  std::vector<RuleClass> classes;
  rule_of.assign(per_tensor.size(), 0);
  for (size_t i = 0; i < per_tensor.size(); ++i) {
    size_t k = 0;
    while (k < classes.size() && !(classes[k] == per_tensor[i])) ++k;
    if (k == classes.size()) classes.push_back(per_tensor[i]);
    rule_of[i] = static_cast<int32_t>(k);
  }
  return classes;
}

MtLaunch MultiTensorCache::launch_for(const std::vector<MtTensor>& tensors, Device device, int64_t chunk_elements) {
  if (!valid_ || device_ != device || !plan_matches(plan_, tensors, chunk_elements)) {
    valid_ = false;  // stays so if planning or the upload throws
    plan_ = make_plan(tensors, chunk_elements);
    const std::vector<uint8_t> bytes = table_bytes(plan_);
    // The old table may still be read by a queued kernel: it goes back to the caching
    // allocator, whose next user is ordered after that kernel on the compute stream.
    table_ = Tensor::from_data(bytes.data(), {static_cast<int64_t>(bytes.size())}).to(device);
    device_ = device;
    valid_ = true;
    ++uploads_;
  }
  MtLaunch launch;
  const auto* base = static_cast<const uint8_t*>(table_.raw());
  launch.chunks = reinterpret_cast<const MtChunk*>(base);
  launch.first_chunk = reinterpret_cast<const int32_t*>(base + first_chunk_offset(plan_));
  launch.n_chunks = static_cast<int64_t>(plan_.chunks.size());
  launch.n_tensors = static_cast<int32_t>(plan_.tensors.size());
  launch.chunk_elements = plan_.chunk_elements;
  launch.device = device;
  return launch;
}

}  // namespace tnt::optim
