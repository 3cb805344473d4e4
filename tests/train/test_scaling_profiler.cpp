// --profile-scaling on a GPU rank, without a GPU (train/scaling_profiler.hpp): a fake device
// whose events run at times the test chooses, a step behind the host. The profile's phases,
// the one-bucket steps' backward and every gradient's ready time must be the GPU's, not the
// host's queueing times; the host's wait for its batch gives way to the GPU's gap between
// steps; the step total stays the host's period, so `other_s` is the GPU's idle time inside
// the step (the readback), not optimizer time; the host's small collectives (a token
// count in forward, the metrics' allreduce) come off forward and other and are kept apart;
// every profiled step's own times reach the
// profile; a step's events are read only once the GPU has passed them (no wait inside the
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

#include <algorithm>
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

// The host's period (a step from end to end) and its wait for each batch, which overlaps the
// GPU's work on the step before.
constexpr double kPeriod = 0.040, kHostInput = 0.020;
// The GPU's times within a step (seconds): forward (plus a jitter by step, so that steps
// mixed up or one step left with the host's times change the results), backward (another
// in the one-bucket steps), the wait for the sums, idle while the host reads the step's
// results back, the optimizer. The GPU then idles until the next step starts, a period
// after this one: 0.006 s less the jitter.
constexpr double kForward = 0.010, kBackward = 0.015, kAloneBackward = 0.012, kExposed = 0.002, kIdle = 0.004,
                 kOptimizer = 0.003;
