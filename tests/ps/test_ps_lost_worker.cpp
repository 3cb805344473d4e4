// A parameter-server job that loses a worker mid-epoch: the program every rank runs.
//
//   test_ps_lost_worker KILL_RANK KILL_BATCH [EPOCHS [MAX_STALENESS [WHERE]]]
//
// World rank KILL_RANK (a worker) kills itself (SIGKILL) after batch KILL_BATCH of the first
// epoch (WHERE train, the default; MAX_STALENESS "-" leaves it unbounded), or, with WHERE
// validation or last_validation, after validation batch KILL_BATCH of the first or the last
// epoch: the fit validates every epoch on the training samples with target i for sample i,
// and the other workers are then in the validation's collectives. The last epoch's val_loss
// must be the mean of |w_i - i| over every sample: the workers left split the validation
// set again (their first split would leave out the lost worker's part). With validation the fit must end within 40 s, far below
// the TNT_COLLECTIVE_TIMEOUT (120 s in tests/ps/CMakeLists.txt) that the workers left would
// wait for without the loss being found (about TNT_PS_WORKER_TIMEOUT, 2 s, in those tests).
// WHERE callback: it dies in the first epoch's on_epoch_end, where the other workers run a
// collective of their own (as a checkpoint callback might); the fit cannot redo that, and
// must end on every rank at once, naming the lost rank (the test passes on that message).
// WHERE stop or stop_validation: as train or validation, but the worker stops (SIGSTOP)
// instead, and nobody resumes it: the first server, on its host, must end it (mpirun waits
// for every process), so the job ends as soon as the others are done. The model counts the samples it was trained on exactly: sample i is the one-hot
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

#include <chrono>
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
  // validation_epoch: -1 kills in the first epoch's training, else in that epoch's validation.
  KillAt(int rank, int64_t batch, int validation_epoch, bool in_callback, int signal)
      : tnt::Callback(Ranks::all), rank_(rank), batch_(batch), validation_epoch_(validation_epoch),
        in_callback_(in_callback), signal_(signal) {}
  void on_epoch_begin(int epoch, const tnt::Logs&) override { epoch_ = epoch; }
  void on_epoch_end(int epoch, const tnt::Logs&) override {
    if (!in_callback_ || epoch != 0) return;
    die("in on_epoch_end");
    tnt::communicator().allreduce_sum(1.0);
  }
  void on_train_batch_end(int64_t batch, const tnt::Logs&) override {
    if (validation_epoch_ < 0 && !in_callback_ && epoch_ == 0 && batch == batch_) die("after batch " + std::to_string(batch));
  }
  void on_test_batch_end(int64_t batch, const tnt::Logs&) override {
    if (validation_epoch_ == epoch_ && batch == batch_) die("after validation batch " + std::to_string(batch));
  }

 private:
  void die(const std::string& when) const {
    if (world_rank() != rank_) return;
    std::fprintf(stderr, "test: world rank %d %s itself %s of epoch %d\n", rank_,
                 signal_ == SIGSTOP ? "stops" : "kills", when.c_str(), epoch_);
    std::fflush(stderr);
    ::kill(::getpid(), signal_);
  }

  int rank_;
  int64_t batch_;
  int validation_epoch_;
  bool in_callback_;
  int signal_;
  int epoch_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [&] {
    TNT_INPUT_CHECK(argc >= 3, "usage: test_ps_lost_worker KILL_RANK KILL_BATCH [EPOCHS [MAX_STALENESS [WHERE]]]");
    const int kill_rank = std::atoi(argv[1]);
    const int64_t kill_batch = std::atoll(argv[2]);
    const int epochs = argc > 3 ? std::atoi(argv[3]) : 2;
    std::string where = argc > 5 ? argv[5] : "train";
    const int signal = where.rfind("stop", 0) == 0 ? SIGSTOP : SIGKILL;
    if (where == "stop") where = "train";
    if (where == "stop_validation") where = "validation";
    TNT_INPUT_CHECK(where == "train" || where == "validation" || where == "last_validation" || where == "callback",
                    "test_ps_lost_worker: WHERE='{}' is not train, validation, last_validation or callback", where);
    const int validation_epoch = where == "validation" ? 0 : where == "last_validation" ? epochs - 1 : -1;
    const int ranks_before = tnt::size();

    tnt::Tensor x = tnt::Tensor::zeros({kSamples, kSamples});
    tnt::Tensor y = tnt::Tensor::empty({kSamples, 1});
    for (int64_t i = 0; i < kSamples; ++i) {
      x.data<float>()[i * kSamples + i] = 1.0f;
      y.data<float>()[i] = 1000.0f;
    }
    const tnt::Dataset data = tnt::Dataset::from_tensors({x, y});
    tnt::Tensor y_val = tnt::Tensor::empty({kSamples, 1});
    for (int64_t i = 0; i < kSamples; ++i) y_val.data<float>()[i] = static_cast<float>(i);
    const tnt::Dataset validation_data = tnt::Dataset::from_tensors({x, y_val});

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
    if (argc > 4 && std::string(argv[4]) != "-") fit.max_staleness = std::atoll(argv[4]);
    if (validation_epoch >= 0) fit.validation_data = validation_data;
    fit.callbacks = {std::make_shared<KillAt>(kill_rank, kill_batch, validation_epoch, where == "callback", signal)};
    const auto start = std::chrono::steady_clock::now();
    const tnt::History history = model.fit(data, fit);
    const double fit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

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
    if (validation_epoch >= 0 &&
        (history.history.count("val_loss") == 0 || history.history.at("val_loss").size() != static_cast<size_t>(epochs))) {
      std::fprintf(stderr, "rank %d: the history has no val_loss for each of the %d epochs\n", tnt::rank(), epochs);
      ++wrong;
    }
    if (validation_epoch >= 0 && history.history.count("val_loss") != 0) {
      double want = 0;  // the whole validation set's mean absolute error at the final weights
      for (int64_t i = 0; i < kSamples; ++i) want += std::abs(w[static_cast<size_t>(i)] - static_cast<double>(i));
      want /= static_cast<double>(kSamples);
      const double got = history.history.at("val_loss").back();
      // Float sums of kSamples terms below kSamples: 1e-4 relative is far below a part's
      // absence (it moves the mean by several units).
      if (std::abs(got - want) > 1e-4 * want) {
        std::fprintf(stderr, "rank %d: the last val_loss is %.6f, not %.6f (the mean over every sample)\n", tnt::rank(),
                     got, want);
        ++wrong;
      }
    }
    if (validation_epoch >= 0 && fit_s > 40) {
      std::fprintf(stderr, "rank %d: the fit took %.1f s, not under 40 s: the lost worker was not found in time\n",
                   tnt::rank(), fit_s);
      ++wrong;
    }
    if (wrong > 10) std::fprintf(stderr, "rank %d: %d samples miscounted in all\n", tnt::rank(), wrong);
    if (wrong > 0) std::exit(1);
    if (tnt::is_master_rank()) {
      std::printf("every one of %lld samples trained on %d times in %d epochs; %d ranks left; evaluate loss %.1f; "
                  "fit %.1f s\n",
                  static_cast<long long>(kSamples), epochs, epochs, tnt::size(), eval.at("loss"), fit_s);
    }
  });
}
