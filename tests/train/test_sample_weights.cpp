// Sample weights and class weights in fit and evaluate, on 1, 2 and 3 ranks: p ranks on a
// global batch with weights give the weights of a serial loop that weights each sample's
// gradient itself (through Loss::backward's scale, not through the weighted loss); class
// weights equal the matching weight column; weights of 1 equal none; evaluate's loss is
// sum(w_i l_i) / N against a double computation from predict(), while its metrics stay
// unweighted; a bad weight seen by one rank is an InputError on every rank.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace {

using tnt::test::weights_of;

constexpr int64_t kSamples = 60;  // 3 full global batches of 16 and a padded one of 12
constexpr int64_t kBatch = 16;
constexpr uint64_t kSeed = 3;

struct Data {
  tnt::Tensor x;  // (N, 4)
  tnt::Tensor y;  // (N,) i64
  tnt::Tensor w;  // (N,) f32: 0, 0.5, 1, 2.5 in turn (exact in binary), so products are exact
};

Data make_data() {
  Data d{tnt::Tensor::empty({kSamples, 4}), tnt::Tensor::empty({kSamples}, tnt::DType::i64),
         tnt::Tensor::empty({kSamples})};
  tnt::CounterRng rng(9, "test_sample_weights");
  for (int64_t i = 0; i < kSamples * 4; ++i) d.x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
  const float cycle[] = {0.0f, 0.5f, 1.0f, 2.5f};
  for (int64_t n = 0; n < kSamples; ++n) {
    d.y.data<int64_t>()[n] = d.x.data<float>()[n * 4] > 0.5f ? 1 : 0;
    d.w.data<float>()[n] = cycle[(n * 7) % 4];  // a pattern unrelated to the rank slices
  }
  return d;
}

tnt::Tensor column_of(const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  return tnt::Tensor::from_vector(f, {static_cast<int64_t>(f.size())});
}

// The class weight of each label, as a weight column.
tnt::Tensor class_column(const Data& d, const tnt::ClassWeight& cw) {
  std::vector<double> w;
  for (int64_t n = 0; n < kSamples; ++n) w.push_back(cw.at(d.y.data<int64_t>()[n]));
  return column_of(w);
}

tnt::FitOptions fit_options() {
  tnt::FitOptions fit;
  fit.batch_size = kBatch;
  fit.epochs = 2;
  fit.verbose = 0;
  return fit;
}

std::vector<std::vector<double>> fit_with(const tnt::Dataset& data, const tnt::FitOptions& fit,
                                          tnt::LossPtr loss = std::make_shared<tnt::SoftmaxCrossEntropy>()) {
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.2), std::move(loss), {std::make_shared<tnt::Accuracy>()});
  model.fit(data, fit);
  return weights_of(*net);
}

// One process, no Model and no weighted loss: each sample alone through the network, its
// unweighted loss over the global batch's real count, backward with scale = its weight
// (backward adds into the parameter gradients), then one SGD step per global batch.
std::vector<std::vector<double>> train_serial(const Data& d, const std::vector<double>& w, int epochs) {
  auto net = tnt::test::small_mlp();
  net->initialize(kSeed);
  tnt::SGD sgd(0.2);
  tnt::SoftmaxCrossEntropy loss;
  tnt::RunContext rc;
  rc.training = true;
  rc.seed = kSeed;
  for (int e = 0; e < epochs; ++e) {
    for (int64_t g = 0; g < kSamples; g += kBatch) {
      const int64_t real = std::min(kBatch, kSamples - g);
      net->zero_grad();
      for (int64_t i = g; i < g + real; ++i) {
        auto out = net->forward({d.x.slice_rows(i, i + 1)}, rc);
        tnt::SavedState s;
        loss.forward(out[0], d.y.slice_rows(i, i + 1), real, s);
        net->backward({loss.backward(s, w[i])}, rc);
      }
      sgd.step(net->trainable_parameters());
      ++rc.step;
    }
  }
  return weights_of(*net);
}

std::vector<double> weights_vector(const Data& d) { return d.w.to_double_vector(); }

// The ranks sum their gradients in another order than the serial loop, and the serial loop
// adds per-sample gradients one at a time where the Model computes a batch's in one GEMM:
// after 8 SGD steps on weights of order 1 the differences stay at a few float ulps of the
// weights' scale (~1e-6). rtol 1e-4, atol 1e-5 leave room for that; a wrong weighting (a
// weight applied twice or not at all, a wrong denominator) moves the weights by 1e-2 or
// more here (checked below: unweighted training lands that far away).
void require_close(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t].size() == b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i) {
      INFO("tensor " << t << " element " << i << " on rank " << tnt::rank() << " of " << tnt::size());
      REQUIRE(std::fabs(a[t][i] - b[t][i]) <= 1e-5 + 1e-4 * std::fabs(b[t][i]));
    }
  }
}