double jitter(int64_t k) { return 0.001 * static_cast<double>(k % 3 - 1); }
// The host's small collectives a step: a token count's allreduce inside forward, the
// metrics' after the step (seconds, bytes). Kept apart from forward and other.
constexpr double kCountWait = 0.0005, kMetricsWait = 0.001;
constexpr int64_t kCountBytes = 8, kMetricsBytes = 40;
// When the backward reaches gradients 3, 2 and 1 (gradient 0 is never reached: its
// parameter is unused, and finalize marks it).
constexpr double kReady[] = {-1, 0.010, 0.005, 0.002};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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
  constexpr int64_t kWanted = 5;
  ScalingProfiler profiler(path.string(), kWanted, std::make_unique<FakeEvents>(gpu));

  std::vector<std::pair<std::string, Tensor>> grads;
  for (int i = 0; i < 4; ++i) grads.emplace_back(fmt::format("g{}", i), Tensor::zeros({64}, DType::f32));
  Reducer reducer(comm, grads, {.threshold_bytes = 0});

  const int64_t alone = comm.size() > 1 ? ScalingProfiler::kAloneSteps : 0;
  const int64_t first = ScalingProfiler::kWarmupSteps + alone;  // the first profiled step
  const int64_t total = first + kWanted;
  std::vector<double> input, forward, other, compute;  // expected, by profiled step
  double last_end = -1;  // when the GPU ran the last step's end
  for (int64_t k = 0; k < total; ++k) {
    const bool is_alone = k >= ScalingProfiler::kWarmupSteps && k < first;
    const double backward = is_alone ? kAloneBackward : kBackward;
    const double fwd = kForward + jitter(k);
    const double t = static_cast<double>(k) * kPeriod;  // the GPU's start of step k
    auto at = [&](double when, ScalingProfiler::Point point) {
      gpu->next = when;
      profiler.mark(point);
    };
    at(t, ScalingProfiler::start);
    at(t + fwd, ScalingProfiler::backward);
    for (size_t g = 3; g >= 1; --g) {
      gpu->next = t + fwd + kReady[g] * backward / kBackward;
      profiler.gradient_ready(g);
      reducer.mark_ready(g);
    }
    at(t + fwd + backward, ScalingProfiler::backward_end);
    reducer.finalize();
    at(t + fwd + backward + kExposed, ScalingProfiler::reduced);
    at(t + fwd + backward + kExposed + kIdle, ScalingProfiler::optimizer);
    at(t + fwd + backward + kExposed + kIdle + kOptimizer, ScalingProfiler::end);
    if (k == ScalingProfiler::kWarmupSteps - 1) CHECK(gpu->created == 0);  // warm-up: nothing recorded
    // The GPU is a step behind: it has run the step before this one, not this one.
    gpu->done = last_end;
    last_end = gpu->next;
    // The host's own times: queueing, much shorter than the GPU's.
    profiler.phases = {.input_s = kHostInput, .forward_s = 0.001, .backward_s = 0.004, .exposed_s = 0.0001,
                       .optimizer_s = 0.0002, .step_s = kPeriod - kHostInput, .samples = 8};
    profiler.collective(kCountWait, kCountBytes, /*in_forward=*/true);
    profiler.collective(kMetricsWait, kMetricsBytes, /*in_forward=*/false);
    profiler.step_done(reducer, comm, Device::cpu());
    if (k >= first) {
      // The GPU's gap before this step: from the last read step's end (the first counted
      // step, on one rank, has none: the host's wait stands).
      const double gap = k == ScalingProfiler::kWarmupSteps ? kHostInput : kPeriod - (kForward + jitter(k - 1) + (k - 1 < first ? kAloneBackward : kBackward) + kExposed + kIdle + kOptimizer);
      input.push_back(gap);
      forward.push_back(fwd - kCountWait);
      other.push_back(kPeriod - gap - (fwd + kBackward + kExposed + kOptimizer) - kMetricsWait);
      compute.push_back(gap + fwd - kCountWait + kBackward);
    }
  }
  CHECK(gpu->stalls == 1);  // only the last step, read at the profile's end
  CHECK(gpu->waits == 1);   // and steps the GPU has passed are not waited for at all
  CHECK(gpu->created <= 2 * (ScalingProfiler::kPoints + 4) + 1);

  if (!comm.is_master()) return;
  REQUIRE(std::filesystem::exists(path));
  const comm::scaling::Profile p = comm::scaling::profile_from_json(read_text(path), path.string());
  CHECK(p.steps == kWanted);
  CHECK(p.forward_s == Approx(median(forward)).margin(kEps));
  CHECK(p.backward_s == Approx(kBackward).margin(kEps));
  CHECK(p.exposed_comm_s == Approx(kExposed).margin(kEps));
  CHECK(p.optimizer_s == Approx(kOptimizer).margin(kEps));
  // The host's wait for its batch is not the GPU's: only the GPU's gap counts.
  CHECK(p.input_s == Approx(median(input)).margin(kEps));
  CHECK(p.input_s < 0.5 * kHostInput);
  CHECK(p.step_s == Approx(kPeriod).margin(kEps));  // the host's period
  // What the GPU spent idle inside the step (the readback), not counted as optimizer time.
  CHECK(p.other_s == Approx(median(other)).margin(kEps));
  // The small collectives apart, out of forward and other: priced on the network by the model.
  CHECK(p.collectives_s == Approx(kCountWait + kMetricsWait).margin(kEps));
  CHECK(p.collectives == 2);
  CHECK(p.collective_bytes == kCountBytes + kMetricsBytes);
  CHECK(p.backward_alone_s == Approx(comm.size() > 1 ? kAloneBackward : 0.0).margin(kEps));
  // The GPU's wait after backward less the Reducer's sums (here the host's, which took some
  // of those 2 ms or more): never more than the wait itself, never negative.
  CHECK(p.finish_s >= 0);
  CHECK(p.finish_s <= kExposed + kEps);
  REQUIRE(p.gradients.size() == 4);
  CHECK(p.gradients[0].ready_s == Approx(kBackward).margin(kEps));  // never reached: final at backward's end
  for (size_t g = 1; g < 4; ++g) CHECK(p.gradients[g].ready_s == Approx(kReady[g]).margin(kEps));
  // Every step of every rank, in order: no step mixed up with another, none left with the
  // host's times.
  REQUIRE(p.compute_samples_s.size() == static_cast<size_t>(kWanted * comm.size()));
  for (size_t i = 0; i < p.compute_samples_s.size(); ++i) {
    INFO("sample " << i);
    CHECK(p.compute_samples_s[i] == Approx(compute[i % kWanted]).margin(kEps));
  }
}

