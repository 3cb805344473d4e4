// Which rank the others wait for, on GPUs (label gpu; also multi_gpu: scripts/gpu-check runs
// it again at one rank per GPU). A GPU rank's own time comes from CUDA events on its compute
// stream (train/rank_balance.hpp): on one GPU, steps of known GPU work (memory-bound axpy
// passes, whose time grows with their count) must measure as the GPU's time, not the
// host's quick queuing, without a wait inside a step; on several, a fit whose last rank
// queues its forward late (a host too busy to feed its GPU) must name that rank, with the
// GPU's time, and a fit without it must name none.
#include "gpu_test_util.hpp"

#include <catch2/catch.hpp>

#include "capture_stderr.hpp"
#include "core/clock.hpp"
#include "tarantella/tarantella.hpp"
#include "train/rank_balance.hpp"

#include <chrono>
#include <thread>

using namespace tnt;
using tnt::detail::RankBalance;
using tnt::detail::RankWork;

namespace {

// One step of `passes` axpy passes over 256 MB (64M floats): about 0.2 ms a pass at an
// H100's or H200's bandwidth, queued by the host in microseconds.
void gpu_step(RankBalance& b, const Tensor& x, const Tensor& y, int passes) {
  b.step_begin(detail::now_s());
  b.input_done(detail::now_s());
  b.compute_begin(detail::now_s());
  for (int i = 0; i < passes; ++i) ops::axpy(1e-3, x, y);
  b.backward_end(detail::now_s());
  b.update_begin(detail::now_s());
  ops::axpy(1e-3, x, y);  // the update
  b.update_done();
  b.step_end(detail::now_s());
  b.met(detail::now_s());
}

RankWork epoch(RankBalance& b, const Tensor& x, const Tensor& y, int passes) {
  b.epoch_begin();
  for (int k = 0; k < 8; ++k) gpu_step(b, x, y, passes);
  return b.gather(communicator()).at(static_cast<size_t>(rank()));
}

// Passes its input on; on rank `rank` its forward first sleeps 20 ms on the host.
class LateQueue : public Layer {
 public:
  explicit LateQueue(int rank) : Layer("late"), rank_(rank) {}
  std::string type() const override { return "LateQueue"; }
  std::vector<Shape> output_shapes(const std::vector<Shape>& in) const override { return {in.at(0)}; }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, const RunContext&, SavedState&) override {
    if (tnt::rank() == rank_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return {in.at(0)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g, const RunContext&, SavedState&) override {
    return {g.at(0)};
  }

 private:
  int rank_;
};

}  // namespace

TEST_CASE("rank balance on a GPU: own time is the GPU's, from its events", "[gpu][balance]") {
  const Device gpu = test::gpu();
  const Tensor x = Tensor::full({64 << 20}, 1.0, DType::f32, gpu);
  const Tensor y = Tensor::zeros({64 << 20}, DType::f32, gpu);
  RankBalance b(gpu);
  REQUIRE(b.gpu());
  epoch(b, x, y, 2);  // warm-up: the first launches
  const RankWork small = epoch(b, x, y, 5);
  const RankWork large = epoch(b, x, y, 20);
  INFO("5 passes: own " << small.own_s * 1e3 << " ms, queued " << small.queue_s * 1e3 << " ms; 20 passes: own "
                        << large.own_s * 1e3 << " ms, queued " << large.queue_s * 1e3 << " ms");
  CHECK(small.steps == 7);  // the epoch's first step has no reference
  CHECK(large.steps == 7);
  // 5 passes move 3.75 GB: more than 0.5 ms on any GPU this runs on (under 5 TB/s).
  CHECK(small.own_s > 0.5e-3);
  // Four times the passes: the GPU's time grows with them (2.5-6x: launch gaps and the
  // update's pass are a constant share), where the host's queuing stays far below it.
  CHECK(large.own_s > 2.5 * small.own_s);
  CHECK(large.own_s < 6.0 * small.own_s);
  CHECK(large.queue_s < 0.5 * large.own_s);
}

TEST_CASE("rank balance on GPUs: a rank that feeds its GPU late is named", "[gpu][balance]") {
  (void)test::gpu();
  auto run = [](int late_rank) {
    auto net = std::make_shared<Sequential>("balance_cuda");
    net->add(std::make_shared<Dense>(1024, "fc1"));
    net->add(std::make_shared<LateQueue>(late_rank));
    net->add(std::make_shared<ReLU>("relu"));
    net->add(std::make_shared<Dense>(4, "fc2"));
    net->build({256});
    Model model(net, 5);
    REQUIRE(model.network().device().is_cuda());
    model.compile(std::make_shared<SGD>(0.001), std::make_shared<SoftmaxCrossEntropy>());
    const int64_t n = 256 * 12 * size();
    Tensor xs = Tensor::empty({n, 256});
    Tensor ys = Tensor::empty({n}, DType::i64);
    for (int64_t i = 0; i < n * 256; ++i) xs.data<float>()[i] = static_cast<float>(i % 7) * 0.1f;
    for (int64_t i = 0; i < n; ++i) ys.data<int64_t>()[i] = i % 4;
    FitOptions fit;
    fit.batch_size = 256 * size();
    fit.epochs = 1;
    fit.verbose = 0;
    std::string err = test::captured_stderr([&] { model.fit(Dataset::from_tensors({xs, ys}), fit); });
    return std::make_pair(err, model.last_epoch_timing());
  };
  if (size() == 1) {
    CHECK(run(-1).second.slowest_rank == -1);  // nothing to compare
    return;
  }
  const int last = size() - 1;
  // 20 ms a step late against a step of a few ms: far beyond 1.25x.
  auto [err, t] = run(last);
  CHECK(t.slowest_rank == last);
  if (rank() == 0) CHECK_THAT(err, Catch::Contains("(GPU time)") && Catch::Contains("update on the GPU"));
  auto [even, te] = run(-1);
  CHECK(even.find("held the other") == std::string::npos);
}