double max_difference(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double m = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) m = std::max(m, std::fabs(a[t][i] - b[t][i]));
  return m;
}

// The message of the tnt::InputError that f throws (a failed check when it throws none).
template <typename F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const tnt::InputError& e) {
    return e.what();
  }
  FAIL_CHECK("no InputError on rank " << tnt::rank());
  return "";
}

}  // namespace

TEST_CASE("fit with sample weights: p ranks give the serial weighted weights") {
  Data d = make_data();
  auto serial = train_serial(d, weights_vector(d), 2);
  // The weights matter: unweighted training ends far from the weighted one.
  auto unweighted = train_serial(d, std::vector<double>(kSamples, 1.0), 2);
  REQUIRE(max_difference(serial, unweighted) > 1e-2);

  SECTION("a weight column in the dataset, the last global batch padded") {
    require_close(fit_with(tnt::Dataset::from_tensors({d.x, d.y, d.w}), fit_options()), serial);
  }
  SECTION("a map after distribute (the weight column rides along)") {
    tnt::DistributedDataset data =
        tnt::Dataset::from_tensors({d.x, d.y, d.w}).distribute(kBatch, tnt::Remainder::pad).map([](tnt::Element e) {
          return e;
        });
    auto net = tnt::test::small_mlp();
    tnt::Model model(net, kSeed);
    model.compile(std::make_shared<tnt::SGD>(0.2), std::make_shared<tnt::SoftmaxCrossEntropy>());
    model.fit(data, fit_options());
    require_close(weights_of(*net), serial);
  }
  SECTION("the user's own micro-batches (distribute_dataset=false)") {
    // Step s: this rank's contiguous slice of global batch s, batched by the user.
    tnt::Dataset batches = tnt::Dataset::from_function((kSamples + kBatch - 1) / kBatch, [d](int64_t s) {
      const int64_t g = s * kBatch, n = std::min(kBatch, kSamples - g);
      const int64_t begin = g + tnt::micro_batch_offset(n, tnt::rank(), tnt::size());
      const int64_t end = begin + tnt::micro_batch_size(n, tnt::rank(), tnt::size());
      return tnt::Element{d.x.slice_rows(begin, end), d.y.slice_rows(begin, end), d.w.slice_rows(begin, end)};
    });
    tnt::FitOptions fit = fit_options();
    fit.distribute_dataset = false;
    require_close(fit_with(batches, fit), serial);
  }
}

TEST_CASE("class_weight equals the matching weight column, and multiplies one") {
  Data d = make_data();
  const tnt::ClassWeight cw{{0, 0.5}, {1, 3.0}};
  tnt::FitOptions with_classes = fit_options();
  with_classes.class_weight = cw;
  // Both decide the same float weight for every sample: bitwise-equal training.
  auto a = fit_with(tnt::Dataset::from_tensors({d.x, d.y}), with_classes);
  auto b = fit_with(tnt::Dataset::from_tensors({d.x, d.y, class_column(d, cw)}), fit_options());
  REQUIRE(a == b);
  // And the serial loop agrees (within the tolerance above).
  require_close(a, train_serial(d, class_column(d, cw).to_double_vector(), 2));

  // Given both, the weights multiply (Keras does): products of 0, 0.5, 1, 2.5 and 0.5, 3
  // are exact in float, so again bitwise.
  std::vector<double> product = weights_vector(d);
  for (int64_t n = 0; n < kSamples; ++n) product[n] *= cw.at(d.y.data<int64_t>()[n]);
  auto both = fit_with(tnt::Dataset::from_tensors({d.x, d.y, d.w}), with_classes);
  REQUIRE(both == fit_with(tnt::Dataset::from_tensors({d.x, d.y, column_of(product)}), fit_options()));

  // Weights of 1, from a column or from class weights, equal none, bit for bit.
  auto plain = fit_with(tnt::Dataset::from_tensors({d.x, d.y}), fit_options());
  REQUIRE(fit_with(tnt::Dataset::from_tensors({d.x, d.y, tnt::Tensor::full({kSamples}, 1.0)}), fit_options()) ==
          plain);
  tnt::FitOptions ones = fit_options();
  ones.class_weight = {{0, 1.0}, {1, 1.0}};
  REQUIRE(fit_with(tnt::Dataset::from_tensors({d.x, d.y}), ones) == plain);
}

