// A program built outside the tarantella tree against an installed libtarantella
// (tests/install/install_consumer.sh builds it with CMake and with pkg-config). On every
// rank it prints two lines the test checks:
//   allreduce rank R of P: ok            an exact sum over the ranks
//   fit rank R of P: loss L1 L2          the global loss of epochs 1 and 2 of a tiny fit
// The fit is data parallel over a global batch of 8 (one step an epoch), so L1 and L2 are
// the same on 1 rank and on 2; L2 depends on the allreduced gradient of the first step.
#include <tarantella/tarantella.hpp>

#include <cstdio>
#include <memory>
#include <vector>

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [] {
    const int r = tnt::rank();
    const int p = tnt::size();

    // Rank r contributes (r + 1) * i; the sum is p (p + 1) / 2 * i, exact in f32.
    std::vector<float> values(7);
    for (int i = 0; i < 7; ++i) values[i] = static_cast<float>((r + 1) * i);
    tnt::Tensor t = tnt::Tensor::from_vector(values, {7});
    tnt::communicator().allreduce(t);
    bool ok = true;
    std::vector<float> sum = t.to_vector();
    for (int i = 0; i < 7; ++i) ok = ok && sum[i] == static_cast<float>(p * (p + 1) / 2 * i);
    std::printf("allreduce rank %d of %d: %s\n", r, p, ok ? "ok" : "WRONG");
    std::fflush(stdout);

    // y = 2 x0 - x1 + 0.5 x2 + 0.25 on 8 samples; Dense(1), mean squared error, SGD.
    std::vector<float> x(8 * 3), y(8);
    for (int n = 0; n < 8; ++n) {
      x[n * 3 + 0] = 0.125f * n;  // (N, 3)
      x[n * 3 + 1] = 1.0f - 0.25f * n;
      x[n * 3 + 2] = (n % 3) - 1.0f;
      y[n] = 2 * x[n * 3 + 0] - x[n * 3 + 1] + 0.5f * x[n * 3 + 2] + 0.25f;  // (N, 1)
    }
    auto net = std::make_shared<tnt::Sequential>("consumer");
    net->add(std::make_shared<tnt::Dense>(1, "fc"));
    net->build({3});
    tnt::Model model(net, /*seed=*/7);
    model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::MeanSquaredError>());
    tnt::FitOptions fit;
    fit.batch_size = 8;  // global
    fit.epochs = 2;
    fit.verbose = 0;
    auto data = tnt::Dataset::from_tensors({tnt::Tensor::from_vector(x, {8, 3}), tnt::Tensor::from_vector(y, {8, 1})});
    tnt::History history = model.fit(data, fit);
    const auto& loss = history.history.at("loss");
    TNT_CHECK(loss.size() == 2, "expected 2 epochs of loss, got {}", loss.size());
    std::printf("fit rank %d of %d: loss %.9g %.9g\n", r, p, loss[0], loss[1]);
    std::fflush(stdout);
  });
}
