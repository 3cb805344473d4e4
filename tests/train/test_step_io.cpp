// A step's I/O on the host side, without a GPU: the step readback's bookkeeping
// (step/step_scalars.hpp: words, consumers in order, errors, block growth, the scope that
// defers the losses' and metrics' results) and the input staging ring
// (train/staging.hpp) driven by fake events that record what the ring asked for.
#include "train/batch_sources.hpp"
#include "train/staging.hpp"
#include "step/step_scalars.hpp"

#include "tarantella/check.hpp"
#include "tarantella/config.hpp"
#include "tarantella/loss.hpp"
#include "tarantella/metrics.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace tnt;
using detail::StagingRing;
using detail::StepScalars;

namespace {

Tensor labels64(const std::vector<int64_t>& v) {
  return Tensor::from_data(v.data(), {static_cast<int64_t>(v.size())});
}

}  // namespace

TEST_CASE("step readback: words are filled, consumers run in order at the flush, once") {
  StepScalars s(Device::cpu(), 4);
  std::vector<std::string> calls;
  uint64_t* a = s.reserve(2, 1, [&](const uint64_t* w) {
    CHECK(w[0] == 7);
    CHECK(w[1] == 0);  // filled with 0, not written
    CHECK(w[2] == StepScalars::kNone);
    calls.push_back("a");
  });
  uint64_t* b = s.reserve(1, 0, [&](const uint64_t* w) { calls.push_back("b" + std::to_string(w[0])); });
  a[0] = 7;
  b[0] = 3;
  CHECK(calls.empty());  // nothing runs before the flush
  CHECK(s.words_reserved() == 4);
  CHECK(s.flush().empty());
  CHECK(calls == std::vector<std::string>{"a", "b3"});
  CHECK(s.words_reserved() == 0);
  CHECK(s.flush().empty());  // a second flush has nothing left to run
  CHECK(calls.size() == 2);
  CHECK(s.copies() == 0);  // on the CPU nothing is copied
}

TEST_CASE("step readback: a step larger than the block gets another, and the next step one block for all") {
  StepScalars s(Device::cpu(), 4);
  std::vector<uint64_t> seen;
  for (int i = 0; i < 3; ++i) {
    uint64_t* w = s.reserve(3, 0, [&, i](const uint64_t* words) { seen.push_back(words[2] + 10 * i); });
    w[2] = static_cast<uint64_t>(i);
  }
  CHECK(s.blocks() == 3);  // 4 words hold one reservation of 3
  CHECK(s.flush().empty());
  CHECK(seen == std::vector<uint64_t>{0, 11, 22});
  CHECK(s.capacity() == 9);
  seen.clear();
  for (int i = 0; i < 3; ++i) {
    uint64_t* w = s.reserve(3, 0, [&](const uint64_t* words) { seen.push_back(words[0]); });
    w[0] = static_cast<uint64_t>(i + 1);
  }
  CHECK(s.blocks() == 1);
  CHECK(s.flush().empty());
  CHECK(seen == std::vector<uint64_t>{1, 2, 3});
}

TEST_CASE("step readback: start_copy on the CPU changes nothing; words reserved after it are still read") {
  // On CUDA start_copy queues the early copy that flush waits for; on the CPU the words are
  // read where they were written, so the same steps give the same words with or without it.
  StepScalars s(Device::cpu(), 4);
  std::vector<uint64_t> seen;
  uint64_t* a = s.reserve(1, 0, [&](const uint64_t* w) { seen.push_back(w[0]); });
  a[0] = 5;
  s.start_copy();
  a[0] = 6;  // written after start_copy: the CPU reads the word as it is at the flush
  uint64_t* b = s.reserve(1, 1, [&](const uint64_t* w) { seen.push_back(w[1] == StepScalars::kNone ? w[0] : 0); });
  b[0] = 9;
  CHECK(s.flush().empty());
  CHECK(seen == std::vector<uint64_t>{6, 9});
  CHECK(s.early_reads() == 0);
  CHECK(s.copies() == 0);
  s.start_copy();  // nothing reserved: nothing to do, and the next flush is as before
  CHECK(s.flush().empty());
  CHECK(seen.size() == 2);
}

