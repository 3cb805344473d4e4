// Precision, recall and AUC through Model::evaluate and Model::fit on 1, 2 and 3 ranks: the
// logged values are global, exactly the values of one metric object fed all the data (what
// one rank computes), and match the independent reference (binary_metrics_reference.hpp).
// 101 samples in global batches of 16: the last batch is padded, and p = 2, 3 divide
// neither, so ranks hold different numbers of samples and padding rows must count nothing.
#include "binary_metrics_reference.hpp"

#include "tarantella/tarantella.hpp"

#include <catch2/catch.hpp>

#include <cmath>

namespace {

constexpr int64_t kSamples = 101;
constexpr int64_t kBatch = 16;

struct Data {
  std::vector<float> scores;  // probabilities in (0, 1), also the model's output
  std::vector<int> labels;
  tnt::Tensor x, y;  // (N, 1) each, f32
};

Data make_data(int64_t n = kSamples) {
  tnt::CounterRng rng(9, "binary_metrics_distributed");
  Data d;
  for (int64_t i = 0; i < n; ++i) {
    // Scores above 0 (a padded zero row would land in bin 0, so counting one shows).
    const float s = 0.01f + 0.98f * rng.uniform(static_cast<uint64_t>(2 * i));
    d.scores.push_back(s);
    d.labels.push_back(rng.uniform(static_cast<uint64_t>(2 * i + 1)) < 0.2 + 0.6 * s ? 1 : 0);
  }
  d.x = tnt::Tensor::from_vector(d.scores, {n, 1});
  d.y = tnt::Tensor::from_vector(std::vector<float>(d.labels.begin(), d.labels.end()), {n, 1});
  return d;
}

// y = x: one Dense unit with weight 1 and no bias (a product by 1 is exact), so the metrics
// see the scores themselves.
std::unique_ptr<tnt::Model> identity_model(const std::vector<tnt::MetricPtr>& metrics) {
  auto net = std::make_shared<tnt::Sequential>("identity");
  auto dense = std::make_shared<tnt::Dense>(1, tnt::DenseOptions{.use_bias = false}, "fc");
  net->add(dense);
  net->build({1});
  auto model = std::make_unique<tnt::Model>(net, 3);
  dense->weight().value.fill_(1.0);  // after Model's initialisation, on every rank alike
  // Learning rate 0: fit leaves the weight at 1, so every epoch logs the same values.
  model->compile(std::make_shared<tnt::SGD>(0.0), std::make_shared<tnt::MeanSquaredError>(), metrics);
  return model;
}

std::vector<tnt::MetricPtr> metrics() {
  return {std::make_shared<tnt::BinaryPrecision>(), std::make_shared<tnt::BinaryRecall>(),
          std::make_shared<tnt::AUC>()};
}

// The values one metric object gives on all the data at once: what a single rank logs.
std::map<std::string, double> one_process(const Data& d) {
  std::map<std::string, double> v;
  for (const tnt::MetricPtr& m : metrics()) {
    m->update(d.x, d.y);
    v[m->name()] = m->result();
  }
  return v;
}

void check_logs(const std::map<std::string, double>& logged, const Data& d) {
  const std::map<std::string, double> single = one_process(d);
  for (const char* name : {"precision", "recall", "auc"}) {
    INFO(name << " on " << tnt::size() << " ranks");
    REQUIRE(logged.count(name) == 1);
    // Integer counts summed in double over the ranks: exactly the one-process value.
    CHECK(logged.at(name) == single.at(name));
  }
  const tnt::test::Confusion c = tnt::test::confusion_of(d.scores, d.labels, 0.5);
  CHECK(logged.at("precision") == static_cast<double>(c.tp) / static_cast<double>(c.tp + c.fp));
  CHECK(logged.at("recall") == static_cast<double>(c.tp) / static_cast<double>(c.tp + c.fn));
  // The binning bound (binary_metrics_reference.hpp) plus 1e-12 for the divisions.
  const double exact = tnt::test::exact_auc(d.scores, d.labels);
  CHECK(std::fabs(logged.at("auc") - exact) <= tnt::test::binning_bound(d.scores, d.labels, 200) + 1e-12);
}

}  // namespace

TEST_CASE("evaluate logs global precision, recall and AUC, equal to one process's", "[metrics][binary][mpi]") {
  const Data d = make_data();
  auto model = identity_model(metrics());
  tnt::EvaluateOptions options;
  options.batch_size = kBatch;
  const tnt::Logs logs = model->evaluate(tnt::Dataset::from_tensors({d.x, d.y}), options);
  check_logs(logs, d);
}

TEST_CASE("fit logs them under their names, for training and validation", "[metrics][binary][mpi]") {
  const Data d = make_data();
  const std::vector<tnt::MetricPtr> ms = metrics();
  auto model = identity_model(ms);
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.epochs = 2;
  fit.verbose = 0;
  // Validation on other samples (the first 50), so that its sums differ from training's.
  const Data dv = make_data(50);
  fit.validation_data = tnt::Dataset::from_tensors({dv.x, dv.y});
  const tnt::History h = model->fit(tnt::Dataset::from_tensors({d.x, d.y}), fit);
  for (int epoch = 0; epoch < 2; ++epoch) {
    INFO("epoch " << epoch);
    std::map<std::string, double> train, validation;
    for (const char* name : {"precision", "recall", "auc"}) {
      REQUIRE(h.history.count(name) == 1);
      REQUIRE(h.history.count(std::string("val_") + name) == 1);
      train[name] = h.history.at(name).at(static_cast<size_t>(epoch));
      validation[name] = h.history.at(std::string("val_") + name).at(static_cast<size_t>(epoch));
    }
    check_logs(train, d);
    check_logs(validation, dv);
  }
  // The validation pass gave the metric objects back their training sums (AUC: the whole
  // histogram): summed over the ranks, they are one process's sums over the last epoch.
  const std::vector<tnt::MetricPtr> single = metrics();  // one process, all the samples
  for (size_t i = 0; i < ms.size(); ++i) {
    INFO(ms[i]->name());
    single[i]->update(d.x, d.y);
    CHECK(tnt::communicator().allreduce_sum(ms[i]->sums()) == single[i]->sums());
  }
}
