// Samples per second of one training step (forward, loss, backward, Adam) of the
// Fashion-MNIST CNN on the CPU, on synthetic data. scripts/bench/train_step runs it beside
// the same model in PyTorch (scripts/bench/train_step_torch.py) with equal threads.
//
//   tnt_train_step_bench [--batch 128] [--steps 50] [--warmup 5] [--seed 1]
//
// Threads: TNT_NUM_THREADS (default: the cores of the affinity mask). The last line is
// machine-readable: "RESULT framework=tarantella threads=T batch=B steps=S ms_per_step=X
// samples_per_s=Y".
#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/log.hpp"
#include "tarantella/optim.hpp"
#include "tarantella/runtime.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct Args {
  int64_t batch = 128;
  int64_t steps = 50;
  int64_t warmup = 5;
  uint64_t seed = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) throw tnt::InputError(fmt::format("{} needs a value", flag));
      const std::string v = argv[++i];
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 0) {
        throw tnt::InputError(fmt::format("{}: '{}' is not a non-negative integer", flag, v));
      }
      return n;
    };
    if (flag == "--batch") a.batch = value();
    else if (flag == "--steps") a.steps = value();
    else if (flag == "--warmup") a.warmup = value();
    else if (flag == "--seed") a.seed = static_cast<uint64_t>(value());
    else throw tnt::InputError(fmt::format("unknown flag '{}' (flags: --batch --steps --warmup --seed)", flag));
  }
  if (a.batch < 1 || a.steps < 1) throw tnt::InputError("--batch and --steps must be >= 1");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [&] {
    using namespace tnt;
    const Args args = parse(argc, argv);
    const int64_t B = args.batch;

    // PyTorch's nn.Sequential of the same layers (so parameter names match: 0.weight, ...).
    Conv2DOptions pad1;
    pad1.padding = 1;
    Sequential net({std::make_shared<Conv2D>(32, 3, pad1), std::make_shared<ReLU>(),
                    std::make_shared<MaxPool2D>(2), std::make_shared<Conv2D>(64, 3, pad1),
                    std::make_shared<ReLU>(), std::make_shared<MaxPool2D>(2),
                    std::make_shared<Flatten>(), std::make_shared<Dense>(128), std::make_shared<ReLU>(),
                    std::make_shared<Dense>(10)},
                   "fashion_mnist_cnn");
    net.build({1, 28, 28});
    net.initialize(args.seed);
    // The images need no gradient: PyTorch's step (train_step_torch.py) computes none for
    // them, and a Model does not either (its network starts with input gradients off).
    net.set_input_gradients(false);
    SoftmaxCrossEntropy loss_fn;
    Adam adam(1e-3);

    // Synthetic batch: pixels in [0, 1), labels 0..9.
    Tensor x = Tensor::empty({B, 1, 28, 28});  // (N, C, H, W)
    Tensor y = Tensor::empty({B}, DType::i64);  // (N,)
    CounterRng rng(args.seed, "bench.data");
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.uniform(static_cast<uint64_t>(i));
    for (int64_t i = 0; i < B; ++i) y.data<int64_t>()[i] = i % 10;

    RunContext rc;
    rc.training = true;
    double last_loss = 0;
    auto train_step = [&] {
      net.zero_grad();
      Tensor logits = net.forward({x}, rc)[0];  // (N, 10)
      SavedState loss_state;
      last_loss = Loss::value(loss_fn.forward(logits, y, 0, loss_state));
      net.backward({loss_fn.backward(loss_state)}, rc);
      adam.step(net.trainable_parameters());
      ++rc.step;
    };
    for (int64_t s = 0; s < args.warmup; ++s) train_step();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < args.steps; ++s) train_step();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    const double ms = 1e3 * seconds / static_cast<double>(args.steps);
    const double sps = static_cast<double>(B * args.steps) / seconds;
    print("{}", net.summary());
    print("loss after {} steps: {:.4f}", args.warmup + args.steps, last_loss);
    print("RESULT framework=tarantella threads={} batch={} steps={} ms_per_step={:.3f} samples_per_s={:.1f}",
          num_threads(), B, args.steps, ms, sps);
  });
}
