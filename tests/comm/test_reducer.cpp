// The Reducer on host gradients: plans for thresholds 0, 1 byte, 32 KB and larger than the
// model; gradients marked ready in a different random order on every rank (and every
// step), with world-communicator traffic in between; exact results for the default
// scale, explicit scale and per-rank factors; identical plans on every rank; the
// fingerprint check failing cleanly, on every rank, when one rank registers a different
// shape, threshold or gradient count.
#include "comm_test_data.hpp"

#include "tarantella/comm.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace tnt;

namespace {

struct Spec {
  std::string name;
  Shape shape;
};

// A small convolutional model's parameters in registration order, with a zero-size one
// (so the 1-byte threshold differs from 0) and one of 128 KiB (above 32 KB on its own).
std::vector<Spec> model() {
  return {{"conv1.weight", {16, 3, 3, 3}}, {"conv1.bias", {16}},        {"bn1.weight", {16}},
          {"bn1.bias", {16}},              {"conv2.weight", {32, 16, 3, 3}}, {"conv2.bias", {32}},
          {"gate.weight", {0}},            {"fc1.weight", {64, 512}},   {"fc1.bias", {64}},
          {"fc2.weight", {10, 64}},        {"fc2.bias", {10}}};
}

std::vector<std::pair<std::string, Tensor>> make_grads(const std::vector<Spec>& specs) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Spec& s : specs) out.emplace_back(s.name, Tensor::zeros(s.shape));
  return out;
}

// Gradient g's element i on rank r, distinct per gradient and step.
float grad_value(size_t g, int64_t i, int r, int step) {
  return test::value<float>(i + static_cast<int64_t>(g) * 1000 + step * 17, r);
}

void fill(std::vector<std::pair<std::string, Tensor>>& grads, int r, int step) {
  for (size_t g = 0; g < grads.size(); ++g) {
    float* d = grads[g].second.data<float>();
    for (int64_t i = 0; i < grads[g].second.numel(); ++i) d[i] = grad_value(g, i, r, step);
  }
}

// Counts elements that differ from expect(g, i) (bitwise).
int64_t count_wrong(const std::vector<std::pair<std::string, Tensor>>& grads,
                    const std::function<float(size_t, int64_t)>& expect) {
  int64_t wrong = 0;
  for (size_t g = 0; g < grads.size(); ++g) {
    const float* d = grads[g].second.data<float>();
    for (int64_t i = 0; i < grads[g].second.numel(); ++i) wrong += !test::same(d[i], expect(g, i));
  }
  return wrong;
}

// Marks every gradient in a random order of this rank and step; every third by name, and
// a small allreduce on the world communicator midway (the Reducer works on its own).
void mark_all(Reducer& reducer, const std::vector<std::pair<std::string, Tensor>>& grads, int r, int step) {
  std::vector<size_t> order(grads.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(static_cast<unsigned>(1000 * r + step + 1));
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t k = 0; k < order.size(); ++k) {
    if (k % 3 == 0) {
      reducer.add(grads[order[k]].first);
    } else {
      reducer.mark_ready(order[k]);
    }
    if (k == order.size() / 2) {
      CHECK(communicator().allreduce_sum(int64_t{1}) == communicator().size());
    }
  }
}

void check_plan(const Reducer& reducer, const std::vector<std::pair<std::string, Tensor>>& grads, int64_t threshold) {
  const auto& buckets = reducer.buckets();
  // Reverse registration order, each gradient exactly once.
  std::vector<size_t> seen;
  for (const auto& b : buckets) seen.insert(seen.end(), b.gradients.begin(), b.gradients.end());
  std::vector<size_t> expect(grads.size());
  for (size_t i = 0; i < expect.size(); ++i) expect[i] = grads.size() - 1 - i;
  CHECK(seen == expect);
  for (size_t b = 0; b < buckets.size(); ++b) {
    int64_t bytes = 0;
    for (size_t g : buckets[b].gradients) bytes += static_cast<int64_t>(grads[g].second.nbytes());
    CHECK(bytes == buckets[b].bytes);
    if (b + 1 < buckets.size()) CHECK(buckets[b].bytes >= threshold);  // all but the last reach it
    // Greedy: without its last gradient the bucket was still below the threshold.
    int64_t before_last = buckets[b].bytes - static_cast<int64_t>(grads[buckets[b].gradients.back()].second.nbytes());
    CHECK((before_last < threshold || buckets[b].gradients.size() == 1));
  }
  // Every rank made the same plan.
  std::hash<std::string> h;
  std::vector<int64_t> all = communicator().allgather(static_cast<int64_t>(h(reducer.plan()) >> 1));
  for (int64_t v : all) CHECK(v == all[0]);
}