TEST_CASE("a partial batch's gradient takes the predictions' memory when the loss wrote over them") {
  // Model's step (train/batch_sources.hpp, padded_gradient): rows 0-1 real, 2-3 padding.
  Tensor predictions = Tensor::full({4, 3}, 7.0);
  const void* at = predictions.raw();
  Tensor real_grad = predictions.slice_rows(0, 2);  // as a loss's in-place gradient
  real_grad.fill_(1.5);
  predictions = Tensor();  // only the gradient holds that memory now
  const Tensor whole = detail::padded_gradient(real_grad, {4, 3}, DType::f32, at);
  CHECK(whole.raw() == at);
  CHECK(whole.shape() == Shape{4, 3});
  CHECK(whole.to_vector() == std::vector<float>{1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 0, 0, 0, 0, 0, 0});
  // Predictions someone still holds, or a gradient of its own: a new buffer, as before.
  const Tensor held = Tensor::full({4, 3}, 7.0);
  const Tensor held_grad = held.slice_rows(0, 2);
  const Tensor copied = detail::padded_gradient(held_grad, {4, 3}, DType::f32, held.raw());
  CHECK(copied.raw() != held.raw());
  CHECK(copied.to_vector() == std::vector<float>{7, 7, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0});
  CHECK(held.to_vector() == std::vector<float>(12, 7.0f));
  const Tensor own = Tensor::full({2, 3}, 2.0);
  CHECK(detail::padded_gradient(own, {4, 3}, DType::f32, own.raw()).to_vector() ==
        std::vector<float>{2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0});  // its memory holds 2 rows only
}

TEST_CASE("step readback: the first InputError is kept, later consumers still run, other errors propagate") {
  StepScalars s(Device::cpu());
  int after = 0;
  s.reserve(1, 0, [](const uint64_t*) { TNT_INPUT_ERROR("first problem"); });
  s.reserve(1, 0, [](const uint64_t*) { TNT_INPUT_ERROR("second problem"); });
  s.reserve(1, 0, [&](const uint64_t*) { ++after; });
  CHECK(s.flush() == "first problem");
  CHECK(after == 1);
  s.reserve(1, 0, [](const uint64_t*) { throw std::runtime_error("a bug"); });
  CHECK_THROWS_AS(s.flush(), std::runtime_error);
  CHECK(s.words_reserved() == 0);  // the buffer is empty again for the next step
  CHECK(s.flush().empty());
}

TEST_CASE("step readback: read_f32 gives the float widened, as ops::item; the check pair helpers") {
  StepScalars s(Device::cpu());
  double got = 0;
  s.read_f32(Tensor::full({1}, 0.1, DType::f32), [&](double v) { got = v; });
  CHECK(s.flush().empty());
  CHECK(got == static_cast<double>(0.1f));
  uint64_t pair[2] = {StepScalars::kNone, 0};
  CHECK(detail::bad_index(pair) == -1);
  pair[0] = 5;
  const double v = -3.5;
  std::memcpy(&pair[1], &v, sizeof v);
  CHECK(detail::bad_index(pair) == 5);
  CHECK(detail::bad_value(pair) == -3.5);
}

TEST_CASE("step readback: defer_has_non_finite reports at the flush") {
  StepScalars s(Device::cpu());
  Tensor good = Tensor::full({3}, 1.0);
  Tensor bad = Tensor::full({2}, 1.0);
  bad.data<float>()[1] = std::numeric_limits<float>::infinity();
  int answers = 0;
  bool a = true, b = false;
  detail::defer_has_non_finite(s, {good}, [&](bool x) { a = x, ++answers; });
  detail::defer_has_non_finite(s, {good, bad}, [&](bool x) { b = x, ++answers; });
  CHECK(answers == 0);
  CHECK(s.flush().empty());
  CHECK(answers == 2);
  CHECK(!a);
  CHECK(b);
}

TEST_CASE("step readback: inside a scope metrics add at the flush, exactly what a direct update adds") {
  // scores (4, 3): rows 0 and 2 right, row 1 wrong, row 3 ignored (label -100)
  Tensor scores = Tensor::from_vector({0.1f, 0.7f, 0.2f, 0.9f, 0.05f, 0.05f, 0.3f, 0.3f, 0.4f, 1, 0, 0}, {4, 3});
  Tensor labels = labels64({1, 2, 2, -100});
  Accuracy direct;
  direct.update(scores, labels);  // outside a scope: at once
  CHECK(direct.total() == 2);
  CHECK(direct.count() == 3);

  Accuracy deferred;
  BinaryPrecision precision;
  AUC auc(4);
  Tensor probs = Tensor::from_vector({0.9f, 0.2f, 0.6f, 0.4f}, {4});
  Tensor targets = Tensor::from_vector({1, 0, 0, 1}, {4});
  BinaryPrecision precision_direct;
  AUC auc_direct(4);
  precision_direct.update(probs, targets);
  auc_direct.update(probs, targets);
  StepScalars s(Device::cpu());
  {
    StepScalars::Scope scope(s);
    deferred.update(scores, labels);
    precision.update(probs, targets);
    auc.update(probs, targets);
    CHECK(deferred.count() == 0);  // not yet
    CHECK(precision.count() == 0);
    CHECK(auc.sums() == std::vector<double>(8, 0.0));
  }
  CHECK(s.flush().empty());
  CHECK(deferred.sums() == direct.sums());
  CHECK(precision.sums() == precision_direct.sums());
  CHECK(precision.sums() == std::vector<double>{1, 2});  // 0.9 (positive) and 0.6 (negative) above 0.5
  CHECK(auc.sums() == auc_direct.sums());
}

