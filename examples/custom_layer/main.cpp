// Trains Dense(16) -> ScaledTanh -> Dense(1) on a made-up regression problem with a custom
// loss (log-cosh) and a custom metric (the fraction of predictions within 0.1 of the
// target), data-parallel on however many ranks it is started with:
//   tarantella -n 2 -- ./custom_layer OUT_DIR
// The master creates OUT_DIR if needed and writes OUT_DIR/weights.safetensors and OUT_DIR/predictions.txt (the model's
// output on the first 16 samples, one per line), which read_checkpoint.py checks against
// a PyTorch model loaded from the checkpoint.
#include "scaled_tanh.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace {

// log(cosh(p - t)) per sample, summed, divided by global_batch (the contract of every loss:
// Model passes the global number of real samples in training, so p ranks equal one rank;
// evaluate passes 1 and divides the global sum itself). This one computes on the host; a
// loss on a hot path of a GPU model would get a CUDA engine like the layer.
class LogCosh : public tnt::Loss {
 public:
  std::string name() const override { return "log_cosh"; }
  tnt::Tensor forward(const tnt::Tensor& pred, const tnt::Tensor& target, int64_t global_batch,
                      tnt::SavedState& saved) override {
    TNT_INPUT_CHECK(pred.numel() == target.numel(), "log_cosh: {} predictions for {} targets", pred.numel(),
                    target.numel());
    const tnt::Tensor p = pred.to(tnt::Device::cpu()), t = target.to(tnt::Device::cpu());
    const int64_t n = global_batch > 0 ? global_batch : pred.dim(0);
    double sum = 0;
    for (int64_t i = 0; i < p.numel(); ++i) sum += std::log(std::cosh(p.data<float>()[i] - t.data<float>()[i]));
    saved.tensors = {p, t, pred};  // pred: only to know its device in backward
    saved.extra = std::make_shared<int64_t>(n);
    return tnt::Tensor::full({1}, sum / static_cast<double>(n)).to(pred.device());
  }
  tnt::Tensor backward(tnt::SavedState& saved, double scale) override {
    const tnt::Tensor &p = saved.tensors[0], &t = saved.tensors[1];
    const double n = static_cast<double>(*std::static_pointer_cast<int64_t>(saved.extra));
    tnt::Tensor grad = tnt::Tensor::empty(p.shape());
    for (int64_t i = 0; i < p.numel(); ++i)  // d/dp log cosh(p - t) = tanh(p - t)
      grad.data<float>()[i] = static_cast<float>(std::tanh(p.data<float>()[i] - t.data<float>()[i]) * scale / n);
    return grad.to(saved.tensors[2].device());
  }
};

// Metrics keep two sums, total and count; the runtime allreduces both over the ranks, so
// result() = total / count is the global value on every rank. update() sees real samples
// only (never the padding of a last partial batch).
class WithinTenth : public tnt::Metric {
 public:
  std::string name() const override { return "within_0.1"; }
  void update(const tnt::Tensor& pred, const tnt::Tensor& target) override {
    const tnt::Tensor p = pred.to(tnt::Device::cpu()), t = target.to(tnt::Device::cpu());
    for (int64_t i = 0; i < p.numel(); ++i) total_ += std::fabs(p.data<float>()[i] - t.data<float>()[i]) < 0.1f;
    count_ += static_cast<double>(p.numel());
  }
};

}  // namespace

int main(int argc, char** argv) {
  return tnt::run_main(argc, argv, [&] {
    TNT_INPUT_CHECK(argc == 2, "usage: custom_layer OUT_DIR");
    const std::string out = argv[1];
    // The master writes the files, so it makes OUT_DIR (and its parents), before training
    // rather than failing after it; every rank learns whether that worked.
    std::string problem;
    if (tnt::is_master_rank()) {
      std::error_code ec;
      if (std::filesystem::exists(out, ec) && !std::filesystem::is_directory(out, ec)) {
        problem = fmt::format("OUT_DIR {}: is a file, expected a directory", out);
      } else if (std::filesystem::create_directories(out, ec); ec) {
        problem = fmt::format("OUT_DIR {}: cannot create it: {}", out, ec.message());
      }
    }
    tnt::communicator().broadcast(problem, tnt::master_rank());
    if (!problem.empty()) throw tnt::InputError(problem);

    // y = 0.8 tanh(x0 - 0.5 x1 + 0.25 x2), x on a grid: learnable by the model exactly.
    const int64_t n = 512;
    std::vector<float> x(n * 3), y(n);
    for (int64_t i = 0; i < n; ++i) {
      for (int k = 0; k < 3; ++k) x[i * 3 + k] = std::sin(0.37f * static_cast<float>(i * (k + 1)));
      y[i] = 0.8f * std::tanh(x[i * 3] - 0.5f * x[i * 3 + 1] + 0.25f * x[i * 3 + 2]);
    }
    tnt::Tensor xs = tnt::Tensor::from_vector(x, {n, 3}), ys = tnt::Tensor::from_vector(y, {n, 1});

    auto net = std::make_shared<tnt::Sequential>("net");
    net->add(std::make_shared<tnt::Dense>(16, "fc1"));
    net->add(std::make_shared<ScaledTanh>("act"));
    net->add(std::make_shared<tnt::Dense>(1, "fc2"));
    net->build({3});

    tnt::Model model(net, /*seed=*/7);
    model.compile(std::make_shared<tnt::Adam>(1e-2), std::make_shared<LogCosh>(),
                  {std::make_shared<WithinTenth>()});
    tnt::FitOptions fit;
    fit.batch_size = 64;  // global: the same training on any number of ranks
    fit.epochs = 30;
    fit.verbose = 0;
    tnt::History history = model.fit(tnt::Dataset::from_tensors({xs, ys}).shuffle(n, 1), fit);

    model.save_weights(out + "/weights.safetensors");  // collective: every rank calls it
    tnt::Tensor pred = model.predict(tnt::Dataset::from_tensors({xs.slice_rows(0, 16)}), 16);
    if (tnt::is_master_rank()) {
      std::ofstream f(out + "/predictions.txt");
      for (float v : pred.to_vector()) f << fmt::format("{:.9g}\n", v);
      tnt::print("ranks {}: final loss {:.5f}, within_0.1 {:.3f}", tnt::size(), history.last("loss"),
                 history.last("within_0.1"));
    }
  });
}