void check_timing(const Reducer& reducer) {
  const StepTiming& t = reducer.last_step();
  REQUIRE(t.buckets.size() == reducer.buckets().size());
  for (const BucketTiming& b : t.buckets) {
    CHECK(b.ready_s >= 0);
    CHECK(b.start_s >= b.ready_s);
    CHECK(b.end_s >= b.start_s);
    CHECK(b.end_s <= t.finalize_end_s);
  }
  CHECK(t.backward_end_s <= t.finalize_end_s);
  CHECK(t.hidden_s() >= 0);
  CHECK(t.hidden_s() <= t.comm_s() + 1e-12);
  CHECK(t.exposed_s() >= 0);
  CHECK(t.launch_delay_s() >= 0);
  CHECK(t.finish_s() >= 0);
  CHECK(t.finish_s() <= t.exposed_s() + 1e-12);
}

}  // namespace

TEST_CASE("step timing: launch delay and finish by hand", "[comm][reducer]") {
  StepTiming t;
  CHECK(t.launch_delay_s() == 0);
  t.backward_end_s = 0.020;
  t.finalize_end_s = 0.030;
  // ready 5, start 6 (1 ms late); ready 10 but the first busy until 12, start 12.5 (0.5 ms);
  // ready 15, the channel free at 14, start 15 (none): 1.5 ms over 3 buckets.
  t.buckets = {{0.005, 0.006, 0.012}, {0.010, 0.0125, 0.014}, {0.015, 0.015, 0.0275}};
  CHECK(t.launch_delay_s() == Approx(0.0005).epsilon(1e-12));
  CHECK(t.finish_s() == Approx(0.0025).epsilon(1e-12));  // the last ended at 27.5
  t.buckets.back().end_s = 0.018;  // all before backward's end: finish from it
  CHECK(t.finish_s() == Approx(0.010).epsilon(1e-12));
}

TEST_CASE("reducer: plans and exact sums for every threshold", "[comm][reducer]") {
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  const int64_t threshold = GENERATE(int64_t{0}, int64_t{1}, int64_t{32 * 1024}, int64_t{1} << 30);
  const bool overlap = GENERATE(true, false);
  INFO("threshold " << threshold << " B, overlap " << overlap << ", " << p << " ranks, rank " << r);
  auto grads = make_grads(model());
  Reducer reducer(comm, grads, {.threshold_bytes = threshold, .overlap = overlap});
  CHECK(reducer.threshold_bytes() == threshold);
  CHECK(reducer.num_gradients() == grads.size());
  check_plan(reducer, grads, threshold);
  if (threshold == 0) CHECK(reducer.buckets().size() == grads.size());
  if (threshold == 1) CHECK(reducer.buckets().size() == grads.size() - 1);  // the empty one joins the next
  if (threshold == int64_t{1} << 30) CHECK(reducer.buckets().size() == 1);

  // Step 0: default scale 1/p.
  fill(grads, r, 0);
  mark_all(reducer, grads, r, 0);
  reducer.finalize();
  const float inv_p = static_cast<float>(1.0 / p);
  CHECK(count_wrong(grads, [&](size_t g, int64_t i) {
          float s = 0;
          for (int q = 0; q < p; ++q) s += grad_value(g, i, q, 0);
          return s * inv_p;
        }) == 0);
  check_timing(reducer);

  // Step 1: per-rank factors (rank q's gradient times q+1) and the plain sum.
  reducer.set_local_factor(r + 1.0);
  fill(grads, r, 1);
  mark_all(reducer, grads, r, 1);
  reducer.finalize(1.0);
  CHECK(count_wrong(grads, [&](size_t g, int64_t i) {
          float s = 0;
          for (int q = 0; q < p; ++q) s += static_cast<float>(q + 1) * grad_value(g, i, q, 1);
          return s;
        }) == 0);
  reducer.set_local_factor(1.0);

  // Step 2: only half the gradients marked; finalize() takes the rest as they are.
  fill(grads, r, 2);
  for (size_t g = 0; g < grads.size(); g += 2) reducer.mark_ready(g);
  reducer.finalize(1.0);
  CHECK(count_wrong(grads, [&](size_t g, int64_t i) { return test::sum_over_ranks<float>(i + static_cast<int64_t>(g) * 1000 + 34, p); }) == 0);
  check_timing(reducer);
}

