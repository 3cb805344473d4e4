// BinaryPrecision, BinaryRecall and AUC on the CPU engine: counts against plain comparisons,
// AUC against the exact sort-based value (binary_metrics_reference.hpp) within the bound that
// the binning implies, the NaN rules, bad targets, and the sums() contract that makes the
// metrics global (summed sums give exactly the value of one metric on all the data).
#include "binary_metrics_reference.hpp"

#include "tarantella/check.hpp"
#include "tarantella/metrics.hpp"
#include "tarantella/random.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>

using namespace tnt;

namespace {

struct Data {
  std::vector<float> scores;  // probabilities in [0, 1)
  std::vector<int> labels;    // 0 or 1, positive more often where the score is high
};

Data make_data(int64_t n, const std::string& key) {
  CounterRng rng(5, key);
  Data d;
  for (int64_t i = 0; i < n; ++i) {
    const float s = rng.uniform(static_cast<uint64_t>(2 * i));
    d.scores.push_back(s);
    d.labels.push_back(rng.uniform(static_cast<uint64_t>(2 * i + 1)) < 0.2 + 0.6 * s ? 1 : 0);
  }
  return d;
}

Tensor targets_as(const std::vector<int>& labels, DType dtype, const Shape& shape) {
  if (dtype == DType::f32) return Tensor::from_vector(std::vector<float>(labels.begin(), labels.end()), shape);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::i32) {
      t.data<int32_t>()[i] = labels[static_cast<size_t>(i)];
    } else {
      t.data<int64_t>()[i] = labels[static_cast<size_t>(i)];
    }
  }
  return t;
}

Tensor column(const std::vector<float>& v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size()), 1}); }

std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError");
  return "";
}

}  // namespace

TEST_CASE("precision and recall equal the counts of plain comparisons", "[metrics][binary]") {
  const Data d = make_data(500, "pr");
  for (double threshold : {0.5, 0.3, 0.0, 1.0}) {
    for (DType dt : {DType::f32, DType::i32, DType::i64}) {
      INFO("threshold " << threshold << ", targets " << dtype_name(dt));
      const test::Confusion c = test::confusion_of(d.scores, d.labels, threshold);
      // (N, 5): any shape is a set of independent decisions.
      const Tensor p = Tensor::from_vector(d.scores, {100, 5});
      const Tensor t = targets_as(d.labels, dt, {100, 5});
      BinaryPrecision precision({.threshold = threshold});
      BinaryRecall recall({.threshold = threshold});
      precision.update(p, t);
      recall.update(p, t);
      CHECK(precision.total() == c.tp);
      CHECK(precision.count() == c.tp + c.fp);
      CHECK(recall.total() == c.tp);
      CHECK(recall.count() == c.tp + c.fn);
      // One division of two integers on both sides: equal, not approximately.
      CHECK(precision.result() == (c.tp + c.fp > 0 ? static_cast<double>(c.tp) / (c.tp + c.fp) : 0.0));
      CHECK(recall.result() == static_cast<double>(c.tp) / (c.tp + c.fn));
    }
  }
}

TEST_CASE("precision and recall: a hand-counted case, strict threshold, nothing predicted", "[metrics][binary]") {
  // predictions 0.9 0.5 0.7 0.2 0.6 (0.5 is not above 0.5), targets 1 1 0 0 1:
  // TP = 0.9, 0.6; FP = 0.7; FN = 0.5.
  const Tensor p = column({0.9f, 0.5f, 0.7f, 0.2f, 0.6f});
  const Tensor t = column({1, 1, 0, 0, 1});
  BinaryPrecision precision;
  BinaryRecall recall;
  precision.update(p, t);
  recall.update(p, t);
  CHECK(precision.result() == 2.0 / 3.0);
  CHECK(recall.result() == 2.0 / 3.0);
  // No positive prediction, no positive target: 0 (as Keras), not a NaN.
  BinaryPrecision none;
  BinaryRecall no_positive;
  none.update(column({0.1f, 0.2f}), column({1, 0}));
  no_positive.update(column({0.9f, 0.2f}), column({0, 0}));
  CHECK(none.result() == 0.0);
  CHECK(no_positive.result() == 0.0);
}

TEST_CASE("a NaN prediction counts as wrong; infinities are ordinary scores", "[metrics][binary]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // NaN with target 1: a false negative; NaN with target 0: a false positive.
  const Tensor p = column({nan, nan, 0.9f, inf, -inf});
  const Tensor t = column({1, 0, 1, 1, 1});
  BinaryPrecision precision;
  BinaryRecall recall;
  precision.update(p, t);
  recall.update(p, t);
  CHECK(precision.total() == 2);  // 0.9 and +inf
  CHECK(precision.count() == 3);  // + the negative's NaN
  CHECK(recall.total() == 2);
  CHECK(recall.count() == 4);     // + the positive's NaN and -inf
}

