// A training run that diverges (NaN or infinite loss and weights) on 1 and 2 ranks: every
// rank stops at the same point with an error that says where, and nothing diverged is
// written over a good checkpoint.
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace {

std::shared_ptr<tnt::Sequential> make_net() { return tnt::test::small_mlp(); }

tnt::Dataset make_data() { return tnt::test::threshold_data("divergence"); }

tnt::FitOptions fit_options(int epochs, std::vector<tnt::CallbackPtr> callbacks) {
  tnt::FitOptions fit;
  fit.batch_size = 16;  // 4 steps an epoch
  fit.epochs = epochs;
  fit.verbose = 0;
  fit.callbacks = std::move(callbacks);
  return fit;
}

// A fresh directory named on every rank (created by the master), removed at the end.
struct JobDir {
  JobDir() {
    if (tnt::is_master_rank()) {
      char tmpl[] = "/tmp/tnt_divergence_XXXXXX";
      REQUIRE(mkdtemp(tmpl) != nullptr);
      path = tmpl;
    }
    tnt::communicator().broadcast(path);
  }
  ~JobDir() {
    tnt::communicator().barrier();
    if (tnt::is_master_rank()) std::filesystem::remove_all(path);
  }
  std::string path;
};

// The file's bytes on the master ("" elsewhere, and for a file that is not there).
std::string master_bytes(const std::string& path) {
  if (!tnt::is_master_rank() || !std::filesystem::exists(path)) return "";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The message of the tnt::Error that f throws (a failed check when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const tnt::Error& e) {
    return e.what();
  }
  FAIL("no tnt::Error thrown");
  return "";
}

}  // namespace

TEST_CASE("save_checkpoint and save_weights refuse a NaN or an infinity and leave the file as it was") {
  JobDir dir;
  const std::string ck = dir.path + "/checkpoint.safetensors", weights = dir.path + "/weights.safetensors";
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::Adam>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
  model.fit(make_data(), fit_options(1, {}));  // Adam's moments hold values now
  model.save_checkpoint(ck, 1);
  tnt::communicator().barrier();
  const std::string good = master_bytes(ck);
  REQUIRE((!tnt::is_master_rank() || !good.empty()));

  // One element of one parameter: every rank alike, as a diverged step leaves them.
  float* w = model.network().named_parameters().at(2).param->value.data<float>();
  REQUIRE(model.network().named_parameters().at(2).name == "fc2.weight");
  const float saved = w[3];
  w[3] = std::numeric_limits<float>::quiet_NaN();
  std::string message = error_of([&] { model.save_checkpoint(ck, 2); });
  CHECK_THAT(message, Catch::Contains("refusing to write checkpoint '" + ck + "'") && Catch::Contains("'fc2.weight'") &&
                          Catch::Contains("NaN or an infinity"));
  message = error_of([&] { model.save_weights(weights); });
  CHECK_THAT(message, Catch::Contains(weights) && Catch::Contains("'fc2.weight'"));
  w[3] = saved;

  // The optimizer state alone.
  std::vector<tnt::NamedTensor> state = model.optimizer().named_state();
  REQUIRE_FALSE(state.empty());
  float* m = state.front().tensor.data<float>();
  m[0] = -std::numeric_limits<float>::infinity();
  message = error_of([&] { model.save_checkpoint(ck, 2); });
  CHECK_THAT(message, Catch::Contains("'optimizer." + state.front().name + "'"));
  m[0] = 0.0f;

  tnt::communicator().barrier();
  CHECK(master_bytes(ck) == good);  // nothing replaced it
  CHECK_FALSE(std::filesystem::exists(weights));
  if (tnt::is_master_rank()) {  // no temporary file left behind either
    CHECK(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator()) == 1);
  }
  // Finite again: saved as usual.
  model.save_checkpoint(ck, 2);
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) CHECK(master_bytes(ck) != good);
}

TEST_CASE("ModelCheckpoint: an epoch that diverged keeps the last good checkpoint") {
  JobDir dir;
  const std::string ck = dir.path + "/checkpoint.safetensors";
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  auto checkpoint = std::make_shared<tnt::ModelCheckpoint>(ck, "loss");
  model.fit(make_data(), fit_options(1, {checkpoint}));
  tnt::communicator().barrier();
  const std::string good = master_bytes(ck);

  // An enormous learning rate: the weights overflow within the epoch's 4 steps.
  model.set_learning_rate(1e30);
  tnt::FitOptions fit = fit_options(3, {checkpoint});
  fit.initial_epoch = 1;
  const std::string message = error_of([&] { model.fit(make_data(), fit); });
  CHECK_THAT(message, Catch::Contains("refusing to write checkpoint '" + ck + "'"));
  tnt::communicator().barrier();
  CHECK(master_bytes(ck) == good);
  tnt::Model other(make_net(), 99);
  other.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  CHECK(other.load_checkpoint(ck) == 1);
}

