// The step readback inside Model on 1-3 CPU ranks (step/step_scalars.hpp): evaluate's and
// fit's logged loss and metrics are exactly what the public Loss and Metric calls give on the
// same predictions, and a bad target that only a metric finds (at the step's readback) is an
// InputError with the same message on every rank instead of a hang.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <memory>
#include <string>
#include <vector>

namespace {

constexpr uint64_t kSeed = 11;

}  // namespace

TEST_CASE("evaluate's logs equal the loss and metrics computed directly on predict's outputs") {
  tnt::Dataset data = tnt::test::threshold_data("readback");
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  auto loss = std::make_shared<tnt::SoftmaxCrossEntropy>();
  model.compile(std::make_shared<tnt::SGD>(0.1), loss,
                {std::make_shared<tnt::Accuracy>(), std::make_shared<tnt::TopKAccuracy>(2)});
  tnt::EvaluateOptions ev;
  ev.batch_size = 64;  // one global batch: one step, whose sum the direct calls repeat
  tnt::Logs logs = model.evaluate(data, ev);

  // Every rank computes the whole batch directly (predict runs on all samples).
  tnt::Tensor scores = model.predict(data, 64);
  auto it = data.batch(64).iterate(0);
  tnt::Tensor labels = it.next()->at(1);
  // The loss as Model sums it: each rank's plain sum (global_batch 1) of its own samples,
  // summed over the ranks, divided by the samples. On one rank that is the loss of all 64.
  if (tnt::size() == 1) {
    tnt::SavedState saved;
    const double sum = tnt::Loss::value(loss->forward(scores, labels, 1, saved));
    CHECK(logs["loss"] == sum / 64.0);
  }
  tnt::Accuracy acc;
  tnt::TopKAccuracy top2(2);
  acc.update(scores, labels);
  top2.update(scores, labels);
  // Counts are integers: exactly equal over any number of ranks.
  CHECK(logs["accuracy"] == acc.result());
  CHECK(logs["top2_accuracy"] == top2.result());
  CHECK(top2.result() == 1.0);  // two classes: the label is always among the first two
}

namespace {

// The Transformer's loss, watching what its backward is given: how many owners the saved
// logits' memory has, and whether the gradient took their place.
class WatchingLoss : public tnt::LabelSmoothingCrossEntropy {
 public:
  WatchingLoss() : tnt::LabelSmoothingCrossEntropy(0.1, -1) {}  // no padding label: 0 is a class
  std::vector<long> owners;
  int in_place = 0;
  tnt::Tensor backward(tnt::SavedState& saved, double scale) override {
    owners.push_back(saved.tensors.at(0).storage().use_count());
    const void* logits = saved.tensors.at(0).raw();
    tnt::Tensor g = tnt::LabelSmoothingCrossEntropy::backward(saved, scale);
    in_place += g.raw() == logits ? 1 : 0;
    return g;
  }
};

}  // namespace

TEST_CASE("fit lets its predictions go before the loss's backward, which writes the gradient over them") {
  // What saves the Transformer's step a (tokens, vocabulary) buffer at its peak (2.2 GB at
  // the tutorial's batch on a GPU): the metrics read the predictions first, then nothing but
  // the loss's saved state holds them. That the in-place gradient has the out-of-place one's
  // values is the layer tests' part (test_transformer_layers.cpp, and its CUDA twin).
  for (bool metrics : {false, true}) {
    INFO("metrics " << metrics);
    auto net = tnt::test::small_mlp();
    tnt::Model model(net, kSeed);
    auto loss = std::make_shared<WatchingLoss>();
    std::vector<tnt::MetricPtr> m;
    if (metrics) m.push_back(std::make_shared<tnt::Accuracy>());
    model.compile(std::make_shared<tnt::SGD>(0.1), loss, m);
    tnt::FitOptions fit;
    fit.batch_size = 24;  // 3 steps: 24, 24 and 16 real samples (padded; its gradient too)
    fit.verbose = 0;
    model.fit(tnt::test::threshold_data("in place"), fit);
    // A rank with no real sample in the last step (the third of 3) calls no loss there.
    CHECK(loss->owners.size() == (tnt::size() == 3 && tnt::rank() == 2 ? 2u : 3u));
    for (long o : loss->owners) CHECK(o == 1);
    CHECK(loss->in_place == static_cast<int>(loss->owners.size()));
  }
}