// A fit that ends among the one-bucket steps writes nothing yet and puts the fusion
// threshold back; the next fit of the model runs that phase again, so the profile's
// backward_alone_s comes from whole one-bucket steps of one phase (before the restart, the
// first fit's four one-bucket steps stayed in it, and the second fit counted at once).
TEST_CASE("scaling profiler: a fit cut short among the one-bucket steps starts them again", "[train][scaling]") {
  Communicator& comm = communicator();
  if (comm.size() < 2) return;  // one rank has no one-bucket steps
  test::TempDir dir("tnt-profile-restart");
  const std::filesystem::path path = dir.path / "profile.json";
  constexpr int64_t kWanted = 3;
  ScalingProfiler profiler(path.string(), kWanted, Device::cpu());
  std::vector<std::pair<std::string, Tensor>> grads;
  for (int i = 0; i < 4; ++i) grads.emplace_back(fmt::format("g{}", i), Tensor::zeros({64}, DType::f32));
  Reducer reducer(comm, grads, {.threshold_bytes = 0});
  const int64_t threshold = reducer.threshold_bytes();
  auto step = [&](double backward) {
    for (size_t g = 0; g < 4; ++g) reducer.mark_ready(g);
    reducer.finalize();
    profiler.phases = {.input_s = 0.001, .forward_s = 0.002, .backward_s = backward, .exposed_s = 0.0001,
                       .optimizer_s = 0.0002, .step_s = 0.02, .samples = 8};
    profiler.step_done(reducer, comm, Device::cpu());
  };
  // First fit: 5 warm-up steps, then 4 of the 5 one-bucket steps (backward 0.5 s).
  for (int64_t k = 0; k < ScalingProfiler::kWarmupSteps + 4; ++k) step(0.5);
  CHECK(reducer.threshold_bytes() != threshold);  // all gradients in one bucket now
  profiler.fit_end(reducer, comm, Device::cpu());
  CHECK(reducer.threshold_bytes() == threshold);
  CHECK_FALSE(std::filesystem::exists(path));
  // Second fit: the step that starts the phase again, 5 one-bucket steps (0.012 s), then
  // the profiled steps (0.015 s).
  step(0.5);
  for (int64_t k = 0; k < ScalingProfiler::kAloneSteps; ++k) step(0.012);
  for (int64_t k = 0; k < kWanted; ++k) step(0.015);
  comm.barrier();
  if (!comm.is_master()) return;
  REQUIRE(std::filesystem::exists(path));
  const comm::scaling::Profile p = comm::scaling::profile_from_json(read_text(path), path.string());
  CHECK(p.steps == kWanted);
  CHECK(p.backward_alone_s == Approx(0.012).margin(kEps));
  CHECK(p.backward_s == Approx(0.015).margin(kEps));
}

TEST_CASE("scaling profiler: a path that is not a regular file is refused before the run", "[train][scaling]") {
  // The profile is written beside its path and renamed into place: that would replace the
  // device (as root, /dev/null itself) or fail after the run on a directory.
  Communicator& comm = communicator();
  CHECK_THROWS_WITH(ScalingProfiler::check_writable(comm, "/dev/null"),
                    Catch::Contains("'/dev/null' is not a regular file (a device, FIFO or socket)"));
  CHECK(std::filesystem::is_character_file("/dev/null"));
  tnt::test::TempDir dir("tnt_profile_path");
  CHECK_THROWS_WITH(ScalingProfiler::check_writable(comm, dir.path.string()),
                    Catch::Contains("is not a regular file (a directory)"));
  CHECK_NOTHROW(ScalingProfiler::check_writable(comm, (dir.path / "profile.json").string()));
  CHECK_FALSE(std::filesystem::exists(dir.path / "profile.json.tmp"));
}