TEST_CASE("reducer: on one rank the buckets get no fused buffers", "[comm][reducer]") {
  // Nothing is sent on one rank: a fused copy of each bucket (the whole model's gradients at
  // a large threshold) would be memory for nothing, on a GPU as on the host.
  if (communicator().size() != 1) return;
  auto grads = make_grads(model());
  int64_t bytes = 0;
  for (const auto& [name, g] : grads) bytes += static_cast<int64_t>(g.nbytes());
  REQUIRE(bytes > 4096);
  const size_t before = memory_stats(Device::cpu()).current_bytes;
  Reducer reducer(communicator(), grads, {.threshold_bytes = int64_t{1} << 30});
  REQUIRE(reducer.buckets().size() == 1);
  // The plan's own bookkeeping is small; a fused buffer would add all `bytes`.
  CHECK(memory_stats(Device::cpu()).current_bytes < before + static_cast<size_t>(bytes) / 2);
  fill(grads, 0, 0);
  mark_all(reducer, grads, 0, 0);
  reducer.finalize();
  CHECK(count_wrong(grads, [&](size_t g, int64_t i) { return grad_value(g, i, 0, 0); }) == 0);
}

TEST_CASE("reducer: misuse is reported", "[comm][reducer]") {
  Communicator& comm = communicator();
  auto grads = make_grads(model());
  Reducer reducer(comm, grads, {.threshold_bytes = 1024});
  reducer.mark_ready(size_t{2});
  CHECK_THROWS_WITH(reducer.mark_ready(size_t{2}), Catch::Contains("twice") && Catch::Contains("bn1.weight"));
  CHECK_THROWS_WITH(reducer.mark_ready("nope"), Catch::Contains("'nope'"));
  CHECK_THROWS_WITH(reducer.mark_ready(size_t{99}), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(reducer.set_local_factor(2.0), Catch::Contains("before the step"));
  reducer.finalize();

  auto twice = make_grads({{"a", {2}}, {"a", {3}}});
  CHECK_THROWS_WITH(Reducer(comm, twice), Catch::Contains("'a' is given twice"));
  std::vector<std::pair<std::string, Tensor>> undefined = {{"w", Tensor()}};
  CHECK_THROWS_WITH(Reducer(comm, undefined), Catch::Contains("undefined"));
}

TEST_CASE("reducer: a rank with a different model fails on every rank", "[comm][reducer]") {
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  if (p == 1) return;  // nobody to disagree with
  const int odd = p - 1;
  std::string others = "0";
  for (int q = 1; q < odd; ++q) others += ", " + std::to_string(q);

  SECTION("one gradient's shape") {
    std::vector<Spec> specs = model();
    if (r == odd) specs[3].shape = {17};
    auto grads = make_grads(specs);
    try {
      Reducer reducer(comm, grads);
      FAIL("no error on rank " << r);
    } catch (const CommError& e) {
      std::string msg = e.what();
      INFO(msg);
      CHECK_THAT(msg, Catch::Contains("first difference at gradient #3"));
      CHECK_THAT(msg, Catch::Contains("rank(s) " + others + ": gradient #3 'bn1.bias': f32 (16,)"));
      CHECK_THAT(msg, Catch::Contains("rank(s) " + std::to_string(odd) + ": gradient #3 'bn1.bias': f32 (17,)"));
    }
  }
  SECTION("the threshold") {
    auto grads = make_grads(model());
    ReducerOptions o{.threshold_bytes = r == odd ? 100 : 200};
    CHECK_THROWS_WITH(Reducer(comm, grads, o), Catch::Contains("first difference at the settings") &&
                                                   Catch::Contains("rank(s) " + std::to_string(odd) + ": fusion threshold 100 B"));
  }
  SECTION("one gradient more") {
    std::vector<Spec> specs = model();
    if (r == odd) specs.push_back({"extra.weight", {5}});
    auto grads = make_grads(specs);
    CHECK_THROWS_AS(Reducer(comm, grads), CommError);
  }
  // The world communicator is still in step after the failed constructions.
  CHECK(comm.allreduce_sum(1) == p);
}

TEST_CASE("reducer: a large model with many buckets, several steps", "[comm][reducer]") {
  // 40 gradients of 1..64 KiB at the default threshold (32 KB): many buckets in flight.
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  std::vector<Spec> specs;
  for (int i = 0; i < 40; ++i) specs.push_back({"layer" + std::to_string(i) + ".weight", {(i % 8 + 1) * 2048 + i}});
  auto grads = make_grads(specs);
  Reducer reducer(comm, grads, {.threshold_bytes = 32 * 1024});
  check_plan(reducer, grads, 32 * 1024);
  CHECK(reducer.buckets().size() > 5);
  for (int step = 0; step < 4; ++step) {
    fill(grads, r, step);
    mark_all(reducer, grads, r, step);
    reducer.finalize(1.0);
    CHECK(count_wrong(grads, [&](size_t g, int64_t i) {
            return test::sum_over_ranks<float>(i + static_cast<int64_t>(g) * 1000 + step * 17, p);
          }) == 0);
  }
  check_timing(reducer);
}
