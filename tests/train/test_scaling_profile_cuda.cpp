// --profile-scaling on a GPU (label gpu; also multi_gpu: scripts/gpu-check runs it again at
// one rank per GPU). The run's environment names the profile (TNT_PROFILE_SCALING, relative
// to the working directory) and asks for 10 steps. A GPU-bound MLP trains; its profile must
// hold the GPU's phases: they fill the step (the host only queues them, in a small part of
// it), backward takes about twice forward (two products of the 8192-wide layer against
// one), and each gradient is ready inside backward in the order backward reaches it.
#include "gpu_test_util.hpp"

#include <catch2/catch.hpp>

#include "comm/scaling_model.hpp"
#include "tarantella/config.hpp"
#include "tarantella/tarantella.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

using namespace tnt;

namespace {

constexpr int64_t kFeatures = 256, kWide = 8192, kBatch = 2048, kSteps = 24;

Dataset data(int64_t n) {
  Tensor x = Tensor::empty({n, kFeatures});
  Tensor y = Tensor::empty({n}, DType::i64);
  CounterRng rng(11, "scaling_profile_cuda");
  for (int64_t i = 0; i < n * kFeatures; ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t i = 0; i < n; ++i) y.data<int64_t>()[i] = i % 4;
  return Dataset::from_tensors({x, y});
}

}  // namespace

TEST_CASE("a GPU rank's scaling profile holds the GPU's phases", "[gpu][scaling]") {
  (void)test::gpu();
  const std::string path = config().profile_scaling;
  REQUIRE_FALSE(path.empty());  // the test's environment sets TNT_PROFILE_SCALING
  REQUIRE(config().profile_scaling_steps == 10);
  if (is_master_rank()) std::filesystem::remove(path);  // not an earlier run's

  auto net = std::make_shared<Sequential>("profiled");
  net->add(std::make_shared<Dense>(kWide, "fc1"));
  net->add(std::make_shared<ReLU>("relu1"));
  net->add(std::make_shared<Dense>(kWide, "fc2"));
  net->add(std::make_shared<ReLU>("relu2"));
  net->add(std::make_shared<Dense>(4, "fc3"));
  net->build({kFeatures});
  Model model(net, 5);
  REQUIRE(model.network().device().is_cuda());
  model.compile(std::make_shared<SGD>(0.001), std::make_shared<SoftmaxCrossEntropy>());
  FitOptions fit;
  fit.batch_size = kBatch * size();
  fit.epochs = 1;
  fit.verbose = 0;
  // 5 warm-up steps, 5 with one bucket (several ranks), 10 profiled: 24 are enough.
  model.fit(data(kSteps * kBatch * size()), fit);

  if (!is_master_rank()) return;
  REQUIRE(std::filesystem::exists(path));
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const comm::scaling::Profile p = comm::scaling::profile_from_json(ss.str(), path);
  INFO("forward " << p.forward_s << " s, backward " << p.backward_s << " s, exposed " << p.exposed_comm_s
                  << " s, optimizer " << p.optimizer_s << " s, other " << p.other_s << " s, step " << p.step_s
                  << " s, input " << p.input_s << " s");
  CHECK(p.device.rfind("cuda", 0) == 0);
  CHECK(p.transport == "nccl");
  CHECK(p.steps == 10);
  CHECK(p.ranks == size());
  // GPU-bound: the GPU's four phases are most of the step. On the host's clock forward and
  // backward are only their queueing (well under a tenth of it), and the rest would be
  // `other` (the waits at the readbacks). 0.7 leaves room for input and metrics.
  const double phases = p.forward_s + p.backward_s + p.exposed_comm_s + p.optimizer_s;
  CHECK(phases >= 0.7 * (p.step_s - p.input_s));
  CHECK(phases <= 1.05 * p.step_s);  // the GPU's time cannot exceed the step (5%: event timing)
  // Backward runs fc2's product twice (weight and input gradients) where forward runs it
  // once; fc1's and fc3's are small beside it (256 and 4 wide).
  CHECK(p.backward_s >= 1.3 * p.forward_s);
  CHECK(p.backward_s <= 3.5 * p.forward_s);
  std::map<std::string, double> ready;
  for (const auto& g : p.gradients) {
    INFO(g.name);
    CHECK(g.ready_s >= 0);
    CHECK(g.ready_s <= p.backward_s);
    ready[g.name] = g.ready_s;
  }
  REQUIRE(ready.size() == 6);
  CHECK(ready["fc3.weight"] < ready["fc2.weight"]);
  CHECK(ready["fc2.weight"] < ready["fc1.weight"]);
  // fc2's weight gradient waits for its product (a third of backward or more); fc3's for
  // almost nothing.
  CHECK(ready["fc3.weight"] < 0.2 * p.backward_s);
  CHECK(ready["fc2.weight"] > 0.2 * p.backward_s);
  if (size() > 1) {
    CHECK(p.comm_s > 0);
    CHECK(p.backward_alone_s > 0);
    CHECK(p.exposed_comm_s >= 0);
    CHECK(p.allreduce.has_value());
  }
}
