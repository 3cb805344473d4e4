// Model::fit with strategy=parameter_server, on 3 ranks (rank 0 serves, TNT_PS_SERVERS
// unset, 2 workers) and on 4 (TNT_PS_SERVERS=0,3: two servers, the variables split between
// them, 2 workers). Every rank runs every case (fit is collective over the job).
#include <catch2/catch.hpp>

#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

namespace {

using tnt::test::weights_of;

constexpr int64_t kSamples = 96;  // 3 global batches of 32
constexpr int64_t kBatch = 32;
constexpr uint64_t kSeed = 11;

tnt::Dataset cnn_data() {
  tnt::Tensor x = tnt::Tensor::empty({kSamples, 1, 8, 8});
  tnt::Tensor y = tnt::Tensor::empty({kSamples}, tnt::DType::i64);
  tnt::CounterRng rng(123, "test_ps_fit");
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
  for (int64_t n = 0; n < kSamples; ++n) y.data<int64_t>()[n] = n % 3;
  return tnt::Dataset::from_tensors({x, y});
}

struct Run {
  std::shared_ptr<tnt::Sequential> net;
  std::unique_ptr<tnt::Model> model;
  tnt::History history;
};

// SGD with momentum, so that optimizer state travels too.
std::unique_ptr<tnt::Model> make_model(std::shared_ptr<tnt::Sequential> net) {
  auto model = std::make_unique<tnt::Model>(net, kSeed);
  model->compile(std::make_shared<tnt::SGD>(0.05, tnt::SgdOptions{.momentum = 0.9}),
                 std::make_shared<tnt::SoftmaxCrossEntropy>(), {std::make_shared<tnt::Accuracy>()});
  return model;
}

Run train(tnt::Strategy strategy, std::optional<int64_t> staleness, int epochs,
          std::vector<tnt::CallbackPtr> callbacks = {}) {
  Run run;
  run.net = tnt::test::small_cnn("small_cnn");
  run.model = make_model(run.net);
  tnt::FitOptions fit;
  fit.epochs = epochs;
  fit.verbose = 0;
  fit.batch_size = kBatch;
  fit.strategy = strategy;
  fit.max_staleness = staleness;
  fit.callbacks = std::move(callbacks);
  run.history = run.model->fit(cnn_data(), fit);
  return run;
}

// Whether every rank holds bitwise the same values.
bool same_on_every_rank(const std::vector<std::vector<double>>& weights) {
  double sum = 0;
  uint64_t bits = 0;
  for (const auto& w : weights) {
    for (double v : w) {
      sum += v;
      uint64_t b = 0;
      std::memcpy(&b, &v, sizeof b);
      bits = bits * 1099511628211ull + b;
    }
  }
  const double key = static_cast<double>(bits >> 11) + sum;
  auto& comm = tnt::communicator();
  return comm.allreduce_max(key) == comm.allreduce_min(key);
}

std::string shared_dir() {
  std::string dir = (std::filesystem::temp_directory_path() / ("tnt_ps_fit_" + std::to_string(::getpid()))).string();
  tnt::communicator().broadcast(dir);
  if (tnt::is_master_rank()) std::filesystem::create_directories(dir);
  tnt::communicator().barrier();
  return dir;
}

}  // namespace

TEST_CASE("ps: max_staleness 0 gives synchronous training's losses and weights", "[ps]") {
  const Run sync = train(tnt::Strategy::synchronous, std::nullopt, 3);
  const Run ps = train(tnt::Strategy::parameter_server, 0, 3);
  // Synchronous fit here runs on all p ranks, the parameter-server fit on p - K workers: the
  // same serial step on the global batch of 32 (model.hpp), the gradient summed in another
  // order (p micro-batches allreduced, against p - K micro-batches summed by the server).
  // f32 sums of a few hundred terms differ by a few ulp (~1e-7 relative); after 9 SGD steps
  // with momentum 0.9 the weights differed by 3e-8 and the losses printed equal to 6 digits
  // (measured on 3 and 4 ranks). The bounds (1e-5) leave more than 100x room and still fail
  // a lost, doubled or stale push, which moves the losses by ~1e-3 or more.
  const auto& a = sync.history.history.at("loss");
  const auto& b = ps.history.history.at("loss");
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  for (size_t e = 0; e < a.size(); ++e) {
    INFO("epoch " << e << ": synchronous " << a[e] << ", parameter server " << b[e]);
    CHECK(std::abs(a[e] - b[e]) <= 1e-5 * std::abs(a[e]) + 1e-6);
  }
  CHECK(ps.history.history.at("accuracy") .size() == 3);
  const auto wa = weights_of(*sync.net), wb = weights_of(*ps.net);
  REQUIRE(wa.size() == wb.size());
  double worst = 0;
  for (size_t i = 0; i < wa.size(); ++i) {
    for (size_t j = 0; j < wa[i].size(); ++j) worst = std::max(worst, std::abs(wa[i][j] - wb[i][j]));
  }
  INFO("largest weight difference " << worst);
  CHECK(worst <= 1e-5);
  CHECK(ps.model->global_step() == 9);
  CHECK(ps.model->optimizer().step_count() == 9);
  // Servers and workers end with one model.
  CHECK(same_on_every_rank(wb));
}