TEST_CASE("from_logits: sigmoid(logit) > threshold", "[metrics][binary]") {
  const Data d = make_data(300, "logits");
  std::vector<float> logits;
  std::vector<float> probabilities;
  for (float s : d.scores) {
    // Logits in [-6, 6) kept 1e-3 away from 0, where the float sigmoid could round to 0.5.
    float x = 12.0f * s - 6.0f;
    if (std::fabs(x) < 1e-3f) x = 1e-3f;
    logits.push_back(x);
    probabilities.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x)))));
  }
  const test::Confusion c = test::confusion_of(probabilities, d.labels, 0.5);
  BinaryPrecision precision({.from_logits = true});
  BinaryRecall recall({.from_logits = true});
  precision.update(column(logits), column(std::vector<float>(d.labels.begin(), d.labels.end())));
  recall.update(column(logits), column(std::vector<float>(d.labels.begin(), d.labels.end())));
  CHECK(precision.total() == c.tp);
  CHECK(precision.count() == c.tp + c.fp);
  CHECK(recall.count() == c.tp + c.fn);
}

TEST_CASE("AUC against the exact sort-based AUC, within the binning's bound", "[metrics][binary][auc]") {
  for (int64_t bins : {200, 50, 1000}) {
    for (int64_t n : {1000, 37}) {
      INFO(bins << " bins, " << n << " elements");
      const Data d = make_data(n, "auc" + std::to_string(n));
      AUC auc(bins);
      auc.update(column(d.scores), column(std::vector<float>(d.labels.begin(), d.labels.end())));
      const double exact = test::exact_auc(d.scores, d.labels);
      // The binned AUC scores each (positive, negative) pair in a shared bin as 1/2 where the
      // exact order gives 0 or 1: the bound is half the fraction of such pairs (computed from
      // the data; ~0.5 / bins here). Plus 1e-12 for the two divisions in double.
      const double bound = test::binning_bound(d.scores, d.labels, bins);
      INFO("auc " << auc.result() << ", exact " << exact << ", bound " << bound);
      CHECK(std::fabs(auc.result() - exact) <= bound + 1e-12);
      CHECK(bound < 0.02);  // the comparison above means something
      CHECK(exact > 0.6);   // the data carry signal: a wrong orientation would give < 0.5
    }
  }
}

TEST_CASE("AUC: exact where no pair shares a bin, 1/2 for one bin, a hand-computed tie", "[metrics][binary][auc]") {
  // Scores in bin centres, every one in its own bin of 10: the binned AUC is the exact one.
  const std::vector<float> s = {0.05f, 0.15f, 0.25f, 0.35f, 0.45f, 0.55f, 0.65f, 0.75f, 0.85f, 0.95f};
  const std::vector<int> l = {0, 1, 0, 0, 1, 0, 1, 1, 0, 1};
  AUC ten(10);
  ten.update(column(s), column(std::vector<float>(l.begin(), l.end())));
  CHECK(ten.result() == test::exact_auc(s, l));
  CHECK(ten.result() == 17.0 / 25.0);  // negatives below each positive: 1 + 3 + 4 + 4 + 5
  AUC one(1);
  one.update(column(s), column(std::vector<float>(l.begin(), l.end())));
  CHECK(one.result() == 0.5);
  // Positives 0.9 and 0.4, negatives 0.41 and 0.1, 10 bins: 0.9 beats both (2), 0.4 beats 0.1
  // (1) and shares bin 4 with 0.41 (1/2): 3.5 / 4.
  AUC tie(10);
  tie.update(column({0.9f, 0.4f, 0.41f, 0.1f}), column({1, 1, 0, 0}));
  CHECK(tie.result() == 3.5 / 4.0);
  // Only one class so far: 0.
  AUC single(10);
  single.update(column({0.3f, 0.7f}), column({1, 1}));
  CHECK(single.result() == 0.0);
}

TEST_CASE("AUC: NaN ranked wrong, out-of-range scores clamped", "[metrics][binary][auc]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  AUC pos_nan(10), neg_nan(10), clamped(10);
  pos_nan.update(column({nan, 0.05f}), column({1, 0}));  // the positive's NaN in bin 0: a tie at best
  CHECK(pos_nan.result() == 0.5);
  neg_nan.update(column({0.95f, nan}), column({1, 0}));  // the negative's NaN in the top bin
  CHECK(neg_nan.result() == 0.5);
  clamped.update(column({inf, 7.0f, -inf, -3.0f}), column({1, 1, 0, 0}));
  CHECK(clamped.result() == 1.0);
}