TEST_CASE("TerminateOnNaN with Action::raise throws on every rank, naming the step and the epoch") {
  JobDir dir;
  const std::string ck = dir.path + "/checkpoint.safetensors", csv = dir.path + "/history.csv";
  tnt::Model model(make_net(), 3);
  model.compile(std::make_shared<tnt::SGD>(1e30), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  auto nan_guard = std::make_shared<tnt::TerminateOnNaN>(tnt::TerminateOnNaN::Action::raise);
  tnt::FitOptions fit = fit_options(50, {nan_guard, std::make_shared<tnt::CSVLogger>(csv),
                                         std::make_shared<tnt::ModelCheckpoint>(ck, "loss")});
  const std::string message = error_of([&] { model.fit(make_data(), fit); });
  const int64_t step = model.global_step();
  INFO(message);
  CHECK(nan_guard->stopped_step() == step);
  const int64_t epoch = (step - 1) / 4 + 1, batch = (step - 1) % 4 + 1;
  CHECK_THAT(message, Catch::Contains(fmt::format("at step {} (epoch {}, batch {} of 4)", step, epoch, batch)) &&
                          Catch::Contains("diverged"));
  // Every rank stopped at the same step.
  std::vector<int64_t> steps = tnt::communicator().allgather(step);
  CHECK(std::count(steps.begin(), steps.end(), step) == tnt::size());
  // It stopped before the epoch's end hooks: no checkpoint of the diverged model, and no
  // history row for its epoch (at most rows for the epochs before).
  tnt::communicator().barrier();
  if (epoch == 1) CHECK_FALSE(std::filesystem::exists(ck));
  if (tnt::is_master_rank() && std::filesystem::exists(csv)) {
    std::ifstream in(csv);
    int64_t lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    CHECK(lines <= (epoch == 1 ? 0 : epoch));  // the header and epoch - 1 rows
  }
}

// One NaN in the input: ReLU maps fc1's NaN output to 0, so the loss stays finite, while
// fc1's weight gradient (input x upstream gradient: NaN x 0) makes its weights NaN and the
// model a constant. Before, TerminateOnNaN never fired and the run ended with exit 0.
TEST_CASE("TerminateOnNaN names a parameter gone NaN behind a finite loss (a NaN in the input)") {
  tnt::Tensor x = tnt::Tensor::empty({64, 4});
  tnt::Tensor y = tnt::Tensor::empty({64}, tnt::DType::i64);
  {
    auto it = make_data().batch(64).iterate(0);
    auto all = it.next();
    REQUIRE(all);
    x.copy_from((*all)[0]);
    y.copy_from((*all)[1]);
  }
  x.data<float>()[37 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();  // sample 37, feature 2
  const tnt::Dataset data = tnt::Dataset::from_tensors({x, y});
  for (auto action : {tnt::TerminateOnNaN::Action::raise, tnt::TerminateOnNaN::Action::stop}) {
    tnt::Model model(make_net(), 3);
    model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
    auto guard = std::make_shared<tnt::TerminateOnNaN>(action);
    tnt::History history;
    const tnt::FitOptions fit = fit_options(3, {guard});
    if (action == tnt::TerminateOnNaN::Action::raise) {
      const std::string message = error_of([&] { model.fit(data, fit); });
      INFO(message);
      CHECK_THAT(message, Catch::Contains("parameter 'fc1.weight' holds a NaN or an infinity after epoch 1 (step 4), "
                                          "though the loss is finite") &&
                              Catch::Contains("input data") && Catch::Contains("learning rate 0.1: a smaller one"));
    } else {
      history = model.fit(data, fit);
      CHECK(history.epochs.size() == 1);  // stopped after the first epoch
      for (double loss : history.history.at("loss")) CHECK(std::isfinite(loss));
    }
    CHECK(guard->stopped_step() == 4);
  }
}

TEST_CASE("TerminateOnNaN names a running statistic gone NaN on one rank, on every rank") {
  // BatchNorm's running variance diverges on micro-batches of a sample or two: training's
  // loss stays finite, every evaluation is NaN. Made so here on the last rank alone (the
  // statistics are each rank's own), after epoch 1.
  class Poison : public tnt::Callback {
   public:
    Poison() : tnt::Callback(Ranks::all) {}
    void on_epoch_end(int, const tnt::Logs&) override {
      if (tnt::rank() != tnt::size() - 1) return;
      for (auto& b : model_->network().named_buffers()) {
        if (b.name.find("running_var") != std::string::npos) {
          b.param->value.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
          return;
        }
      }
    }
  };
  auto net = tnt::test::small_cnn("bn_net", false, std::make_shared<tnt::BatchNorm>("bn1"));
  tnt::Model model(net, 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  std::vector<float> xs(16 * 64);
  std::vector<int32_t> ys(16);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 37) % 11) / 11.0f;
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<int32_t>(i % 3);
  const tnt::Dataset data =
      tnt::Dataset::from_tensors({tnt::Tensor::from_vector(xs, {16, 1, 8, 8}), tnt::Tensor::from_data(ys.data(), {16})});
  auto guard = std::make_shared<tnt::TerminateOnNaN>(tnt::TerminateOnNaN::Action::raise);
  tnt::FitOptions fit;
  fit.batch_size = 8;
  fit.epochs = 3;
  fit.verbose = 0;
  fit.callbacks = {std::make_shared<Poison>(), guard};
  const std::string message = error_of([&] { model.fit(data, fit); });
  INFO(message);
  // Every rank stops after epoch 1 (before: the others went on, and the evaluations were NaN
  // without a word); the rank that holds it names it.
  CHECK_THAT(message, Catch::Contains("holds a NaN or an infinity after epoch 1") &&
                          Catch::Contains("BatchNorm's statistics of very small micro-batches"));
  if (tnt::rank() == tnt::size() - 1) CHECK_THAT(message, Catch::Contains("'bn1.running_var' of rank"));
  CHECK(guard->stopped_step() == model.global_step());
}