TEST_CASE("ps: fully asynchronous training converges", "[ps]") {
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.5), std::make_shared<tnt::SoftmaxCrossEntropy>(),
                {std::make_shared<tnt::Accuracy>()});
  tnt::FitOptions fit;
  fit.epochs = 40;
  fit.verbose = 0;
  fit.batch_size = 16;
  fit.strategy = tnt::Strategy::parameter_server;  // max_staleness unset: no bound
  tnt::History h = model.fit(tnt::test::threshold_data("ps_async"), fit);
  const auto& loss = h.history.at("loss");
  REQUIRE(loss.size() == 40);
  // One epoch's loss is not a measure here: a gradient computed 2-3 updates ago, applied at
  // SGD's 0.5, sometimes throws one epoch back up (seen: 0.51 between 0.24 and 0.14, once in
  // the last epoch under CI's load). The mean of the last five epochs is: 0.12-0.19 over 24
  // runs (1 and 2 servers; also with a worker paused 0.2 s in every 0.25 s); a spike to 0.69 moves
  // it by 0.11. 0.35 still fails a run that does not learn (it stays near 0.69).
  double tail = 0;
  for (size_t e = loss.size() - 5; e < loss.size(); ++e) tail += loss[e] / 5;
  INFO("loss: first epoch " << loss.front() << ", mean of the last five " << tail << ", last " << loss.back());
  CHECK(tail < 0.35);
  CHECK(tail < loss.front() * 0.6);
  CHECK(same_on_every_rank(weights_of(*net)));
}

TEST_CASE("ps: bounded staleness trains, and the replicas agree after it", "[ps]") {
  const Run ps = train(tnt::Strategy::parameter_server, 1, 2);
  const auto& loss = ps.history.history.at("loss");
  REQUIRE(loss.size() == 2);
  CHECK(std::isfinite(loss.back()));
  CHECK(same_on_every_rank(weights_of(*ps.net)));
}

TEST_CASE("ps: a checkpoint written in parameter_server mode loads in synchronous mode", "[ps]") {
  const std::string dir = shared_dir();
  const std::string path = dir + "/ps.safetensors";
  const Run ps = train(tnt::Strategy::parameter_server, 0, 2,
                       {std::make_shared<tnt::ModelCheckpoint>(path, "loss")});
  // Written during the fit by the workers' master: the same names and metadata keys as a
  // checkpoint of synchronous training.
  const std::string sync_path = dir + "/sync.safetensors";
  const Run sync = train(tnt::Strategy::synchronous, std::nullopt, 2);
  sync.model->save_checkpoint(sync_path, 2);
  const tnt::Checkpoint a = tnt::Checkpoint::read(path), b = tnt::Checkpoint::read(sync_path);
  std::vector<std::string> na, nb;
  for (const auto& [name, t] : a.tensors()) na.push_back(name);
  for (const auto& [name, t] : b.tensors()) nb.push_back(name);
  CHECK(na == nb);
  std::vector<std::string> ka, kb;
  for (const auto& [k, v] : a.metadata()) ka.push_back(k);
  for (const auto& [k, v] : b.metadata()) kb.push_back(k);
  CHECK(ka == kb);
  CHECK(a.metadata().at("epoch") == "2");
  CHECK(a.metadata().at("step") == "6");

  // Loaded into a fresh model on every rank: the parameter-server model's variables and
  // optimizer state exactly (the last epoch's pushes were all applied before it was written).
  auto net = tnt::test::small_cnn("small_cnn");
  auto model = make_model(net);
  CHECK(model->load_checkpoint(path) == 2);
  CHECK(weights_of(*net) == weights_of(*ps.net));
  const auto sa = model->optimizer().named_state(), sb = ps.model->optimizer().named_state();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].name);
    CHECK(sa[i].tensor.to_double_vector() == sb[i].tensor.to_double_vector());
  }
  // ... and synchronous training goes on from it.
  tnt::FitOptions fit;
  fit.epochs = 3;
  fit.initial_epoch = 2;
  fit.verbose = 0;
  fit.batch_size = kBatch;
  tnt::History h = model->fit(cnn_data(), fit);
  CHECK(std::isfinite(h.last("loss")));
  CHECK(model->global_step() == 9);
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}