// What fit adds to a step's input error: where in training, and which samples each rank's
// rows are (row r of rank q is sample offset_q + r of the global batch).
static std::string step_context(int64_t global_batch) {
  std::string out = fmt::format(" (training: epoch 1, step 1 of the epoch; the global batch of {}: ", global_batch);
  for (int q = 0; q < tnt::size(); ++q) {
    const int64_t first = tnt::micro_batch_offset(global_batch, q, tnt::size());
    out += fmt::format("{}samples {} to {} on rank {}", q ? ", " : "", first,
                       first + tnt::micro_batch_size(global_batch, q, tnt::size()) - 1, q);
  }
  return out + ")";
}

TEST_CASE("a bad target found at the step's readback is the same InputError on every rank") {
  // BinaryCrossEntropy accepts a target of 0.5; BinaryPrecision needs 0 or 1, and finds it
  // only when the step's results are read, after backward: every rank must still throw.
  const int64_t n = 12;
  tnt::Tensor x = tnt::Tensor::full({n, 3}, 0.25);
  tnt::Tensor y = tnt::Tensor::zeros({n, 1});
  y.data<float>()[7] = 0.5f;  // global sample 7: rank 1 of 2 (6 samples each), rank 1 of 3 (4 each)
  auto net = std::make_shared<tnt::Sequential>("binary");
  net->add(std::make_shared<tnt::Dense>(1, "fc"));
  net->build({3});
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::BinaryCrossEntropy>(),
                {std::make_shared<tnt::BinaryPrecision>()});
  tnt::FitOptions fit;
  fit.batch_size = n;
  fit.verbose = 0;
  const int p = tnt::size();
  const int64_t micro = n / p;
  const int bad_rank = static_cast<int>(7 / micro);
  const int64_t element = 7 - bad_rank * micro;  // within that rank's micro-batch
  std::string expected = "precision: target 0.5 of element " + std::to_string(element) +
                         " is not 0 or 1 (binary metrics take 0/1 targets)";
  if (p > 1) expected += " (on rank(s) " + std::to_string(bad_rank) + ")";
  expected += step_context(n);
  try {
    model.fit(tnt::Dataset::from_tensors({x, y}), fit);
    FAIL("no InputError");
  } catch (const tnt::InputError& e) {
    CHECK(std::string(e.what()) == expected);
  }
  // The replicas took the same (last) update: still equal on every rank.
  std::vector<double> w = net->named_parameters().at(0).param->value.to_double_vector();
  CHECK(tnt::communicator().allreduce_min(w) == tnt::communicator().allreduce_max(w));
}

TEST_CASE("a bad label of a CPU loss is the same InputError on every rank (not a hang)") {
  // The CPU engine raises it with the step's results (detail::raise_input_error), so the
  // ranks without it do not wait in the gradient allreduce for one that stopped.
  tnt::Dataset data = tnt::test::threshold_data("bad label");
  auto it = data.batch(64).iterate(0);
  tnt::Element e = *it.next();
  tnt::Tensor y = e.at(1).clone();
  y.data<int64_t>()[50] = 9;  // global sample 50: on the last rank of 2 or 3
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  tnt::FitOptions fit;
  fit.batch_size = 64;
  fit.verbose = 0;
  const int p = tnt::size();
  int bad_rank = 0;
  int64_t offset = 0;
  for (int r = 0; r < p; ++r) {
    const int64_t mine = tnt::micro_batch_size(64, r, p);
    if (50 < offset + mine) {
      bad_rank = r;
      break;
    }
    offset += mine;
  }
  std::string expected = "SoftmaxCrossEntropy: label 9 of row " + std::to_string(50 - offset) +
                         " of this rank's batch is outside the 2 classes [0, 2)";
  if (p > 1) expected += " (on rank(s) " + std::to_string(bad_rank) + ")";
  expected += step_context(64);
  try {
    model.fit(tnt::Dataset::from_tensors({e.at(0), y}), fit);
    FAIL("no InputError");
  } catch (const tnt::InputError& err) {
    CHECK(std::string(err.what()) == expected);
  }
}