TEST_CASE("step readback: a bad label raises the direct call's message at the flush and adds nothing") {
  Tensor scores = Tensor::from_vector({0.1f, 0.7f, 0.2f, 0.9f, 0.05f, 0.05f}, {2, 3});
  Tensor labels = labels64({1, 3});
  std::string direct_message;
  Accuracy direct;
  try {
    direct.update(scores, labels);
    FAIL("no InputError");
  } catch (const InputError& e) {
    direct_message = e.what();
  }
  CHECK(direct_message == "accuracy: label 3 of row 1 of this rank's batch is outside the 3 classes [0, 3)");
  CHECK(direct.count() == 0);

  Accuracy deferred;
  BinaryRecall recall;
  StepScalars s(Device::cpu());
  {
    StepScalars::Scope scope(s);
    deferred.update(scores, labels);  // no throw yet
    recall.update(Tensor::from_vector({0.9f, 0.2f, 0.6f}, {3}), Tensor::from_vector({1, 0.5f, 2}, {3}));
  }
  CHECK(s.flush() == direct_message);  // the first of the two
  CHECK(deferred.count() == 0);
  CHECK(recall.count() == 0);

  // The binary metrics name the first bad target, as before.
  BinaryRecall alone;
  try {
    alone.update(Tensor::from_vector({0.9f, 0.2f, 0.6f}, {3}), Tensor::from_vector({1, 0.5f, 2}, {3}));
    FAIL("no InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == "recall: target 0.5 of element 1 is not 0 or 1 (binary metrics take 0/1 targets)");
  }
}

TEST_CASE("step readback: the CPU losses' input errors wait for the flush inside a scope, are at once outside") {
  SoftmaxCrossEntropy ce;
  LabelSmoothingCrossEntropy smooth(0.1);
  BinaryCrossEntropy bce;
  const std::string ce_message = "SoftmaxCrossEntropy: label 5 of row 1 of this rank's batch is outside the 3 classes [0, 3)";
  const std::string smooth_message = "LabelSmoothingCrossEntropy: label -2 of token 0 is outside the vocabulary [0, 3)";
  const std::string bce_message = "BinaryCrossEntropy: target 1.5 of sample 1 (element 1) is outside [0, 1]";
  Tensor logits = Tensor::from_vector({0.5f, -1, 2, 1, 0, -0.5f}, {2, 3});
  Tensor bce_logits = Tensor::from_vector({0.3f, -0.2f}, {2, 1});
  Tensor bce_targets = Tensor::from_vector({1, 1.5f}, {2, 1});
  SavedState saved;
  CHECK_THROWS_WITH(ce.forward(logits, labels64({0, 5}), 2, saved), ce_message);
  CHECK_THROWS_WITH(smooth.forward(logits, labels64({-2, 1}), 2, saved), smooth_message);
  CHECK_THROWS_WITH(bce.forward(bce_logits, bce_targets, 2, saved), bce_message);

  StepScalars s(Device::cpu());
  std::vector<Tensor> grads;
  {
    StepScalars::Scope scope(s);
    SavedState a, b, c;
    // Each goes on with the good elements; backward is finite and leaves the bad row out
    // of the label term (a row of LabelSmoothingCrossEntropy: all 0).
    Tensor la = ce.forward(logits, labels64({0, 5}), 2, a);
    Tensor lb = smooth.forward(logits, labels64({-2, 1}), 2, b);
    Tensor lc = bce.forward(bce_logits, bce_targets, 2, c);
    for (const Tensor& l : {la, lb, lc}) CHECK(std::isfinite(Loss::value(l)));
    grads = {ce.backward(a), smooth.backward(b), bce.backward(c)};
  }
  for (const Tensor& g : grads) {
    for (double v : g.to_double_vector()) CHECK(std::isfinite(v));
  }
  std::vector<double> smooth_row0 = grads[1].slice_rows(0, 1).to_double_vector();
  CHECK(smooth_row0 == std::vector<double>(3, 0.0));
  CHECK(s.flush() == ce_message);  // the first of the three
}

// ---------------------------------------------------------------------------------------
// The staging ring

namespace {

// Events are numbers; every call is logged as "<what> <event>".
class FakeDevice final : public detail::StagingDevice {
 public:
  std::vector<std::string> log;
  int created = 0, destroyed = 0;
  void* create_event() override { return reinterpret_cast<void*>(static_cast<uintptr_t>(++created)); }
  void destroy_event(void*) override { ++destroyed; }
  void record_on_copy(void* e) override { log.push_back("copy-record " + name(e)); }
  void record_on_compute(void* e) override { log.push_back("compute-record " + name(e)); }
  void host_wait(void* e) override { log.push_back("host-wait " + name(e)); }
  void copy_waits(void* e) override { log.push_back("copy-waits " + name(e)); }
  void compute_waits(void* e) override { log.push_back("compute-waits " + name(e)); }
  std::vector<std::string> take() { return std::exchange(log, {}); }

 private:
  static std::string name(void* e) { return std::to_string(reinterpret_cast<uintptr_t>(e)); }
};

}  // namespace

TEST_CASE("staging ring: slots round-robin; a slot is refilled only after its copy and its step") {
  FakeDevice dev;
  using V = std::vector<std::string>;
  {
    // Slot i's events: copied = 2i + 1, read = 2i + 2.
    StagingRing ring(3, dev);
    CHECK(dev.created == 6);
    // What Model's batch source does: stage 0, then for each step k stage k + 1, hand k over,
    // and release it once its step is queued.
    size_t s0 = ring.begin_fill();
    CHECK(s0 == 0);
    CHECK(dev.take().empty());  // a fresh slot waits for nothing
    ring.end_fill(s0);
    CHECK(dev.take() == V{"copy-record 1"});
    size_t s1 = ring.begin_fill();
    ring.end_fill(s1);
    CHECK(ring.hand_over() == 0);
    CHECK(dev.take() == V{"copy-record 3", "compute-waits 1"});
    CHECK(ring.state(0) == StagingRing::State::in_use);
    ring.release(0);
    CHECK(dev.take() == V{"compute-record 2"});
    size_t s2 = ring.begin_fill();
    CHECK(s2 == 2);
    ring.end_fill(s2);
    CHECK(ring.hand_over() == 1);
    ring.release(1);
    dev.take();
    // Slot 0 again: the host waits for its copy (the host buffer), the copy stream for the
    // step that read it (the device buffer).
    CHECK(ring.begin_fill() == 0);
    CHECK(dev.take() == V{"host-wait 1", "copy-waits 2"});
    ring.end_fill(0);
    CHECK(ring.hand_over() == 2);  // the oldest filled first
    CHECK(dev.take() == V{"copy-record 1", "compute-waits 5"});
    // Slot 1 is free (released), slot 2 in use: the next fill takes 1, the one after would
    // need 2, still read by a step: refused.
    CHECK(ring.begin_fill() == 1);
    ring.end_fill(1);
    CHECK_THROWS_WITH(ring.begin_fill(), Catch::Contains("slot 2 of 3 is still read by a step"));
    dev.take();
  }
  // Destruction waits for every recorded event, then destroys them all.
  CHECK(dev.destroyed == 6);
}

TEST_CASE("staging ring: batches staged ahead and never read are discarded at a pass's end") {
  FakeDevice dev;
  StagingRing ring(2, dev);
  ring.end_fill(ring.begin_fill());
  ring.end_fill(ring.begin_fill());
  CHECK_THROWS_WITH(ring.begin_fill(), Catch::Contains("waiting for its step"));
  ring.discard_filled();
  CHECK(ring.state(0) == StagingRing::State::released);
  CHECK_THROWS_WITH(ring.hand_over(), Catch::Contains("none is staged"));
  dev.take();
  CHECK(ring.begin_fill() == 0);
  // Never read: only its copy is waited for.
  CHECK(dev.take() == std::vector<std::string>{"host-wait 1"});
  CHECK_THROWS(ring.release(1));  // slot 1 was never handed to a step
  CHECK_THROWS(StagingRing(1, dev));
}

TEST_CASE("TNT_PINNED_STAGING is 1 by default, 0 turns staging off, anything else names the variable") {
  const char* old = std::getenv("TNT_PINNED_STAGING");
  const std::string saved = old ? old : "";
  ::unsetenv("TNT_PINNED_STAGING");
  CHECK(detail::pinned_staging_enabled());
  ::setenv("TNT_PINNED_STAGING", "0", 1);
  CHECK(!detail::pinned_staging_enabled());
  ::setenv("TNT_PINNED_STAGING", "1", 1);
  CHECK(detail::pinned_staging_enabled());
  ::setenv("TNT_PINNED_STAGING", "off", 1);  // the spelling of every boolean knob
  CHECK(!detail::pinned_staging_enabled());
  ::setenv("TNT_PINNED_STAGING", "yes please", 1);
  CHECK_THROWS_WITH(detail::pinned_staging_enabled(),
                    Catch::StartsWith("TNT_PINNED_STAGING='yes please' is not a boolean"));
  CHECK_THROWS_WITH(Config::from_env(), Catch::StartsWith("TNT_PINNED_STAGING='yes please' is not a boolean"));
  if (old) {
    ::setenv("TNT_PINNED_STAGING", saved.c_str(), 1);
  } else {
    ::unsetenv("TNT_PINNED_STAGING");
  }
}
