// Times forward + backward + an Adam update of the Fashion-MNIST CNN on the CPU engines:
// Conv2d(1,32,3,p1)+ReLU+MaxPool2, Conv2d(32,64,3,p1)+ReLU+MaxPool2, Flatten,
// Linear(3136,128)+ReLU, Linear(128,10), softmax cross-entropy. bench_cnn_step_torch.py
// runs the same step in PyTorch for comparison. Threads: TNT_NUM_THREADS (the script takes
// --threads). Prints one line: batch, threads, steps, ms_per_step, per-layer split.
//   build/bin/bench_cnn_step [batch=128] [steps=30]
#include "tarantella/layers.hpp"
#include "tarantella/runtime.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

using namespace tnt;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  return run_main(argc, argv, [&] {
    const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 128;
    const int steps = argc > 2 ? std::atoi(argv[2]) : 30;
    std::vector<LayerPtr> net{std::make_shared<Conv2D>(32, 3, Conv2DOptions{.padding = 1}, "conv1"),
                              std::make_shared<ReLU>("relu1"),
                              std::make_shared<MaxPool2D>(2, "pool1"),
                              std::make_shared<Conv2D>(64, 3, Conv2DOptions{.padding = 1}, "conv2"),
                              std::make_shared<ReLU>("relu2"),
                              std::make_shared<MaxPool2D>(2, "pool2"),
                              std::make_shared<Flatten>("flatten"),
                              std::make_shared<Dense>(128, DenseOptions{}, "fc1"),
                              std::make_shared<ReLU>("relu3"),
                              std::make_shared<Dense>(10, DenseOptions{}, "fc2")};
    Tensor x = Tensor::empty({batch, 1, 28, 28});
    Tensor labels = Tensor::empty({batch}, DType::i64);
    CounterRng rng(1, "data");
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.uniform(i);
    for (int64_t i = 0; i < batch; ++i) labels.data<int64_t>()[i] = rng.bits(1000000 + i) % 10;
    SoftmaxCrossEntropy loss;
    RunContext rc;
    rc.training = true;

    // Adam state per parameter, as a plain loop (the optimizer proper lives in optim/).
    std::map<Parameter*, std::pair<Tensor, Tensor>> adam;
    std::map<std::string, double> layer_ms;
    double loss_value = 0;
    auto step = [&](int t, bool timed) {
      std::vector<SavedState> saved(net.size());
      saved[0].need_input_grads = false;  // the images need no gradient (PyTorch skips it too)
      Tensor h = x;
      for (size_t i = 0; i < net.size(); ++i) {
        auto t0 = Clock::now();
        h = net[i]->forward({h}, rc, saved[i])[0];
        if (timed) layer_ms[net[i]->name() + ".fwd"] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      }
      SavedState ls;
      loss_value = Loss::value(loss.forward(h, labels, batch, ls));
      Tensor g = loss.backward(ls);
      for (size_t i = net.size(); i-- > 0;) {
        auto t0 = Clock::now();
        g = net[i]->backward({g}, rc, saved[i])[0];
        if (timed) layer_ms[net[i]->name() + ".bwd"] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      }
      auto t0 = Clock::now();
      const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
      const float c1 = 1 - std::pow(b1, static_cast<float>(t)), c2 = 1 - std::pow(b2, static_cast<float>(t));
      for (auto& layer : net) {
        for (Parameter* p : layer->parameters()) {
          auto& [m, v] = adam[p];
          if (!m.defined()) {
            m = Tensor::zeros(p->value.shape());
            v = Tensor::zeros(p->value.shape());
          }
          float* w = p->value.data<float>();
          float* gr = p->grad.data<float>();
          float* ms = m.data<float>();
          float* vs = v.data<float>();
          const int64_t n = p->value.numel();
#pragma omp parallel for simd if (n > 32768)
          for (int64_t i = 0; i < n; ++i) {
            ms[i] = b1 * ms[i] + (1 - b1) * gr[i];
            vs[i] = b2 * vs[i] + (1 - b2) * gr[i] * gr[i];
            w[i] -= lr / c1 * ms[i] / (std::sqrt(vs[i] / c2) + eps);
            gr[i] = 0;
          }
        }
      }
      if (timed) layer_ms["adam"] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    for (int t = 1; t <= 3; ++t) step(t, false);
    auto t0 = Clock::now();
    for (int t = 4; t < 4 + steps; ++t) step(t, true);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
    std::printf("batch=%lld threads=%d steps=%d ms_per_step=%.2f loss=%.4f\n", static_cast<long long>(batch),
                num_threads(), steps, ms, loss_value);
    for (auto& [k, v] : layer_ms) std::printf("  %-12s %8.3f ms\n", k.c_str(), v / steps);
  });
}
