#include "comm/bucket_plan.hpp"

namespace tnt::comm {

BucketPlan plan_buckets(const std::vector<GradientInfo>& gradients, int64_t threshold_bytes) {
  BucketPlan plan;
  plan.bucket_of.assign(gradients.size(), 0);
  for (size_t end = gradients.size(); end > 0;) {
    PlannedBucket b;
    b.dtype = gradients[end - 1].dtype;
    b.device = gradients[end - 1].device;
    // Greedy: the first gradient always goes in; the next ones while the bucket is still
    // below the threshold and of the same kind.
    do {
      const GradientInfo& g = gradients[end - 1];
      if (!b.gradients.empty() && (g.dtype != b.dtype || g.device != b.device)) break;
      b.gradients.push_back(end - 1);
      b.offsets.push_back(b.elements);
      b.elements += g.numel;
      b.bytes += g.bytes;
      plan.bucket_of[end - 1] = plan.buckets.size();
      --end;
    } while (end > 0 && b.bytes < threshold_bytes);
    plan.buckets.push_back(std::move(b));
  }
  return plan;
}

}  // namespace tnt::comm