TEST_CASE("binary cross-entropy with class weights on 0/1 targets trains like the weight column") {
  Data d = make_data();
  // One logit per sample: an MLP with a single output.
  auto make = [] {
    auto net = std::make_shared<tnt::Sequential>("bce_mlp");
    net->add(std::make_shared<tnt::Dense>(8, "fc1"));
    net->add(std::make_shared<tnt::ReLU>("relu"));
    net->add(std::make_shared<tnt::Dense>(1, "fc2"));
    net->build({4});
    return net;
  };
  tnt::Tensor t = tnt::Tensor::empty({kSamples});
  for (int64_t n = 0; n < kSamples; ++n) t.data<float>()[n] = static_cast<float>(d.y.data<int64_t>()[n]);
  const tnt::ClassWeight cw{{0, 2.0}, {1, 0.5}};
  auto run = [&](const tnt::Dataset& data, const tnt::ClassWeight& classes) {
    auto net = make();
    tnt::Model model(net, kSeed);
    model.compile(std::make_shared<tnt::SGD>(0.2), std::make_shared<tnt::BinaryCrossEntropy>());
    tnt::FitOptions fit = fit_options();
    fit.class_weight = classes;
    model.fit(data, fit);
    return weights_of(*net);
  };
  auto by_classes = run(tnt::Dataset::from_tensors({d.x, t}), cw);
  REQUIRE(by_classes == run(tnt::Dataset::from_tensors({d.x, t, class_column(d, cw)}), {}));
  // Not vacuous: the class weights change the training.
  REQUIRE(max_difference(by_classes, run(tnt::Dataset::from_tensors({d.x, t}), {})) > 1e-3);
}

TEST_CASE("evaluate's weighted loss is sum(w_i l_i) / N; its metrics are unweighted") {
  Data d = make_data();
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.2), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  // Every rank computes every prediction; the reference is in double from them.
  tnt::Tensor logits = model.predict(tnt::Dataset::from_tensors({d.x}), kBatch);  // (N, 2)
  std::vector<double> z = logits.to_double_vector();
  double weighted = 0, correct = 0;
  for (int64_t n = 0; n < kSamples; ++n) {
    const double a = z[n * 2], b = z[n * 2 + 1];
    const int64_t y = d.y.data<int64_t>()[n];
    const double lse = std::max(a, b) + std::log(std::exp(a - std::max(a, b)) + std::exp(b - std::max(a, b)));
    weighted += d.w.data<float>()[n] * (lse - (y == 0 ? a : b));
    correct += ((b > a ? 1 : 0) == y) ? 1 : 0;
  }
  tnt::EvaluateOptions options;
  options.batch_size = kBatch;
  tnt::Logs logs = model.evaluate(tnt::Dataset::from_tensors({d.x, d.y, d.w}), options);
  // Per-sample losses in double from f32 logits that predict() and evaluate() compute alike
  // (the same network on the same rows; a GEMM over another batch split may round its
  // last bit differently: ~1e-7 relative), summed in another order, then rounded to f32 for
  // each rank's local sum: 1e-5 relative is ample and far below any weighting error.
  CHECK(logs.at("loss") == Approx(weighted / kSamples).epsilon(1e-5));
  CHECK(logs.at("accuracy") == Approx(correct / kSamples).epsilon(1e-12));  // counts: exact

  // class_weight in evaluate equals the matching column.
  const tnt::ClassWeight cw{{0, 4.0}, {1, 0.25}};
  tnt::EvaluateOptions with_classes = options;
  with_classes.class_weight = cw;
  const double by_classes = model.evaluate(tnt::Dataset::from_tensors({d.x, d.y}), with_classes).at("loss");
  const double by_column =
      model.evaluate(tnt::Dataset::from_tensors({d.x, d.y, class_column(d, cw)}), options).at("loss");
  CHECK(by_classes == by_column);

  // Validation inside fit uses the validation data's weights, but not fit's class_weight.
  tnt::FitOptions fit = fit_options();
  fit.epochs = 1;
  fit.class_weight = cw;
  fit.validation_data = tnt::Dataset::from_tensors({d.x, d.y, d.w});
  tnt::History h = model.fit(tnt::Dataset::from_tensors({d.x, d.y}), fit);
  const double val_loss = h.history.at("val_loss").back();
  // The same weights, evaluated again after fit: the same computation, up to the rounding
  // of the logged value (1e-6 relative is room for float sums in another order, if any).
  const double again = model.evaluate(tnt::Dataset::from_tensors({d.x, d.y, d.w}), options).at("loss");
  CHECK(val_loss == Approx(again).epsilon(1e-6));
}

