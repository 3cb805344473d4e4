// The Reducer's fusion plan as a plain function of the gradients' sizes and kinds: no MPI,
// no tensors, so every rule of it is unit-tested alone (tests/comm/test_bucket_plan.cpp).
//
// Buckets are formed in REVERSE registration order (backward produces the last layers'
// gradients first), greedily: a bucket takes gradients while its size is below the
// threshold, so every bucket but the last reaches it; it also closes where the dtype or the
// device changes (one fused buffer has one dtype and lives in one place). Threshold 0 (or
// 1 byte, but for empty gradients) gives one bucket per gradient.
#pragma once

#include "tarantella/device.hpp"
#include "tarantella/dtype.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tnt::comm {

struct GradientInfo {
  std::string name;  // for messages and the plan text only; the plan does not read it
  int64_t numel = 0;
  int64_t bytes = 0;
  DType dtype = DType::f32;
  Device device;
};

struct PlannedBucket {
  std::vector<size_t> gradients;  // indices in the registration list, in reverse order
  std::vector<int64_t> offsets;   // (members,) element offset of each member in the fused buffer
  int64_t elements = 0;           // fused buffer length
  int64_t bytes = 0;
  DType dtype = DType::f32;
  Device device;
};

struct BucketPlan {
  std::vector<PlannedBucket> buckets;  // in launch order
  std::vector<size_t> bucket_of;       // (gradients,) the bucket holding each gradient
};

BucketPlan plan_buckets(const std::vector<GradientInfo>& gradients, int64_t threshold_bytes);

}  // namespace tnt::comm