TEST_CASE("AUC from logits equals AUC on their probabilities", "[metrics][binary][auc]") {
  const int64_t bins = 200;
  const Data d = make_data(400, "auc_logits");
  std::vector<float> centres, logits;
  for (float s : d.scores) {
    // The centre of s's bin, and its logit: the float sigmoid lands well inside the bin.
    const double c = (std::floor(static_cast<double>(s) * bins) + 0.5) / bins;
    centres.push_back(static_cast<float>(c));
    logits.push_back(static_cast<float>(std::log(c / (1.0 - c))));
  }
  const Tensor t = column(std::vector<float>(d.labels.begin(), d.labels.end()));
  AUC from_p(bins), from_x(bins, /*from_logits=*/true);
  from_p.update(column(centres), t);
  from_x.update(column(logits), t);
  CHECK(from_x.sums() == from_p.sums());
  CHECK(from_x.result() == from_p.result());
}

TEST_CASE("summed sums of parts equal one metric on the whole (what the ranks do)", "[metrics][binary]") {
  const Data d = make_data(301, "parts");
  const Tensor p = column(d.scores);
  const Tensor t = column(std::vector<float>(d.labels.begin(), d.labels.end()));
  std::vector<std::shared_ptr<Metric>> whole = {std::make_shared<BinaryPrecision>(),
                                                std::make_shared<BinaryRecall>(), std::make_shared<AUC>()};
  std::vector<std::shared_ptr<Metric>> a = {std::make_shared<BinaryPrecision>(), std::make_shared<BinaryRecall>(),
                                            std::make_shared<AUC>()};
  std::vector<std::shared_ptr<Metric>> b = {std::make_shared<BinaryPrecision>(), std::make_shared<BinaryRecall>(),
                                            std::make_shared<AUC>()};
  for (size_t m = 0; m < whole.size(); ++m) {
    INFO(whole[m]->name());
    whole[m]->update(p, t);
    a[m]->update(p.slice_rows(0, 100), t.slice_rows(0, 100));
    b[m]->update(p.slice_rows(100, 301), t.slice_rows(100, 301));
    std::vector<double> sa = a[m]->sums(), sb = b[m]->sums();
    REQUIRE(sa.size() == whole[m]->sums().size());
    for (size_t i = 0; i < sa.size(); ++i) sa[i] += sb[i];
    CHECK(sa == whole[m]->sums());
    CHECK(a[m]->value_of(sa) == whole[m]->result());
    // set_sums / reset round trip, as the training loop uses them.
    a[m]->set_sums(sa);
    CHECK(a[m]->result() == whole[m]->result());
    a[m]->reset();
    CHECK(a[m]->result() == 0.0);
  }
  CHECK(whole[2]->sums().size() == 400);  // 200 bins of positives, 200 of negatives
  CHECK(whole[0]->name() == "precision");
  CHECK(whole[1]->name() == "recall");
  CHECK(whole[2]->name() == "auc");
}

TEST_CASE("binary metrics: a target other than 0 or 1 is an InputError naming it", "[metrics][binary]") {
  CHECK_THAT(input_error([] { BinaryPrecision().update(column({0.1f, 0.2f, 0.3f}), column({0, 1, 0.5f})); }),
             Catch::Contains("precision") && Catch::Contains("target 0.5") && Catch::Contains("element 2"));
  const int64_t i64_values[] = {1, 2};
  Tensor i64 = Tensor::from_data(i64_values, {2});
  CHECK_THAT(input_error([&] { BinaryRecall().update(column({0.1f, 0.2f}), i64); }),
             Catch::Contains("recall") && Catch::Contains("target 2") && Catch::Contains("element 1"));
  const int32_t i32_values[] = {-1};
  Tensor i32 = Tensor::from_data(i32_values, {1});
  CHECK_THAT(input_error([&] { AUC().update(column({0.1f}), i32); }),
             Catch::Contains("auc") && Catch::Contains("target -1") && Catch::Contains("element 0"));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(input_error([&] { AUC().update(column({0.1f}), column({nan})); }), Catch::Contains("target nan"));
  CHECK_THAT(input_error([] { BinaryPrecision({.threshold = 1.5}); }),
             Catch::Contains("precision") && Catch::Contains("threshold 1.5"));
  CHECK_THAT(input_error([] { AUC(0); }), Catch::Contains("auc") && Catch::Contains("bins") && Catch::Contains("0"));
  CHECK_THAT(input_error([] { AUC(2000000); }), Catch::Contains("auc") && Catch::Contains("2000000"));
}