TEST_CASE("ps: bad options are refused on every rank", "[ps]") {
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.verbose = 0;
  fit.batch_size = 16;
  fit.strategy = tnt::Strategy::parameter_server;
  fit.max_staleness = -1;
  CHECK_THROWS_WITH(model.fit(tnt::test::threshold_data("bad"), fit),
                    Catch::Contains("max_staleness=-1 must be 0 (synchronous)"));
  fit.max_staleness = std::nullopt;
  fit.distribute_dataset = false;
  CHECK_THROWS_WITH(model.fit(tnt::test::threshold_data("bad"), fit), Catch::Contains("needs distribute_dataset=true"));
  fit.distribute_dataset = true;
  const tnt::DistributedDataset shards =
      tnt::test::threshold_data("bad").distribute(16, tnt::rank(), tnt::size(), tnt::Remainder::pad);
  CHECK_THROWS_WITH(model.fit(shards, fit), Catch::Contains("needs the unbatched dataset"));
  // A global batch smaller than the workers: refused by the workers, and the servers learn
  // it from them, so every rank throws the same InputError.
  fit.max_staleness = std::nullopt;
  fit.batch_size = 1;
  CHECK_THROWS_AS(model.fit(tnt::test::threshold_data("bad"), fit), tnt::InputError);
  // A loss averaged over a sequence's labels would count them over the global batch at every
  // step, a collective the workers never meet in: refused on every rank at the first step.
  {
    auto seq = std::make_shared<tnt::Sequential>("seq");
    seq->add(std::make_shared<tnt::Dense>(3, "fc"));
    seq->build({4, 2});
    tnt::Model seq_model(seq, kSeed);
    seq_model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
    std::vector<float> xs(32 * 4 * 2, 0.5f);
    std::vector<int64_t> ys(32 * 4, 1);
    const tnt::Dataset seq_data = tnt::Dataset::from_tensors(
        {tnt::Tensor::from_vector(xs, {32, 4, 2}), tnt::Tensor::from_data(ys.data(), {32, 4})});
    tnt::FitOptions seq_fit;
    seq_fit.verbose = 0;
    seq_fit.batch_size = 16;
    seq_fit.strategy = tnt::Strategy::parameter_server;
    CHECK_THROWS_WITH(seq_model.fit(seq_data, seq_fit), Catch::Contains("a loss averaged over the labels of a sample's sequence"));
  }
  CHECK(tnt::parse_strategy("parameter_server") == tnt::Strategy::parameter_server);
  CHECK_THROWS_WITH(tnt::parse_strategy("async"), "strategy 'async' is not synchronous or parameter_server");
}

