// --profile-scaling on a GPU rank, without a GPU (train/scaling_profiler.hpp): a fake device
// whose events run at times the test chooses, a step behind the host. The profile's phases,
// the one-bucket steps' backward and every gradient's ready time must be the GPU's, not the
// host's queueing times; the step total stays the host's, so `other_s` is the GPU's idle
// time; a step's events are read only once the GPU has passed them (no wait inside the
// profiled steps, one at the end); the warm-up steps record nothing and the event pool stays
// at two steps' worth.
#include <catch2/catch.hpp>

#include "comm/scaling_model.hpp"
#include "fake_device_events.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"
#include "temp_dir.hpp"
#include "train/scaling_profiler.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace tnt;
using tnt::detail::ScalingProfiler;
using tnt::test::FakeEvents;
using tnt::test::FakeGpu;

namespace {

// Sums and differences of a few such values in binary: far below the microseconds that matter.
constexpr double kEps = 1e-9;

// The GPU's times within a step (seconds from its start), and the host's own, which differ.
constexpr double kForward = 0.010, kBackward = 0.015, kAloneBackward = 0.012, kExposed = 0.002, kOptimizer = 0.003;
constexpr double kStep = 0.100;  // host: the whole step, end to end
// When the backward reaches gradients 3, 2 and 1 (gradient 0 is never reached: its
// parameter is unused, and finalize marks it).
constexpr double kReady[] = {-1, 0.010, 0.005, 0.002};

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("scaling profiler: a GPU rank's phases are the GPU's", "[train][scaling]") {
  Communicator& comm = communicator();
  test::TempDir dir("tnt-profile");
  const std::filesystem::path path = dir.path / "profile.json";
  auto gpu = std::make_shared<FakeGpu>();
  constexpr int64_t kWanted = 3;
  ScalingProfiler profiler(path.string(), kWanted, std::make_unique<FakeEvents>(gpu));

  std::vector<std::pair<std::string, Tensor>> grads;
  for (int i = 0; i < 4; ++i) grads.emplace_back("g" + std::to_string(i), Tensor::zeros({64}, DType::f32));
  Reducer reducer(comm, grads, {.threshold_bytes = 0});

  const int64_t alone = comm.size() > 1 ? ScalingProfiler::kAloneSteps : 0;
  const int64_t total = ScalingProfiler::kWarmupSteps + alone + kWanted;
  for (int64_t k = 0; k < total; ++k) {
    const bool is_alone = k >= ScalingProfiler::kWarmupSteps && k < ScalingProfiler::kWarmupSteps + alone;
    const double backward = is_alone ? kAloneBackward : kBackward;
    const double t = static_cast<double>(k) * kStep;  // the GPU's start of step k
    gpu->next = t;
    profiler.mark(ScalingProfiler::start);
    gpu->next = t + kForward;
    profiler.mark(ScalingProfiler::backward);
    for (size_t g = 3; g >= 1; --g) {
      gpu->next = t + kForward + kReady[g] * backward / kBackward;
      profiler.gradient_ready(g);
      reducer.mark_ready(g);
    }
    gpu->next = t + kForward + backward;
    profiler.mark(ScalingProfiler::backward_end);
    reducer.finalize();
    gpu->next = t + kForward + backward + kExposed;
    profiler.mark(ScalingProfiler::reduced);
    gpu->next = t + kForward + backward + kExposed + kOptimizer;
    profiler.mark(ScalingProfiler::end);
    if (k == ScalingProfiler::kWarmupSteps - 1) CHECK(gpu->created == 0);  // warm-up: nothing recorded
    // The GPU is a step behind: it has run the step before this one, not this one.
    gpu->done = t - kStep + kForward + kBackward + kExposed + kOptimizer;
    // The host's own times: queueing, much shorter than the GPU's.
    profiler.phases = {.input_s = 0.0005, .forward_s = 0.001, .backward_s = 0.004, .exposed_s = 0.0001,
                       .optimizer_s = 0.0002, .step_s = kStep - 0.0005, .samples = 8};
    profiler.step_done(reducer, comm, Device::cpu());
  }
  CHECK(gpu->stalls == 1);  // only the last step, read at the profile's end
  CHECK(gpu->created <= 2 * (ScalingProfiler::kPoints + 4));

  if (!comm.is_master()) return;
  REQUIRE(std::filesystem::exists(path));
  const comm::scaling::Profile p = comm::scaling::profile_from_json(read_text(path), path.string());
  CHECK(p.steps == kWanted);
  CHECK(p.forward_s == Approx(kForward).margin(kEps));
  CHECK(p.backward_s == Approx(kBackward).margin(kEps));
  CHECK(p.exposed_comm_s == Approx(kExposed).margin(kEps));
  CHECK(p.optimizer_s == Approx(kOptimizer).margin(kEps));
  CHECK(p.input_s == Approx(0.0005).margin(kEps));
  CHECK(p.step_s == Approx(kStep).margin(kEps));
  // The host's step less the GPU's phases: what the GPU spent idle.
  CHECK(p.other_s == Approx(kStep - 0.0005 - kForward - kBackward - kExposed - kOptimizer).margin(kEps));
  CHECK(p.backward_alone_s == Approx(comm.size() > 1 ? kAloneBackward : 0.0).margin(kEps));
  // The GPU's wait after backward less the Reducer's sums (here the host's, which took some
  // of those 2 ms or more): never more than the wait itself, never negative.
  CHECK(p.finish_s >= 0);
  CHECK(p.finish_s <= kExposed + kEps);
  REQUIRE(p.gradients.size() == 4);
  CHECK(p.gradients[0].ready_s == Approx(kBackward).margin(kEps));  // never reached: final at backward's end
  for (size_t g = 1; g < 4; ++g) CHECK(p.gradients[g].ready_s == Approx(kReady[g]).margin(kEps));
  REQUIRE(p.compute_samples_s.size() == static_cast<size_t>(kWanted * comm.size()));
  for (double c : p.compute_samples_s) CHECK(c == Approx(0.0005 + kForward + kBackward).margin(kEps));
}
