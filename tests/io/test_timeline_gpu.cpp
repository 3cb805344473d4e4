// The timeline's GPU lanes without a GPU (io/timeline_gpu.hpp): a fake device whose events
// run at times the test chooses, behind the host as a GPU is. Checks the mapping of event
// times onto the host clock at the readback, spans that complete only after it (the
// optimizer's), a readback that did not wait, the NCCL transport's own events, the pool,
// the lanes in the trace file, and that a rank without a GPU writes what it always wrote.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/context.hpp"
#include "io/timeline.hpp"
#include "io/timeline_gpu.hpp"
#include "fake_device_events.hpp"
#include "tarantella/tarantella.hpp"
#include "tarantella/timeline.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

using namespace tnt::timeline;
using nlohmann::json;
using tnt::test::FakeEvents;
using tnt::test::FakeGpu;

namespace {

// One place of a recorded span, by name.
std::map<std::string, GpuEvent> by_name(const std::vector<GpuEvent>& events) {
  std::map<std::string, GpuEvent> out;
  for (const GpuEvent& e : events) out.emplace(e.name, e);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Exact in binary up to the sums of a few such values: 1e-9 s is far below the microsecond
// resolution the trace writes.
constexpr double kEps = 1e-9;

}  // namespace

TEST_CASE("a step's reference lands at the readback's host time less the GPU's time to the anchor",
          "[timeline][gpu_lanes]") {
  CHECK(reference_host_s(10.020, 13.0, 10.0) == Approx(10.007).margin(kEps));
  // The anchor's bound would put the reference before the host queued it: the queue time wins.
  CHECK(reference_host_s(10.020, 30.0, 10.0) == Approx(10.0).margin(kEps));
}

TEST_CASE("a step never lands before the end of the step before it, whatever each anchor's slack",
          "[timeline][gpu_lanes]") {
  // Seen on an H200: step 5's readback returned 3 us later after its anchor than step 6's,
  // and step 6 began on the timeline before step 5 ended.
  auto gpu = std::make_shared<FakeGpu>();
  GpuLanes lanes(std::make_unique<FakeEvents>(gpu));
  std::vector<GpuEvent> out;
  auto sink = [&](GpuEvent e) { out.push_back(std::move(e)); };
  // One step: a "step" span over the GPU's [gpu_t0, gpu_t1], queued at host time queued_s,
  // its readback returning `slack` seconds after the GPU reached its anchor (at gpu_t1).
  auto step = [&](int64_t n, double gpu_t0, double gpu_t1, double queued_s, double slack) {
    gpu->next = gpu_t0;
    lanes.step_begin(n, queued_s);
    void* begin = lanes.mark();
    gpu->next = gpu_t1;
    void* end = lanes.mark();
    lanes.add(Lane::gpu_compute, "step", begin, end, {});
    lanes.readback_begin();
    gpu->done = gpu_t1;
    lanes.readback_end(gpu_t1 - 90.0 + slack, sink);  // the host clock is 90 s behind the GPU's
  };
  step(1, 100.000, 100.010, 10.000, 50e-6);  // seen 50 us late
  step(2, 100.010, 100.020, 10.005, 1e-6);   // no gap on the GPU; seen 1 us late
  REQUIRE(out.size() == 2);
  CHECK(out[0].step == 1);
  CHECK(out[1].step == 2);
  CHECK(out[0].t1 == Approx(10.010 + 50e-6).margin(kEps));
  CHECK(out[1].t0 >= out[0].t1 - kEps);  // without the floor: 10.010001, before 10.01005
  CHECK(out[1].t1 - out[1].t0 == Approx(0.010).margin(kEps));  // durations stay the GPU's

  // Step 3 after a 1 ms gap on the GPU (the host was late): its own anchor places it, the
  // push of step 1's slack gone.
  step(3, 100.021, 100.030, 10.020, 1e-6);
  REQUIRE(out.size() == 3);
  CHECK(out[2].t0 == Approx(10.021 + 1e-6).margin(kEps));
  CHECK(out[2].t0 >= out[1].t1 - kEps);
}

TEST_CASE("GPU spans are placed on the host clock at the readback, late ones at the next",
          "[timeline][gpu_lanes]") {
  auto gpu = std::make_shared<FakeGpu>();
  GpuLanes lanes(std::make_unique<FakeEvents>(gpu));
  std::vector<GpuEvent> out;
  auto sink = [&](GpuEvent e) { out.push_back(std::move(e)); };
  // The GPU's clock is its own (here 90 s ahead of the host's) and runs behind the host's queue.
  gpu->next = 100.000;
  lanes.step_begin(1, 10.000);
  gpu->next = 100.001;
  void* f0 = lanes.mark();
  gpu->next = 100.005;
  void* f1 = lanes.mark();
  lanes.add(Lane::gpu_compute, "forward", f0, f1, R"("x":1)");
  void* b0 = lanes.mark();
  gpu->next = 100.012;
  void* b1 = lanes.mark();
  lanes.add(Lane::gpu_compute, "backward", b0, b1, {});
  // The NCCL stream's own events, complete when the transport hands them over.
  int nccl_start = 0, nccl_done = 0;
  gpu->at[&nccl_start] = 100.006;
  gpu->at[&nccl_done] = 100.011;
  gpu->done = 100.011;
  lanes.add_complete(Lane::gpu_comm, "allreduce", &nccl_start, &nccl_done, R"("bucket":0)");
  gpu->next = 100.013;
  lanes.readback_begin();
  // The optimizer is queued after the readback: not run when it returns.
  gpu->next = 100.014;
  void* o0 = lanes.mark();
  gpu->next = 100.016;
  void* o1 = lanes.mark();
  // The readback returns at host 10.020 after the GPU reached the anchor (100.013).
  gpu->done = 100.013;
  lanes.readback_end(10.020, sink);
  lanes.add(Lane::gpu_compute, "optimizer", o0, o1, {});

  // host(ref) = 10.020 - 13 ms = 10.007.
  REQUIRE(out.size() == 3);
  auto placed = by_name(out);
  CHECK(placed.at("forward").t0 == Approx(10.008).margin(kEps));
  CHECK(placed.at("forward").t1 == Approx(10.012).margin(kEps));
  CHECK(placed.at("forward").lane == Lane::gpu_compute);
  CHECK(placed.at("forward").args == R"("x":1)");
  CHECK(placed.at("forward").step == 1);
  CHECK(placed.at("backward").t0 == Approx(10.012).margin(kEps));
  CHECK(placed.at("backward").t1 == Approx(10.019).margin(kEps));
  CHECK(placed.at("allreduce").lane == Lane::gpu_comm);
  CHECK(placed.at("allreduce").t0 == Approx(10.013).margin(kEps));
  CHECK(placed.at("allreduce").t1 == Approx(10.018).margin(kEps));
  CHECK_FALSE(lanes.idle());

  // Step 2: its readback places step 1's optimizer against step 1's reference.
  out.clear();
  gpu->next = 100.020;
  lanes.step_begin(2, 10.021);
  gpu->next = 100.021;
  void* g0 = lanes.mark();
  gpu->next = 100.025;
  void* g1 = lanes.mark();
  lanes.add(Lane::gpu_compute, "forward", g0, g1, {});
  gpu->next = 100.026;
  lanes.readback_begin();
  gpu->done = 100.026;
  lanes.readback_end(10.030, sink);
  REQUIRE(out.size() == 2);
  placed = by_name(out);
  CHECK(placed.at("optimizer").step == 1);
  CHECK(placed.at("optimizer").t0 == Approx(10.021).margin(kEps));
  CHECK(placed.at("optimizer").t1 == Approx(10.023).margin(kEps));
  // Step 2's reference: 10.030 - 6 ms.
  CHECK(placed.at("forward").step == 2);
  CHECK(placed.at("forward").t0 == Approx(10.025).margin(kEps));
  CHECK(gpu->waits == 0);  // nothing waited inside the steps
}

TEST_CASE("an anchor that ran before the host began to wait bounds its step only if it ran soon after its record",
          "[timeline][gpu_lanes]") {
  // The step's readback waits for a copy queued after the loss; the host queues the backward
  // first. Where that took the host longer than the GPU took to reach the anchor, the wait's
  // end says nothing about when the anchor ran: the moment the host was about to wait bounds
  // it, if that is within kTightS of the record; else the step waits for a later anchor.
  auto gpu = std::make_shared<FakeGpu>();
  GpuLanes lanes(std::make_unique<FakeEvents>(gpu));
  std::vector<GpuEvent> out;
  auto sink = [&](GpuEvent e) { out.push_back(std::move(e)); };
  // Step n queued at host time queued_s, its "forward" over the GPU's [gpu_t0, gpu_t1]; the
  // anchor recorded next runs at gpu_t1.
  auto forward_step = [&](int64_t n, double gpu_t0, double gpu_t1, double queued_s) {
    gpu->next = gpu_t0;
    lanes.step_begin(n, queued_s);
    void* begin = lanes.mark();
    gpu->next = gpu_t1;
    void* end = lanes.mark();
    lanes.add(Lane::gpu_compute, "forward", begin, end, {});
  };
  // Step 1: queued at host 10.000 (GPU 100.000); the anchor, recorded at host 10.001, runs at
  // GPU 100.004; the host is about to wait at 10.009 (8 ms of queued backward), the wait
  // returns at once (10.0091).
  forward_step(1, 100.000, 100.004, 10.000);
  lanes.readback_begin(10.001);
  gpu->done = 100.004;
  lanes.readback_wait(10.009);
  lanes.readback_end(10.0091, sink);
  CHECK(out.empty());  // 4 ms late had it been placed by 10.0091; now waiting
  // Step 2: the host waits (the anchor runs after the wait began): placed exactly, and step
  // 1 with it (its reference bounded by step 2's anchor, through the GPU's clock).
  forward_step(2, 100.010, 100.013, 10.0095);
  lanes.readback_begin(10.0096);
  lanes.readback_wait(10.0097);
  gpu->done = 100.013;
  lanes.readback_end(10.013 + 2e-6, sink);  // 2 us after the GPU got there
  REQUIRE(out.size() == 2);
  CHECK(out[1].step == 2);
  CHECK(out[1].t1 == Approx(10.013 + 2e-6).margin(kEps));
  CHECK(out[0].step == 1);
  CHECK(out[0].t0 == Approx(10.000 + 2e-6).margin(kEps));
  // Step 3: the host was about to wait 40 us after the record, and the anchor had run by
  // then: that moment bounds it (at most 40 us late), not the wait's end.
  out.clear();
  forward_step(3, 100.020, 100.021, 10.019);
  lanes.readback_begin(10.020990);
  gpu->done = 100.021;
  lanes.readback_wait(10.021030);
  lanes.readback_end(10.5, sink);  // whatever kept the host afterwards
  REQUIRE(out.size() == 1);
  CHECK(out[0].t1 == Approx(10.021030).margin(kEps));
}

TEST_CASE("a readback that did not wait leaves its spans for the next one; the window's end waits once",
          "[timeline][gpu_lanes]") {
  auto gpu = std::make_shared<FakeGpu>();
  GpuLanes lanes(std::make_unique<FakeEvents>(gpu));
  std::vector<GpuEvent> out;
  auto sink = [&](GpuEvent e) { out.push_back(std::move(e)); };
  gpu->next = 5.0;
  lanes.step_begin(1, 1.0);
  gpu->next = 5.002;
  void* a = lanes.mark();
  gpu->next = 5.004;
  void* b = lanes.mark();
  lanes.add(Lane::gpu_compute, "forward", a, b, {});
  lanes.readback_begin();
  lanes.readback_end(1.003, sink);  // the GPU has run nothing yet
  CHECK(out.empty());

  gpu->next = 5.010;
  lanes.step_begin(2, 1.004);
  gpu->next = 5.011;
  void* c = lanes.mark();
  gpu->next = 5.013;
  void* d = lanes.mark();
  lanes.add(Lane::gpu_compute, "forward", c, d, {});
  gpu->next = 5.014;
  lanes.readback_begin();
  gpu->done = 5.014;
  lanes.readback_end(1.020, sink);
  // Both steps from step 2's anchor: host(ref1) = 1.020 - 14 ms, host(ref2) = 1.020 - 4 ms.
  REQUIRE(out.size() == 2);
  CHECK(out[0].step == 1);
  CHECK(out[0].t0 == Approx(1.008).margin(kEps));
  CHECK(out[1].step == 2);
  CHECK(out[1].t0 == Approx(1.017).margin(kEps));

  // Spans after the last readback (an evaluation) wait for the window's end; they keep step
  // 2's reference as its first anchor placed it (each anchor bounds it from above; the first
  // after it is the tightest).
  out.clear();
  gpu->next = 5.020;
  void* e = lanes.mark();
  gpu->next = 5.030;
  void* f = lanes.mark();
  lanes.add(Lane::gpu_compute, "evaluation step", e, f, {});
  gpu->next = 5.031;
  lanes.finish([] { return 1.040; }, sink);
  CHECK(gpu->waits == 1);
  REQUIRE(out.size() == 1);
  CHECK(out[0].t0 == Approx(1.026).margin(kEps));
  CHECK(out[0].t1 == Approx(1.036).margin(kEps));
  CHECK(lanes.idle());
  CHECK(lanes.dropped() == 0);
  CHECK(lanes.mark() == nullptr);  // no step: nothing recorded until the next window
}

TEST_CASE("the event pool is reused step after step; events the transport keeps must be complete",
          "[timeline][gpu_lanes]") {
  auto gpu = std::make_shared<FakeGpu>();
  {
    GpuLanes lanes(std::make_unique<FakeEvents>(gpu));
    auto sink = [](GpuEvent) {};
    double t = 0;
    for (int64_t step = 1; step <= 200; ++step) {
      gpu->next = t += 0.001;
      lanes.step_begin(step, t);
      for (int k = 0; k < 5; ++k) {
        void* a = lanes.mark();
        gpu->next = t += 0.001;
        lanes.add(Lane::gpu_compute, "layer", a, lanes.mark(), {});
      }
      lanes.readback_begin();
      void* o = lanes.mark();  // after the readback
      gpu->done = gpu->next;
      gpu->next = t += 0.001;
      lanes.readback_end(t, sink);
      lanes.add(Lane::gpu_compute, "optimizer", o, lanes.mark(), {});
    }
    // A reference, 12 span events, an anchor, and one step's late spans and reference.
    CHECK(lanes.events_made() <= 20);
    int running = 0;
    gpu->at[&running] = 1e9;
    lanes.add_complete(Lane::gpu_comm, "allreduce", &running, &running, {});
    CHECK(lanes.dropped() == 1);
  }
  CHECK(gpu->created == gpu->destroyed);
}

TEST_CASE("the trace has the GPU lanes, named, with GPU spans inside their step; a CPU rank's is unchanged",
          "[timeline][gpu_lanes]") {
  tnt::RuntimeContext* c = tnt::context_or_null();
  REQUIRE(c);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tnt_timeline_gpu_" + std::to_string(getpid()) + ".json")).string();
  auto run = [&](bool gpu_rank) {
    auto gpu = std::make_shared<FakeGpu>();
    auto recorder = std::make_shared<Recorder>(tnt::communicator(), path, 1, 2);
    if (gpu_rank) recorder->use_device_events(std::make_unique<FakeEvents>(gpu));
    c->timeline = recorder;
    // The GPU's clock is 1000 s off the host's; each step runs on it from 2 ms after the host
    // queued it: forward 3-5 ms, the readback's anchor at 6 ms (the host waits for it, as a
    // readback does), the step's end 7 ms. The next step is queued after the wait, so it runs
    // after this one, as on a GPU.
    constexpr double kGpuClock = 1000.0;
    for (int64_t step = 1; step <= 3; ++step) {
      const double t0 = tnt::detail::now_s();
      const double g0 = t0 + kGpuClock;
      gpu->next = g0 + 0.002;
      step_begin(step, 0, t0);
      {
        Span s(Lane::compute, "step", on_device);
        {
          gpu->next = g0 + 0.003;
          Span f(Lane::compute, "forward", on_device);
          gpu->next = g0 + 0.005;
        }
        Span plain(Lane::compute, "metrics");
        {
          gpu->next = g0 + 0.006;
          Readback r;
          gpu->done = gpu->next;
          while (tnt::detail::now_s() < t0 + 0.006) {
          }
        }
        gpu->next = g0 + 0.007;
      }
    }
    tnt::stop_timeline();  // closes the window and merges: the master writes path
    json trace = json::parse(read_file(path));
    std::remove(path.c_str());
    return trace;
  };

  json gpu_trace = run(true);
  std::map<int, std::string> lane_names;
  for (const json& e : gpu_trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") lane_names[e["tid"]] = e["args"]["name"];
  }
  CHECK(lane_names[3] == "GPU compute");
  CHECK(lane_names[4] == "GPU comm");
  std::map<int64_t, json> host_step, gpu_step, gpu_forward;
  std::map<int64_t, double> input_end;
  for (const json& e : gpu_trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int64_t step = e["args"]["step"];
    CHECK(step >= 1);
    CHECK(step <= 2);  // the window
    if (e["tid"] == 3) {
      CHECK(e["cat"] == "gpu");
      CHECK(e["dur"].get<double>() > 0);
      CHECK(e["name"] != "metrics");  // a host span stays on the host
      (e["name"] == "step" ? gpu_step : gpu_forward)[step] = e;
    } else if (e["name"] == "step") {
      host_step[step] = e;
    } else if (e["name"] == "input") {
      input_end[step] = e["ts"].get<double>() + e["dur"].get<double>();
    }
  }
  for (int64_t step : {1, 2}) {
    INFO("step " << step);
    REQUIRE(gpu_step.count(step));
    REQUIRE(gpu_forward.count(step));
    const double s0 = gpu_step[step]["ts"], s1 = s0 + gpu_step[step]["dur"].get<double>();
    const double f0 = gpu_forward[step]["ts"], f1 = f0 + gpu_forward[step]["dur"].get<double>();
    // 2 ms of forward, inside the step's 5 ms (microseconds in the trace; 0.01 us of rounding).
    CHECK(f1 - f0 == Approx(2000).margin(0.01));
    CHECK(s1 - s0 == Approx(5000).margin(0.01));
    CHECK(f0 >= s0);
    CHECK(f1 <= s1);
    // On the host clock the GPU ran the step after the host queued it (the input wait ends
    // just before the reference is recorded). How much after depends on when the busy wait
    // returned on a loaded machine, so only the order is checked.
    const double queued = input_end.at(step);
    CHECK(s0 >= queued);
    CHECK(f0 >= queued + 1000 - 0.01);
  }
  // Step 2 runs on the GPU after step 1 (1 ms apart: more than the anchors' slack).
  CHECK(gpu_step[2]["ts"].get<double>() >= gpu_step[1]["ts"].get<double>() + gpu_step[1]["dur"].get<double>());

  // Without a GPU: the same events as a trace of plain spans, and no GPU lane.
  json cpu_trace = run(false);
  std::vector<std::string> names;
  for (const json& e : cpu_trace["traceEvents"]) {
    CHECK(e["tid"] <= 2);
    if (e["ph"] == "X") names.push_back(e["name"].get<std::string>() + "@" + std::to_string(e["tid"].get<int>()));
  }
  CHECK(names == std::vector<std::string>{"input@1", "forward@1", "metrics@1", "step@1", "input@1", "forward@1",
                                          "metrics@1", "step@1"});
  c->timeline.reset();
}