namespace {

// Worker 1 (rank 1 of the workers' communicator during the fit) stops for 300 ms after the
// first step of each epoch. (It slept 20 ms after every step before: worker 0 then had to
// finish two steps in 20 ms to lead by 2, which it did not in 3 of 8 runs on a loaded
// 2-core machine, load average 11-15, where its own step took over 10 ms. Now it must finish
// three in 300 ms, 100 ms a step, and the test sleeps 0.6 s a fit instead of 0.32.)
class SlowWorker : public tnt::Callback {
 public:
  SlowWorker() : tnt::Callback(Ranks::all) {}
  void on_train_batch_end(int64_t batch, const tnt::Logs&) override {
    if (tnt::rank() == 1 && batch == 0) ::usleep(300'000);
  }
};

tnt::History train_with_slow_worker(std::optional<int64_t> staleness) {
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.epochs = 2;
  fit.verbose = 0;
  fit.batch_size = 8;  // 8 steps an epoch
  fit.strategy = tnt::Strategy::parameter_server;
  fit.max_staleness = staleness;
  fit.callbacks = {std::make_shared<SlowWorker>()};
  return model.fit(tnt::test::threshold_data("ps_slow"), fit);
}

}  // namespace

TEST_CASE("ps: max_staleness bounds how far a worker runs ahead of a slow one", "[ps]") {
  // Worker 1 stops after its first push of an epoch, so without a bound worker 0 runs ahead
  // by several updates within the epoch (the epoch's end joins them again).
  const tnt::History free = train_with_slow_worker(std::nullopt);
  INFO("unbounded: staleness_max " << free.last("staleness_max") << ", mean " << free.last("staleness_mean"));
  CHECK(free.last("staleness_max") >= 2);
  const tnt::History bounded = train_with_slow_worker(1);
  INFO("max_staleness 1: staleness_max " << bounded.last("staleness_max"));
  CHECK(bounded.last("staleness_max") <= 1);
  CHECK(bounded.history.at("staleness_max").size() == 2);
  const tnt::History lockstep = train_with_slow_worker(0);
  CHECK(lockstep.last("staleness_max") == 0);
  CHECK(lockstep.last("staleness_mean") == 0);
}

TEST_CASE("ps: max_steps counts the servers' updates, every worker's pushes together", "[ps]") {
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.epochs = 5;
  fit.verbose = 0;
  fit.batch_size = 8;  // 8 steps an epoch on each of 2 workers: 16 updates an epoch
  fit.max_steps = 10;
  fit.strategy = tnt::Strategy::parameter_server;
  tnt::History h = model.fit(tnt::test::threshold_data("ps_steps"), fit);
  // Stopped within the first epoch; a worker sees the count at its pull, so each may push
  // once more after it pulled the 9th: at most one extra push per worker, 12.
  CHECK(h.epochs.size() == 1);
  CHECK(model.global_step() >= 10);
  CHECK(model.global_step() <= 12);
  CHECK(model.optimizer().step_count() == model.global_step());
}

namespace {

// Worker 1 asks to stop after its second step of the epoch; worker 0 goes on.
class StopWorkerOne : public tnt::Callback {
 public:
  StopWorkerOne() : tnt::Callback(Ranks::all) {}
  void on_train_batch_end(int64_t batch, const tnt::Logs&) override {
    if (tnt::rank() == 1 && batch == 1) model_->stop_training();
  }
};

}  // namespace

TEST_CASE("ps: a worker that leaves its epoch early holds no other back; all stop together", "[ps]") {
  // With max_staleness 1, worker 0 would wait forever for worker 1 (which waits for it at
  // the epoch's end) unless the servers stop counting a worker that left its steps.
  auto net = tnt::test::small_mlp();
  tnt::Model model(net, kSeed);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.epochs = 3;
  fit.verbose = 0;
  fit.batch_size = 8;  // 8 steps an epoch on each of 2 workers
  fit.strategy = tnt::Strategy::parameter_server;
  fit.max_staleness = 1;
  fit.callbacks = {std::make_shared<StopWorkerOne>()};
  tnt::History h = model.fit(tnt::test::threshold_data("ps_pause"), fit);
  CHECK(h.epochs.size() == 1);
  CHECK(model.global_step() == 2 + 8);
  CHECK(model.stop_requested());
}

TEST_CASE("ps: learning-rate callbacks on the workers reach the servers", "[ps]") {
  // ReduceLROnPlateau halves the rate after every epoch (no improvement can reach a
  // min_delta of 10), and LearningRateScheduler sets a new constant rate at every epoch's
  // start: with max_staleness 0 the losses must still be synchronous training's.
  auto run = [](tnt::Strategy strategy, std::optional<int64_t> staleness) {
    auto net = tnt::test::small_cnn("small_cnn");
    auto model = make_model(net);
    tnt::FitOptions fit;
    fit.epochs = 4;
    fit.verbose = 0;
    fit.batch_size = kBatch;
    fit.strategy = strategy;
    fit.max_staleness = staleness;
    fit.callbacks = {std::make_shared<tnt::LearningRateScheduler>([](int epoch, double lr) {
                       return epoch == 1 ? lr * 3 : lr;
                     }),
                     std::make_shared<tnt::ReduceLROnPlateau>("loss", 0.5, 0, 10.0)};
    tnt::History h = model->fit(cnn_data(), fit);
    return std::make_pair(h.history.at("loss"), model->learning_rate());
  };
  const auto [sync_loss, sync_lr] = run(tnt::Strategy::synchronous, std::nullopt);
  const auto [ps_loss, ps_lr] = run(tnt::Strategy::parameter_server, 0);
  REQUIRE(sync_loss.size() == ps_loss.size());
  for (size_t e = 0; e < sync_loss.size(); ++e) {
    INFO("epoch " << e << ": synchronous " << sync_loss[e] << ", parameter server " << ps_loss[e]);
    // As in the first case: the order of the gradient's sum, nothing else.
    CHECK(std::abs(sync_loss[e] - ps_loss[e]) <= 1e-5 * std::abs(sync_loss[e]) + 1e-6);
  }
  CHECK(ps_lr == sync_lr);
}

TEST_CASE("Communicator::split: the ranks of one color, in their order, with their own collectives", "[ps]") {
  tnt::Communicator& all = tnt::communicator();
  const int color = all.rank() % 2;
  std::unique_ptr<tnt::Communicator> half = all.split(color);
  // Ranks of my color: color, color + 2, ...
  const int members = (all.size() - color + 1) / 2;
  CHECK(half->size() == members);
  CHECK(half->rank() == all.rank() / 2);
  // Sum of the members' world ranks: exact in doubles.
  double expected = 0;
  for (int r = color; r < all.size(); r += 2) expected += r;
  CHECK(half->allreduce_sum(static_cast<double>(all.rank())) == expected);
  const std::vector<int64_t> ranks = half->allgather(int64_t{all.rank()});
  for (int q = 0; q < members; ++q) CHECK(ranks[static_cast<size_t>(q)] == color + 2 * q);
}
