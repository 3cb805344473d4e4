// A parameter-server job that loses a worker mid-epoch: the program every rank runs.
//
//   test_ps_lost_worker KILL_RANK KILL_BATCH [EPOCHS [MAX_STALENESS]]
//
// World rank KILL_RANK (a worker) kills itself (SIGKILL) after batch KILL_BATCH of the first
// epoch. The model counts the samples it was trained on exactly: sample i is the one-hot
// vector e_i with target 1000, the model a bias-free Dense(1) from zero, the loss the mean
// absolute error and the optimizer SGD with rate 1. While the prediction stays below the
// target, the gradient of weight i is -(number of times sample i is in the global batch) /
// B whatever the other weights are, so staleness does not matter and after the fit
// weight i x B is the number of times sample i was trained on (exact to float rounding of
// k/B sums: tolerance 1e-3 for counts of 1 to 10). Every rank left checks that it is EPOCHS
// for every sample, that the job has one rank fewer, and that evaluate still works (a
// collective over the ranks left). Exits 1 with the miscounted samples named otherwise.
#include "tarantella/tarantella.hpp"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

constexpr int64_t kSamples = 300;  // 10 global batches of 30: 10 per worker each, of 10 samples
constexpr int64_t kBatch = 30;

// The world rank, whatever communicator the runtime works on at the time.
int world_rank() {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  return r ? std::atoi(r) : -1;
}

class KillAt : public tnt::Callback {
 public:
  KillAt(int rank, int64_t batch) : tnt::Callback(Ranks::all), rank_(rank), batch_(batch) {}
  void on_epoch_begin(int epoch, const tnt::Logs&) override { epoch_ = epoch; }
  void on_train_batch_end(int64_t batch, const tnt::Logs&) override {
    if (epoch_ == 0 && batch == batch_ && world_rank() == rank_) {
      std::fprintf(stderr, "test: world rank %d kills itself after batch %lld\n", rank_, static_cast<long long>(batch));
      std::fflush(stderr);
      ::kill(::getpid(), SIGKILL);
    }
  }

 private:
  int rank_;
  int64_t batch_;
  int epoch_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [&] {
    TNT_INPUT_CHECK(argc >= 3, "usage: test_ps_lost_worker KILL_RANK KILL_BATCH [EPOCHS [MAX_STALENESS]]");
    const int kill_rank = std::atoi(argv[1]);
    const int64_t kill_batch = std::atoll(argv[2]);
    const int epochs = argc > 3 ? std::atoi(argv[3]) : 2;
    const int ranks_before = tnt::size();

    tnt::Tensor x = tnt::Tensor::zeros({kSamples, kSamples});
    tnt::Tensor y = tnt::Tensor::empty({kSamples, 1});
    for (int64_t i = 0; i < kSamples; ++i) {
      x.data<float>()[i * kSamples + i] = 1.0f;
      y.data<float>()[i] = 1000.0f;
    }
    const tnt::Dataset data = tnt::Dataset::from_tensors({x, y});

    auto net = std::make_shared<tnt::Sequential>("counter");
    net->add(std::make_shared<tnt::Dense>(1, tnt::DenseOptions{.use_bias = false,
                                                               .kernel_initializer = tnt::Initializer::zeros()},
                                          "count"));
    net->build({kSamples});
    tnt::Model model(net, 1);
    model.compile(std::make_shared<tnt::SGD>(1.0), std::make_shared<tnt::MeanAbsoluteError>(), {});
    tnt::FitOptions fit;
    fit.epochs = epochs;
    fit.batch_size = kBatch;
    fit.verbose = 0;
    fit.strategy = tnt::Strategy::parameter_server;
    if (argc > 4) fit.max_staleness = std::atoll(argv[4]);
    fit.callbacks = {std::make_shared<KillAt>(kill_rank, kill_batch)};
    const tnt::History history = model.fit(data, fit);

    const std::vector<double> w = net->named_parameters().front().param->value.to_double_vector();
    int wrong = 0;
    for (int64_t i = 0; i < kSamples; ++i) {
      const double seen = w[static_cast<size_t>(i)] * kBatch;
      if (std::abs(seen - epochs) > 1e-3) {
        if (++wrong <= 10) std::fprintf(stderr, "rank %d: sample %lld trained on %.3f times, not %d\n", tnt::rank(),
                                        static_cast<long long>(i), seen, epochs);
      }
    }
    tnt::EvaluateOptions evaluate;
    evaluate.batch_size = kBatch;
    const tnt::Logs eval = model.evaluate(data, evaluate);
    if (tnt::size() != ranks_before - 1) {
      std::fprintf(stderr, "rank %d: the job has %d ranks after the fit, not %d\n", tnt::rank(), tnt::size(),
                   ranks_before - 1);
      ++wrong;
    }
    if (history.history.count("loss") == 0 || history.history.at("loss").size() != static_cast<size_t>(epochs)) {
      std::fprintf(stderr, "rank %d: the history has no loss for each of the %d epochs\n", tnt::rank(), epochs);
      ++wrong;
    }
    if (wrong > 10) std::fprintf(stderr, "rank %d: %d samples miscounted in all\n", tnt::rank(), wrong);
    if (wrong > 0) std::exit(1);
    if (tnt::is_master_rank()) {
      std::printf("every one of %lld samples trained on %d times in %d epochs; %d ranks left; evaluate loss %.1f\n",
                  static_cast<long long>(kSamples), epochs, epochs, tnt::size(), eval.at("loss"));
    }
  });
}
