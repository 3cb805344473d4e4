// The fusion plan alone (no MPI, no tensors): exact bucket contents, offsets and the
// gradient -> bucket map for thresholds 0, 1 byte, 32 KB and huge, the exact-threshold
// edge, dtype and device changes, an empty list and a single gradient.
#include "comm/bucket_plan.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace tnt;
using namespace tnt::comm;

namespace {

GradientInfo grad(int64_t numel, DType dtype = DType::f32, Device device = Device::cpu()) {
  return {"g", numel, numel * static_cast<int64_t>(dtype_size(dtype)), dtype, device};
}

using Members = std::vector<std::vector<size_t>>;

Members members(const BucketPlan& plan) {
  Members out;
  for (const PlannedBucket& b : plan.buckets) out.push_back(b.gradients);
  return out;
}

// What every plan must satisfy besides its exact contents: offsets are the running sums of
// the members' sizes, sizes add up, and bucket_of points back at the bucket.
void check_consistent(const BucketPlan& plan, const std::vector<GradientInfo>& grads) {
  REQUIRE(plan.bucket_of.size() == grads.size());
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const PlannedBucket& pb = plan.buckets[b];
    REQUIRE(pb.offsets.size() == pb.gradients.size());
    int64_t elements = 0, bytes = 0;
    for (size_t k = 0; k < pb.gradients.size(); ++k) {
      const GradientInfo& g = grads[pb.gradients[k]];
      CHECK(pb.offsets[k] == elements);
      CHECK(plan.bucket_of[pb.gradients[k]] == b);
      CHECK(g.dtype == pb.dtype);
      CHECK(g.device == pb.device);
      elements += g.numel;
      bytes += g.bytes;
    }
    CHECK(pb.elements == elements);
    CHECK(pb.bytes == bytes);
  }
}

}  // namespace

TEST_CASE("bucket plan: empty list and one gradient", "[comm][bucket_plan]") {
  BucketPlan none = plan_buckets({}, 32 * 1024);
  CHECK(none.buckets.empty());
  CHECK(none.bucket_of.empty());

  for (int64_t threshold : {int64_t{0}, int64_t{32 * 1024}, int64_t{1} << 40}) {
    std::vector<GradientInfo> one = {grad(10)};
    BucketPlan plan = plan_buckets(one, threshold);
    REQUIRE(plan.buckets.size() == 1);
    CHECK(plan.buckets[0].gradients == std::vector<size_t>{0});
    CHECK(plan.buckets[0].offsets == std::vector<int64_t>{0});
    CHECK(plan.buckets[0].elements == 10);
    CHECK(plan.buckets[0].bytes == 40);
    CHECK(plan.bucket_of == std::vector<size_t>{0});
  }
}

TEST_CASE("bucket plan: threshold 0 is one bucket per gradient, in reverse order", "[comm][bucket_plan]") {
  std::vector<GradientInfo> grads = {grad(5), grad(0), grad(7), grad(3)};
  BucketPlan plan = plan_buckets(grads, 0);
  CHECK(members(plan) == Members{{3}, {2}, {1}, {0}});
  CHECK(plan.bucket_of == std::vector<size_t>{3, 2, 1, 0});
  check_consistent(plan, grads);

  // 1 byte: the same, except that an empty gradient (0 bytes, still below) takes the next.
  BucketPlan one_byte = plan_buckets(grads, 1);
  CHECK(members(one_byte) == Members{{3}, {2}, {1, 0}});
  CHECK(one_byte.buckets[2].offsets == std::vector<int64_t>{0, 0});
  check_consistent(one_byte, grads);
}

TEST_CASE("bucket plan: greedy at 32 KB, reverse registration order", "[comm][bucket_plan]") {
  // f32 sizes in bytes: 4 KiB, 24 KiB, 16 KiB, 64 KiB, 1 KiB, 12 KiB, 20 KiB, 8 KiB.
  std::vector<GradientInfo> grads = {grad(1024), grad(6144), grad(4096), grad(16384),
                                     grad(256),  grad(3072), grad(5120), grad(2048)};
  BucketPlan plan = plan_buckets(grads, 32 * 1024);
  // From the back: 8+20 = 28 KiB < 32, +12 = 40 KiB: closes; 1 KiB + 64 KiB: closes;
  // 16 + 24 = 40 KiB: closes; 4 KiB left over (the last bucket may stay below).
  CHECK(members(plan) == Members{{7, 6, 5}, {4, 3}, {2, 1}, {0}});
  CHECK(plan.buckets[0].offsets == std::vector<int64_t>{0, 2048, 2048 + 5120});
  CHECK(plan.buckets[0].bytes == 40 * 1024);
  CHECK(plan.buckets[1].offsets == std::vector<int64_t>{0, 256});
  CHECK(plan.buckets[1].elements == 256 + 16384);
  CHECK(plan.buckets[3].bytes == 4 * 1024);
  CHECK(plan.bucket_of == std::vector<size_t>{3, 2, 2, 1, 1, 0, 0, 0});
  check_consistent(plan, grads);
}

