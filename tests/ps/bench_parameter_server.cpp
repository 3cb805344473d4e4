// Training throughput of one strategy, for scripts/bench/parameter_server: an MLP on
// synthetic data, optionally with one trainer slowed to half speed (it sleeps after every
// step as long as the step took). Prints one CSV row from the first trainer:
//   strategy,max_staleness,trainers,slow_trainer,steps,samples,samples_per_s
// samples_per_s: the sum over trainers of the samples each trained after its warm-up steps
// divided by the time it took them (from the end of its last warm-up step to the end of its
// last step), so that a trainer waiting at the end for the others is not counted.
//
//   tnt_ps_bench --strategy=synchronous|parameter_server [--max_staleness=N] [--steps=S]
//                [--batch=B] [--slow_trainer=K] [--warmup=W] [--features=F] [--hidden=H]
// --steps: global batches of B samples the job trains (parameter_server: S x trainers pushes
// of B / trainers samples, the same samples); --slow_trainer: the trainer (0-based among the
// trainers) to slow down, -1 none.
#include "tarantella/tarantella.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Args {
  std::string strategy = "synchronous";
  int64_t max_staleness = -1;
  int64_t steps = 60;
  int64_t batch = 96;
  int slow_trainer = -1;
  int64_t warmup = 5;
  int64_t features = 256;
  int64_t hidden = 512;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    TNT_INPUT_CHECK(arg.rfind("--", 0) == 0 && eq != std::string::npos, "{}: expected --name=value", arg);
    const std::string name = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    if (name == "strategy") {
      a.strategy = value;
    } else if (name == "max_staleness") {
      a.max_staleness = std::stoll(value);
    } else if (name == "steps") {
      a.steps = std::stoll(value);
    } else if (name == "batch") {
      a.batch = std::stoll(value);
    } else if (name == "slow_trainer") {
      a.slow_trainer = std::stoi(value);
    } else if (name == "warmup") {
      a.warmup = std::stoll(value);
    } else if (name == "features") {
      a.features = std::stoll(value);
    } else if (name == "hidden") {
      a.hidden = std::stoll(value);
    } else {
      TNT_INPUT_ERROR("{}: no such flag", arg);
    }
  }
  TNT_INPUT_CHECK(a.steps > 0 && a.batch > 0 && a.warmup >= 0, "--steps, --batch must be positive, --warmup >= 0");
  return a;
}

// On every trainer: the slowing, and the throughput window.
class Meter : public tnt::Callback {
 public:
  Meter(int slow, int64_t warmup) : tnt::Callback(Ranks::all), slow_(slow), warmup_(warmup) {}
  void on_train_batch_begin(int64_t, const tnt::Logs&) override { step_start_ = now_s(); }
  void on_train_batch_end(int64_t, const tnt::Logs&) override {
    if (tnt::rank() == slow_) std::this_thread::sleep_for(std::chrono::duration<double>(now_s() - step_start_));
    ++steps_;
    if (steps_ == warmup_) start_ = now_s();
    end_ = now_s();
  }
  // Collective over the trainers (the fit's communicator).
  double samples_per_s(int64_t micro_batch) const {
    const double samples = static_cast<double>(std::max<int64_t>(0, steps_ - warmup_) * micro_batch);
    const double rate = end_ > start_ && start_ > 0 ? samples / (end_ - start_) : 0.0;
    return tnt::communicator().allreduce_sum(rate);
  }
  void on_train_end(const tnt::Logs&) override { trainers_ = tnt::size(); }
  int64_t steps() const { return steps_; }
  int trainers() const { return trainers_; }

 private:
  int slow_;
  int64_t warmup_;
  double step_start_ = 0, start_ = 0, end_ = 0;
  int64_t steps_ = 0;
  int trainers_ = 0;
};

// Reports at the end of the fit, while the fit's communicator (the trainers') is current.
class Report : public tnt::Callback {
 public:
  Report(std::shared_ptr<Meter> meter, Args args) : tnt::Callback(Ranks::all), meter_(std::move(meter)), args_(args) {}
  void on_train_end(const tnt::Logs&) override {
    const int trainers = tnt::size();
    const double rate = meter_->samples_per_s(args_.batch / trainers);
    const double steps = tnt::communicator().allreduce_sum(static_cast<double>(meter_->steps()));
    if (tnt::rank() == 0) {
      std::printf("%s,%s,%d,%d,%.0f,%.0f,%.1f\n", args_.strategy.c_str(),
                  args_.max_staleness < 0 ? "none" : std::to_string(args_.max_staleness).c_str(), trainers,
                  args_.slow_trainer, steps, steps * static_cast<double>(args_.batch / trainers), rate);
      std::fflush(stdout);
    }
  }

 private:
  std::shared_ptr<Meter> meter_;
  Args args_;
};

}  // namespace

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [&] {
    const Args a = parse(argc, argv);
    const tnt::Strategy strategy = tnt::parse_strategy(a.strategy);
    // Twice the samples the run trains: no trainer runs out of its part of the epoch first.
    const int64_t n = 2 * a.batch * a.steps;
    tnt::Tensor x = tnt::Tensor::empty({n, a.features});  // (N, F)
    tnt::Tensor y = tnt::Tensor::empty({n}, tnt::DType::i64);
    tnt::CounterRng rng(3, "tnt_ps_bench");
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
    for (int64_t i = 0; i < n; ++i) y.data<int64_t>()[i] = i % 10;
    auto net = std::make_shared<tnt::Sequential>("mlp");
    net->add(std::make_shared<tnt::Dense>(a.hidden, "fc1"));
    net->add(std::make_shared<tnt::ReLU>("relu1"));
    net->add(std::make_shared<tnt::Dense>(a.hidden, "fc2"));
    net->add(std::make_shared<tnt::ReLU>("relu2"));
    net->add(std::make_shared<tnt::Dense>(10, "fc3"));
    net->build({a.features});
    tnt::Model model(net, 1);
    model.compile(std::make_shared<tnt::SGD>(0.01), std::make_shared<tnt::SoftmaxCrossEntropy>());
    auto meter = std::make_shared<Meter>(a.slow_trainer, a.warmup);
    tnt::FitOptions fit;
    fit.epochs = 1;
    fit.verbose = 0;
    fit.batch_size = a.batch;
    fit.strategy = strategy;
    if (a.max_staleness >= 0) fit.max_staleness = a.max_staleness;
    fit.callbacks = {meter, std::make_shared<Report>(meter, a)};
    // The same samples either way: a parameter-server update is one trainer's share.
    fit.max_steps = a.steps;
    if (strategy == tnt::Strategy::parameter_server) {
      // Trainers = ranks - servers; the servers are TNT_PS_SERVERS' (rank 0 when unset).
      const std::string servers = tnt::config().ps_servers;
      const int k = servers.empty() ? 1 : 1 + static_cast<int>(std::count(servers.begin(), servers.end(), ','));
      fit.max_steps = a.steps * (tnt::size() - k);
    }
    model.fit(tnt::Dataset::from_tensors({x, y}), fit);
  });
}