TEST_CASE("evaluate on a dataset already distributed: the same results, class weights and checks") {
  Data d = make_data();
  tnt::Model model(tnt::test::small_mlp(), kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.2), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  tnt::EvaluateOptions options;
  options.batch_size = kBatch;
  const tnt::Dataset plain = tnt::Dataset::from_tensors({d.x, d.y});
  // distribute() pads the last global batch as evaluate(Dataset) does: the same batches, so
  // the same sums in the same order on every rank: equal, not only close.
  const tnt::DistributedDataset dist = plain.distribute(kBatch, tnt::rank(), tnt::size(), tnt::Remainder::pad);
  const tnt::Logs a = model.evaluate(plain, options);
  const tnt::Logs b = model.evaluate(dist);
  CHECK(a.at("loss") == b.at("loss"));
  CHECK(a.at("accuracy") == b.at("accuracy"));

  // class_weight reaches the distributed path (it changes the loss, and equals the column).
  const tnt::ClassWeight cw{{0, 4.0}, {1, 0.25}};
  tnt::EvaluateOptions with_classes;
  with_classes.class_weight = cw;
  const double by_classes = model.evaluate(dist, with_classes).at("loss");
  CHECK(by_classes != b.at("loss"));
  const tnt::DistributedDataset with_column = tnt::Dataset::from_tensors({d.x, d.y, class_column(d, cw)})
                                                  .distribute(kBatch, tnt::rank(), tnt::size(), tnt::Remainder::pad);
  CHECK(by_classes == model.evaluate(with_column).at("loss"));

  // Sizes that disagree with the data, and distribute_dataset=false, are refused on every rank.
  tnt::EvaluateOptions bad;
  bad.batch_size = kBatch * 2;
  std::string msg = input_error_of([&] { model.evaluate(dist, bad); });
  CHECK(msg.find("evaluate: batch_size=32 but the distributed dataset was cut into global batches of 16") !=
        std::string::npos);
  bad = {};
  bad.micro_batch_size = dist.micro_batch_size() + 1;
  msg = input_error_of([&] { model.evaluate(dist, bad); });
  CHECK(msg.find("evaluate: micro_batch_size=") != std::string::npos);
  bad = {};
  bad.distribute_dataset = false;
  msg = input_error_of([&] { model.evaluate(dist, bad); });
  CHECK(msg.find("distribute_dataset=false with a dataset already distributed") != std::string::npos);
}