TEST_CASE("bucket plan: a threshold above the total makes one bucket", "[comm][bucket_plan]") {
  std::vector<GradientInfo> grads = {grad(100), grad(200), grad(300)};
  BucketPlan plan = plan_buckets(grads, int64_t{1} << 40);
  CHECK(members(plan) == Members{{2, 1, 0}});
  CHECK(plan.buckets[0].offsets == std::vector<int64_t>{0, 300, 500});
  CHECK(plan.buckets[0].elements == 600);
  CHECK(plan.buckets[0].bytes == 2400);
  check_consistent(plan, grads);
}

TEST_CASE("bucket plan: a bucket that reaches the threshold exactly closes", "[comm][bucket_plan]") {
  std::vector<GradientInfo> grads(6, grad(256));  // 1 KiB each
  // At exactly 2 KiB the bucket is no longer below: two per bucket.
  CHECK(members(plan_buckets(grads, 2048)) == Members{{5, 4}, {3, 2}, {1, 0}});
  // One byte more and a third gradient is needed to reach it.
  CHECK(members(plan_buckets(grads, 2049)) == Members{{5, 4, 3}, {2, 1, 0}});
  // One byte less: still two (the second gradient is taken while at 1 KiB < 2047).
  CHECK(members(plan_buckets(grads, 2047)) == Members{{5, 4}, {3, 2}, {1, 0}});
  // Exactly one gradient's size: one each.
  CHECK(members(plan_buckets(grads, 1024)) == Members{{5}, {4}, {3}, {2}, {1}, {0}});
}

TEST_CASE("bucket plan: a bucket closes where the dtype changes", "[comm][bucket_plan]") {
  std::vector<GradientInfo> grads = {grad(10, DType::f32), grad(10, DType::f32), grad(10, DType::f16),
                                     grad(10, DType::f16), grad(10, DType::f32), grad(10, DType::bf16)};
  BucketPlan plan = plan_buckets(grads, int64_t{1} << 40);
  CHECK(members(plan) == Members{{5}, {4}, {3, 2}, {1, 0}});
  REQUIRE(plan.buckets.size() == 4);
  CHECK(plan.buckets[0].dtype == DType::bf16);
  CHECK(plan.buckets[1].dtype == DType::f32);
  CHECK(plan.buckets[2].dtype == DType::f16);
  CHECK(plan.buckets[2].bytes == 40);
  CHECK(plan.buckets[3].dtype == DType::f32);
  check_consistent(plan, grads);

  // 40 bytes: a kind change closes a bucket below it (the bf16 one), two f16 gradients
  // (20 bytes each) share one, and an f32 one (40 bytes) is alone.
  BucketPlan small = plan_buckets(grads, 40);
  CHECK(members(small) == Members{{5}, {4}, {3, 2}, {1}, {0}});
  check_consistent(small, grads);
}

TEST_CASE("bucket plan: a bucket closes where the device changes", "[comm][bucket_plan]") {
  std::vector<GradientInfo> grads = {grad(8, DType::f32, Device::cuda(0)), grad(8, DType::f32, Device::cuda(1)),
                                     grad(8, DType::f32, Device::cuda(1)), grad(8, DType::f32, Device::cpu()),
                                     grad(8, DType::f32, Device::cuda(0))};
  BucketPlan plan = plan_buckets(grads, int64_t{1} << 40);
  CHECK(members(plan) == Members{{4}, {3}, {2, 1}, {0}});
  REQUIRE(plan.buckets.size() == 4);
  CHECK(plan.buckets[0].device == Device::cuda(0));
  CHECK(plan.buckets[1].device == Device::cpu());
  CHECK(plan.buckets[2].device == Device::cuda(1));
  CHECK(plan.buckets[3].device == Device::cuda(0));
  check_consistent(plan, grads);
}
