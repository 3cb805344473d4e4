// The timeline's GPU lanes on a real GPU (label gpu; also multi_gpu: scripts/gpu-check runs
// it at one rank per GPU). A few steps of an MLP trained on CUDA under a timeline: every
// rank's row has the lanes "GPU compute" and "GPU comm"; each recorded step has its GPU
// spans (step, forward, loss, backward, a backward span per layer, optimizer) with positive
// durations, in stream order inside the step, never before the host queued them; with
// more than one rank each bucket's NCCL allreduce is on "GPU comm", after the step began
// and before its optimizer ran.
#include "gpu_test_util.hpp"
#include "job_dir.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tarantella/tarantella.hpp"
#include "tarantella/timeline.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

using namespace tnt;
using nlohmann::json;

namespace {

// 1024-wide layers, so that each step's kernels take measurable time and each weight is a
// bucket of its own (4 MiB, over the 32 KB fusion threshold).
std::shared_ptr<Sequential> wide_mlp() {
  auto net = std::make_shared<Sequential>("wide");
  net->add(std::make_shared<Dense>(1024, "fc1"));
  net->add(std::make_shared<ReLU>("relu1"));
  net->add(std::make_shared<Dense>(1024, "fc2"));
  net->add(std::make_shared<ReLU>("relu2"));
  net->add(std::make_shared<Dense>(4, "fc3"));
  net->build({32});
  return net;
}

Dataset data() {
  Tensor x = Tensor::empty({512, 32});
  Tensor y = Tensor::empty({512}, DType::i64);
  CounterRng rng(7, "timeline_cuda");
  for (int64_t i = 0; i < 512 * 32; ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t n = 0; n < 512; ++n) y.data<int64_t>()[n] = n % 4;
  return Dataset::from_tensors({x, y});
}

struct Span {
  double t0 = 0, t1 = 0;
};

// Event times are written with 3 decimals of a microsecond: two consecutive events of one
// stream may differ by that rounding.
constexpr double kRoundUs = 0.002;

}  // namespace

TEST_CASE("the timeline shows the GPU's time on its own lanes", "[gpu][timeline]") {
  (void)test::gpu();
  const std::string dir = test::job_dir("tnt_timeline_cuda");
  const std::string path = dir + "/trace.json";
  auto net = wide_mlp();
  Model model(net, 3);
  REQUIRE(model.network().device().is_cuda());
  model.compile(std::make_shared<SGD>(0.01), std::make_shared<SoftmaxCrossEntropy>());
  FitOptions fit;
  fit.batch_size = 64 * size();  // 8 steps an epoch whatever the rank count
  fit.epochs = 1;
  fit.verbose = 0;
  REQUIRE(start_timeline(path, 3, 6));
  model.fit(data(), fit);
  stop_timeline();

  if (is_master_rank()) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    const json trace = json::parse(ss.str());
    for (int r = 0; r < size(); ++r) {
      INFO("rank " << r);
      std::map<int, std::string> lanes;
      // (step, name) -> the span; GPU lanes and the host's compute lane apart.
      std::map<std::pair<int64_t, std::string>, Span> gpu, host;
      std::map<int64_t, std::vector<Span>> allreduce;
      for (const json& e : trace["traceEvents"]) {
        if (e["pid"] != r) continue;
        if (e["ph"] == "M" && e["name"] == "thread_name") lanes[e["tid"]] = e["args"]["name"];
        if (e["ph"] != "X") continue;
        const int64_t step = e["args"]["step"];
        const double ts = e["ts"], dur = e["dur"];
        const std::string name = e["name"];
        if (e["tid"] == 3) {
          INFO(name << " of step " << step);
          CHECK(dur > 0);
          gpu[{step, name}] = {ts, ts + dur};
        } else if (e["tid"] == 4) {
          CHECK(name == "allreduce");
          CHECK(dur > 0);
          allreduce[step].push_back({ts, ts + dur});
        } else if (e["tid"] == 1) {
          host[{step, name}] = {ts, ts + dur};
        }
      }
      CHECK(lanes[3] == "GPU compute");
      CHECK(lanes[4] == "GPU comm");
      for (int64_t step = 3; step <= 6; ++step) {
        INFO("step " << step);
        for (const char* name : {"step", "forward", "loss", "backward", "backward fc1", "backward fc2",
                                 "backward fc3", "optimizer"}) {
          INFO(name);
          REQUIRE(gpu.count({step, name}));
          // Placed on the host clock from above (io/timeline_gpu.hpp): never before it was queued.
          if (host.count({step, name})) CHECK(gpu[{step, name}].t0 >= host[{step, name}].t0 - kRoundUs);
        }
        const Span s = gpu[{step, "step"}], f = gpu[{step, "forward"}], l = gpu[{step, "loss"}],
                   b = gpu[{step, "backward"}], o = gpu[{step, "optimizer"}];
        CHECK(s.t0 <= f.t0 + kRoundUs);
        CHECK(f.t1 <= l.t0 + kRoundUs);
        CHECK(l.t1 <= b.t0 + kRoundUs);
        CHECK(b.t1 <= o.t0 + kRoundUs);
        CHECK(o.t1 <= s.t1 + kRoundUs);
        // Backward runs the layers from the last: fc3, fc2, fc1, inside backward.
        const Span b3 = gpu[{step, "backward fc3"}], b2 = gpu[{step, "backward fc2"}],
                   b1 = gpu[{step, "backward fc1"}];
        CHECK(b.t0 <= b3.t0 + kRoundUs);
        CHECK(b3.t1 <= b2.t0 + kRoundUs);
        CHECK(b2.t1 <= b1.t0 + kRoundUs);
        CHECK(b1.t1 <= b.t1 + kRoundUs);
        if (step > 3) CHECK(gpu[{step - 1, "step"}].t1 <= s.t0 + kRoundUs);
        if (size() > 1) {
          // fc1, fc2, fc3: weights and biases, one bucket each at least.
          CHECK(allreduce[step].size() >= 3);
          for (const Span& a : allreduce[step]) {
            CHECK(a.t0 >= b.t0 - kRoundUs);  // a bucket is complete only after its layer's backward
            CHECK(a.t1 <= o.t0 + kRoundUs);  // the optimizer reads the sums
          }
        } else {
          CHECK(allreduce[step].empty());  // one rank sends nothing
        }
      }
    }
  }
  communicator().barrier();
  if (is_master_rank()) std::filesystem::remove_all(dir);
}
