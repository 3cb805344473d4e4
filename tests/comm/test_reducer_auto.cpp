// --fusion-threshold auto (comm/auto_threshold): on 1, 2 and 3 ranks the Reducer times its
// first steps, every rank takes the same threshold at the same step, and every sum before
// and after the new plan is exact. Whether the plan changes depends on the allreduce this
// machine measures (here, before the corrections: on 2 ranks 32 KB -> 256 KB or 512 KB, or
// kept; on 3 oversubscribed ranks small allreduces took 15-40 us and 32 KB was kept; with
// them, a lag of about 1 ms between the ranks and 32 KB kept in 3 runs on 2 ranks); when it
// changes, the new plan is the bucket plan of the new threshold. The note carries the
// corrections measured on every rank's steps (the decision itself: test_auto_threshold.cpp).
#include "comm_test_data.hpp"

#include "tarantella/comm.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

using namespace tnt;

namespace {

// 200 gradients of 32 KB (8192 f32 each), ready all at once: at the starting threshold
// (32 KB) every one is its own bucket and pays the allreduce's latency, 200 times a step.
constexpr int kGradients = 200;
constexpr int64_t kElements = 8192;

std::vector<std::pair<std::string, Tensor>> make_grads() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (int g = 0; g < kGradients; ++g) out.emplace_back("layer" + std::to_string(g), Tensor::zeros({kElements}));
  return out;
}

float value(int g, int64_t i, int r, int step) { return test::value<float>(i + g * 31 + step * 7, r); }

}  // namespace

TEST_CASE("reducer: auto threshold, the same on every rank, exact sums", "[comm][reducer][auto]") {
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  auto grads = make_grads();
  ReducerOptions options;
  options.threshold_bytes = ReducerOptions::kAuto;
  options.auto_warmup_steps = 2;
  options.auto_steps = 3;
  Reducer reducer(comm, grads, options);
  CHECK(reducer.threshold_bytes() == 32 * 1024);  // the start: TNT_FUSION_THRESHOLD's default
  CHECK(reducer.buckets().size() == kGradients);

  for (int step = 0; step < 8; ++step) {
    INFO("step " << step << ", " << p << " ranks, rank " << r);
    for (int g = 0; g < kGradients; ++g) {
      float* d = grads[g].second.data<float>();
      for (int64_t i = 0; i < kElements; ++i) d[i] = value(g, i, r, step);
    }
    for (int g = kGradients - 1; g >= 0; --g) reducer.mark_ready(static_cast<size_t>(g));
    reducer.finalize(1.0);
    int64_t wrong = 0;
    for (int g = 0; g < kGradients; ++g) {
      const float* d = grads[g].second.data<float>();
      for (int64_t i = 0; i < kElements; ++i) {
        float expect = 0;
        for (int q = 0; q < p; ++q) expect += value(g, i, q, step);
        wrong += !test::same(d[i], expect);
      }
    }
    CHECK(wrong == 0);
    // Chosen after the 2 warm-up and 3 timed steps, at the end of the fifth.
    CHECK(reducer.auto_choice().empty() == (step < 4 || p == 1));
  }

  const int64_t t = reducer.threshold_bytes();
  CHECK(comm.allreduce_max(static_cast<double>(t)) == comm.allreduce_min(static_cast<double>(t)));
  const std::string plan = reducer.plan();
  std::vector<int64_t> hashes = comm.allgather(static_cast<int64_t>(std::hash<std::string>{}(plan) >> 1));
  for (int64_t h : hashes) CHECK(h == hashes[0]);
  if (p == 1) {
    CHECK(t == 32 * 1024);  // nothing is communicated: nothing to choose
  } else {
    INFO(reducer.auto_choice());
    CHECK_THAT(reducer.auto_choice(), Catch::Contains("fusion threshold auto:"));
    // Every rank's compute times, gathered: the 3 timed steps each (the warm-up's last
    // finalize() starts the first interval).
    CHECK_THAT(reducer.auto_choice(), Catch::Contains(fmt::format("measured on {} rank(s)", p)));
    CHECK_THAT(reducer.auto_choice(), Catch::Contains(fmt::format("(from {} compute samples)", 3 * p)));
    CHECK_THAT(reducer.auto_choice(), Catch::Contains("x the probe's time"));
    // A multiple of 32 KB (a doubling from 1 KB) makes buckets of t / 32 KB gradients.
    const size_t per_bucket = static_cast<size_t>(std::max<int64_t>(1, t / (kElements * 4)));
    CHECK(reducer.buckets().size() == (kGradients + per_bucket - 1) / per_bucket);
    if (t != 32 * 1024) CHECK_THAT(reducer.auto_choice(), Catch::Contains("instead of 32 KB"));
  }
}
