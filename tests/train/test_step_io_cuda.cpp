// A training step's I/O on CUDA (label gpu): input staging (page-locked ring, copy stream,
// events; train/staging.hpp) against plain Tensor::to copies, and the step's single readback
// (step/step_scalars.hpp).
//
// No tolerances here: staging changes only how the same bytes reach the device, and the
// readback only when the same device results are read, so losses, metrics and weights must
// be bitwise equal between the two modes, and integer metric counts equal the CPU engine's.
#include "gpu_test_util.hpp"

#include "core/device_api.hpp"
#include "step/step_scalars.hpp"
#include "small_nets.hpp"
#include "tarantella/ops.hpp"
#include "tarantella/tarantella.hpp"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using namespace tnt;

namespace {

constexpr uint64_t kSeed = 5;

// Sets TNT_PINNED_STAGING for the scope (Model reads it at each fit and evaluate).
class StagingMode {
 public:
  explicit StagingMode(bool on) {
    const char* old = std::getenv("TNT_PINNED_STAGING");
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv("TNT_PINNED_STAGING", on ? "1" : "0", 1);
  }
  ~StagingMode() {
    if (had_) {
      ::setenv("TNT_PINNED_STAGING", old_.c_str(), 1);
    } else {
      ::unsetenv("TNT_PINNED_STAGING");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

// The host waits and readbacks (device-to-host copies) counted by the device API between the
// start and the end of each step: the step itself and its logs' allreduce (host memory on
// one rank). The next batch is fetched (and staged) before the start.
class WaitCounter : public Callback {
 public:
  std::vector<int64_t> readbacks, waits;
  void on_train_batch_begin(int64_t, const Logs&) override {
    readbacks_ = backend::cuda_readbacks(0);
    waits_ = backend::cuda_host_waits(0);
  }
  void on_train_batch_end(int64_t, const Logs&) override {
    readbacks.push_back(backend::cuda_readbacks(0) - readbacks_);
    waits.push_back(backend::cuda_host_waits(0) - waits_);
  }

 private:
  int64_t readbacks_ = 0, waits_ = 0;
};

struct Run {
  std::vector<double> losses, accuracies, val_losses;
  std::vector<std::vector<double>> weights;
  std::vector<int64_t> readbacks, waits;
};

// 64 samples, global batch 24: steps of 24, 24 and a last one of 16 real samples padded to
// 24, for 2 epochs, with validation (batches of 20: another shape) after each.
Run fit_mlp(bool staging, const Precision& precision) {
  StagingMode mode(staging);
  (void)test::gpu();
  auto net = test::small_mlp();
  Model model(net, kSeed);
  REQUIRE(model.network().device().is_cuda());
  model.compile(std::make_shared<SGD>(0.1), std::make_shared<SoftmaxCrossEntropy>(),
                {std::make_shared<Accuracy>()}, precision);
  auto counter = std::make_shared<WaitCounter>();
  FitOptions fit;
  fit.batch_size = 24;
  fit.epochs = 2;
  fit.verbose = 0;
  fit.validation_data = test::threshold_data("validation");
  fit.validation_batch_size = 20;
  fit.callbacks = {counter};
  History h = model.fit(test::threshold_data("train"), fit);
  Run r;
  r.losses = h.history.at("loss");
  r.accuracies = h.history.at("accuracy");
  r.val_losses = h.history.at("val_loss");
  r.weights = test::weights_of(*net);
  r.readbacks = counter->readbacks;
  r.waits = counter->waits;
  return r;
}

}  // namespace

TEST_CASE("staged inputs and plain copies give bitwise-equal losses, metrics and weights", "[gpu]") {
  for (const char* dtype : {"fp32", "fp16"}) {
    INFO("precision " << dtype);
    const Precision precision = Precision::from_name(dtype);
    const Run staged = fit_mlp(true, precision);
    const Run plain = fit_mlp(false, precision);
    REQUIRE(staged.losses.size() == 2);
    CHECK(staged.losses == plain.losses);
    CHECK(staged.accuracies == plain.accuracies);
    CHECK(staged.val_losses == plain.val_losses);
    CHECK(staged.weights == plain.weights);
  }
}

TEST_CASE("a training step reads the device back once; staged inputs cost it no host wait", "[gpu]") {
  // Before the merged readback this step read back 3 times (the cross-entropy's label check,
  // the loss value, the accuracy's counts), 4 with loss scaling (the overflow flag). This
  // model (Dense, ReLU, SGD without clipping) reads nothing else back.
  for (const char* dtype : {"fp32", "fp16"}) {
    for (bool staging : {true, false}) {
      INFO("precision " << dtype << ", staging " << staging);
      const Run r = fit_mlp(staging, Precision::from_name(dtype));
      REQUIRE(r.readbacks.size() == 6);  // 3 steps x 2 epochs
      REQUIRE(r.waits.size() == 6);
      for (size_t i = 0; i < r.readbacks.size(); ++i) {
        INFO("step " << i);
        CHECK(r.readbacks[i] == 1);
        // The full steps (the third of each epoch is padded, and Tensor::copy_from of its
        // real rows' gradient waits too): the readback alone when staged; plain copies add
        // one wait per column (images and labels), as Tensor::to waits for its copy. The
        // very first step also uploads the optimizer's multi-tensor table (a synchronous
        // host-to-device copy, optim/multi_tensor.hpp), and may hold other first-use waits.
        const int64_t want = staging ? 1 : 3;
        if (i == 0) {
          CHECK(r.waits[i] >= want);
        } else if (i % 3 != 2) {
          CHECK(r.waits[i] == want);
        }
      }
    }
  }
}

TEST_CASE("a readback after start_copy waits for that copy, not for the work queued after it", "[gpu]") {
  // Model::train_step queues the copy of the step's results after the loss and reads them
  // after the backward; the host must not wait for the backward there. The work queued after
  // the copy here is 200 passes over 1 GiB (about 90 ms on an H200, more on slower cards),
  // queued in about a millisecond: a flush that waited for it would find it done.
  const Device device = test::gpu();
  detail::StepScalars s(device);
  const Tensor loss = Tensor::full({1}, 2.5, DType::f32).to(device);
  double got = 0;
  s.read_f32(loss, [&](double v) { got = v; });
  s.start_copy();
  const Tensor big = Tensor::zeros({int64_t{1} << 28}, DType::f32, device);
  for (int i = 0; i < 200; ++i) ops::scale(big, 0.5);
  void* after = backend::cuda_event_create(device.index);
  backend::cuda_event_record(after, backend::CudaStream::compute, device.index);
  const int64_t readbacks = backend::cuda_readbacks(device.index);
  CHECK(s.flush().empty());
  const bool work_done = backend::cuda_event_query(after, device.index);
  backend::cuda_event_synchronize(after, device.index);
  backend::cuda_event_destroy(after, device.index);
  CHECK_FALSE(work_done);
  CHECK(got == 2.5);
  CHECK(s.early_reads() == 1);
  CHECK(backend::cuda_readbacks(device.index) - readbacks == 1);  // the wait counts as the step's readback

  // Words reserved after start_copy: the flush copies everything after all the work.
  const Tensor second = Tensor::full({1}, -1.25, DType::f32).to(device);
  double a = 0, b = 0;
  s.read_f32(loss, [&](double v) { a = v; });
  s.start_copy();
  s.read_f32(second, [&](double v) { b = v; });
  CHECK(s.flush().empty());
  CHECK(a == 2.5);
  CHECK(b == -1.25);
  CHECK(s.early_reads() == 1);
  // And a step with nothing after start_copy reads early again (40 words in one copy).
  for (int i = 0; i < 40; ++i) s.read_f32(i % 2 ? loss : second, [&](double v) { a += v; });
  a = 0;
  s.start_copy();
  CHECK(s.flush().empty());
  CHECK(a == 20 * 2.5 + 20 * -1.25);
  CHECK(s.early_reads() == 2);
  // A first step larger than its first block (a fresh buffer of 4 words: blocks of 4 and of
  // 150 words) and than the page-locked copy's first size: the words in order from both.
  detail::StepScalars grown(device, 4);
  std::vector<double> seen;
  for (int i = 0; i < 3; ++i) grown.read_f32(i == 1 ? second : loss, [&](double v) { seen.push_back(v); });
  grown.reserve(150, 0, [&](const uint64_t* w) { seen.push_back(static_cast<double>(w[149])); });
  grown.read_f32(second, [&](double v) { seen.push_back(v); });
  CHECK(grown.blocks() == 3);
  grown.start_copy();
  CHECK(grown.flush().empty());
  CHECK(grown.early_reads() == 1);
  CHECK(seen == std::vector<double>{2.5, -1.25, 2.5, 0.0, -1.25});
}

TEST_CASE("on CUDA, evaluate's metric counts equal the CPU engine's on the same predictions", "[gpu]") {
  (void)test::gpu();
  auto net = test::small_mlp();
  Model model(net, kSeed);
  REQUIRE(model.network().device().is_cuda());
  model.compile(std::make_shared<SGD>(0.1), std::make_shared<SoftmaxCrossEntropy>(),
                {std::make_shared<Accuracy>(), std::make_shared<TopKAccuracy>(2)});
  Dataset data = test::threshold_data("evaluate");
  EvaluateOptions ev;
  ev.batch_size = 16;  // 4 steps, 4 readbacks, their counts summed
  Logs logs = model.evaluate(data, ev);
  // predict's outputs (in evaluate's batches of 16: the same kernels) on the host: the CPU
  // engine counts the same scores.
  Tensor scores = model.predict(data, 16);
  REQUIRE(scores.device().is_cpu());
  Tensor labels = data.batch(64).iterate(0).next()->at(1);
  Accuracy acc;
  TopKAccuracy top2(2);
  acc.update(scores, labels);
  top2.update(scores, labels);
  CHECK(logs.at("accuracy") == acc.result());
  CHECK(logs.at("top2_accuracy") == top2.result());
}

TEST_CASE("a bad label found at the step's readback is the direct call's InputError", "[gpu]") {
  const Device device = test::gpu();
  Tensor x = test::random_tensor({8, 4}, "bad label");
  Tensor y = test::random_labels(8, 2, "bad label");
  y.data<int64_t>()[5] = 7;
  std::string direct;
  try {
    SoftmaxCrossEntropy ce;
    SavedState saved;
    ce.forward(Tensor::zeros({8, 2}, DType::f32, device), y.to(device), 8, saved);
    FAIL("no InputError from the direct call");
  } catch (const InputError& e) {
    direct = e.what();
  }
  CHECK(direct == "SoftmaxCrossEntropy: label 7 of row 5 of this rank's batch is outside the 2 classes [0, 2)");
  auto net = test::small_mlp();
  Model model(net, kSeed);
  model.compile(std::make_shared<SGD>(0.1), std::make_shared<SoftmaxCrossEntropy>(), {std::make_shared<Accuracy>()});
  FitOptions fit;
  fit.batch_size = 8;
  fit.verbose = 0;
  try {
    model.fit(Dataset::from_tensors({x, y}), fit);
    FAIL("no InputError from fit");
  } catch (const InputError& e) {
    // The loss's check comes first (registered before the accuracy's, which finds it too);
    // fit adds where in training it was.
    CHECK(std::string(e.what()) == direct + " (training: epoch 1, step 1 of the epoch; the global batch of 8: samples "
                                            "0 to 7 on rank 0)");
  }
}