TEST_CASE("a bad sample weight on one rank is an input error on every rank") {
  Data d = make_data();
  // Sample 15 is the last of global batch 0: on the last rank.
  SECTION("negative") {
    d.w.data<float>()[15] = -1.0f;
    std::string msg = input_error_of([&] { fit_with(tnt::Dataset::from_tensors({d.x, d.y, d.w}), fit_options()); });
    INFO(msg);
    CHECK(msg.find("sample weight -1 of sample 15 in global batch 0") != std::string::npos);
    if (tnt::size() > 1) CHECK(msg.find("on rank(s) " + std::to_string(tnt::size() - 1)) != std::string::npos);
  }
  SECTION("not finite, in evaluate") {
    d.w.data<float>()[15] = std::numeric_limits<float>::quiet_NaN();
    tnt::Model model(tnt::test::small_mlp(), kSeed);
    model.compile(std::make_shared<tnt::SGD>(0.2), std::make_shared<tnt::SoftmaxCrossEntropy>());
    tnt::EvaluateOptions options;
    options.batch_size = kBatch;
    std::string msg = input_error_of([&] { model.evaluate(tnt::Dataset::from_tensors({d.x, d.y, d.w}), options); });
    INFO(msg);
    CHECK(msg.find("sample weight nan of sample 15") != std::string::npos);
  }
  SECTION("a weight column with two numbers per sample") {
    tnt::Tensor two = tnt::Tensor::full({kSamples, 2}, 1.0);
    std::string msg = input_error_of([&] { fit_with(tnt::Dataset::from_tensors({d.x, d.y, two}), fit_options()); });
    INFO(msg);
    CHECK(msg.find("sample weight column") != std::string::npos);
  }
  SECTION("a negative class weight") {
    tnt::FitOptions fit = fit_options();
    fit.class_weight = {{1, -2.0}};
    std::string msg = input_error_of([&] { fit_with(tnt::Dataset::from_tensors({d.x, d.y}), fit); });
    CHECK(msg.find("class 1") != std::string::npos);
  }
  SECTION("a class weight for a class the model does not have") {
    // small_mlp predicts 2 classes; a key of 2 (often classes numbered from 1) never applies.
    tnt::FitOptions fit = fit_options();
    fit.class_weight = {{1, 2.0}, {2, 3.0}};
    std::string msg = input_error_of([&] { fit_with(tnt::Dataset::from_tensors({d.x, d.y}), fit); });
    INFO(msg);
    CHECK(msg.find("fit: class_weight: class 2 does not exist; the model's predictions have 2 classes, 0 to 1") !=
          std::string::npos);
    // Refused before any callback acts (a CSVLogger would have started its history).
    struct Began : tnt::Callback {
      Began() : tnt::Callback(Ranks::all) {}
      void on_train_begin(const tnt::Logs&) override { began = true; }
      bool began = false;
    };
    auto began = std::make_shared<Began>();
    fit.callbacks = {began};
    input_error_of([&] { fit_with(tnt::Dataset::from_tensors({d.x, d.y}), fit); });
    CHECK_FALSE(began->began);
    tnt::Model model(tnt::test::small_mlp(), kSeed);
    model.compile(std::make_shared<tnt::SGD>(0.2), std::make_shared<tnt::SoftmaxCrossEntropy>());
    tnt::EvaluateOptions options;
    options.batch_size = kBatch;
    options.class_weight = {{5, 1.0}};
    msg = input_error_of([&] { model.evaluate(tnt::Dataset::from_tensors({d.x, d.y}), options); });
    INFO(msg);
    CHECK(msg.find("evaluate: class_weight: class 5 does not exist") != std::string::npos);
    // Binary cross-entropy has classes 0 and 1 whatever its output's width.
    CHECK(tnt::BinaryCrossEntropy().class_count({-1, 1}) == 2);
    CHECK_THROWS_WITH(tnt::check_class_weight({{0, 1.0}, {2, 1.0}}, 2), Catch::Contains("class 2 does not exist"));
    CHECK_NOTHROW(tnt::check_class_weight({{0, 1.0}, {1, 1.0}}, 2));
  }
  SECTION("class weights for a loss without classes") {
    tnt::FitOptions fit = fit_options();
    fit.class_weight = {{1, 2.0}};
    tnt::Tensor targets = tnt::Tensor::zeros({kSamples, 2});
    std::string msg = input_error_of([&] {
      fit_with(tnt::Dataset::from_tensors({d.x, targets}), fit, std::make_shared<tnt::MeanSquaredError>());
    });
    CHECK(msg.find("mean_squared_error") != std::string::npos);
  }
  SECTION("weights for a loss that does not support them") {
    std::string msg = input_error_of([&] {
      fit_with(tnt::Dataset::from_tensors({d.x, d.y, d.w}), fit_options(),
               std::make_shared<tnt::LabelSmoothingCrossEntropy>(0.1, -1));
    });
    CHECK(msg.find("label_smoothing_cross_entropy does not support sample weights") != std::string::npos);
  }
}

TEST_CASE("a weight column travels with its sample through distribute and padding") {
  // 7 samples, weight = 10 * index + 1; global batch 4: one full batch and one of 3, padded.
  const int64_t n = 7;
  tnt::Tensor idx = tnt::Tensor::empty({n}, tnt::DType::i64), w = tnt::Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) {
    idx.data<int64_t>()[i] = i;
    w.data<float>()[i] = static_cast<float>(10 * i + 1);
  }
  auto data = tnt::Dataset::from_tensors({idx, w}).distribute(4, tnt::Remainder::pad);
  auto it = data.iterate(0);
  int64_t steps = 0;
  while (auto b = it.next()) {
    ++steps;
    REQUIRE(b->columns.size() == 2);
    for (int64_t r = 0; r < b->real_samples; ++r) {
      const int64_t i = b->columns[0].data<int64_t>()[r];
      CHECK(i == b->step * 4 + b->sample_offset + r);
      CHECK(b->columns[1].data<float>()[r] == static_cast<float>(10 * i + 1));
    }
    CHECK_FALSE(b->sample_weights.defined());  // Model fills it, the dataset does not
  }
  CHECK(steps == 2);
}
