// The CUDA engines of the element-wise losses (binary cross-entropy, mean absolute error,
// Huber, mean squared error) and of sample-weighted softmax cross-entropy against the CPU
// engines on the same random inputs. Each tolerance says why it has its size.
#include "gpu_test_util.hpp"

#include "tarantella/layers.hpp"
#include "tarantella/runtime.hpp"

#include <memory>
#include <string>

using namespace tnt;
using tnt::test::gpu;
using tnt::test::kUnitFp32;
using tnt::test::require_close;
using tnt::test::require_equal;

namespace {

Tensor weights_tensor(std::vector<float> w) { return Tensor::from_vector(w, {static_cast<int64_t>(w.size())}); }

struct Pair {
  Tensor cpu, gpu;
};

// forward_weighted (weights undefined: none) and backward with scale 3 on both engines.
std::pair<Pair, Pair> run_both(Loss& loss, const Tensor& p, const Tensor& t, const Tensor& w, int64_t global_batch) {
  SavedState sa, sb;
  Tensor la = loss.forward_weighted(p, t, w, global_batch, sa);
  Tensor lb = loss.forward_weighted(p.to(gpu()), t.to(gpu()), w.defined() ? w.to(gpu()) : Tensor(), global_batch, sb);
  REQUIRE(lb.device() == gpu());
  REQUIRE(lb.numel() == 1);
  Tensor ga = loss.backward(sa, 3.0);
  Tensor gb = loss.backward(sb, 3.0);
  REQUIRE(gb.device() == gpu());
  return {{la, lb}, {ga, gb}};
}

}  // namespace

TEST_CASE("element-wise losses: CUDA engines match the CPU engines, with and without weights", "[gpu][losses]") {
  const Tensor p = test::random_tensor({7, 5}, "pw_cuda_p", -6.0f, 6.0f);
  const Tensor t = test::random_tensor({7, 5}, "pw_cuda_t", -2.0f, 2.0f);
  const Tensor probs = test::random_tensor({7, 5}, "pw_cuda_probs", 0.0f, 1.0f);
  const Tensor w = weights_tensor({0.5f, 0.0f, 2.0f, 1.0f, 3.25f, 0.125f, 1.5f});
  MeanSquaredError mse;
  MeanAbsoluteError mae;
  Huber huber(0.7);
  BinaryCrossEntropy bce;
  for (bool weighted : {false, true}) {
    for (Loss* loss : std::vector<Loss*>{&mse, &mae, &huber, &bce}) {
      INFO(loss->name() << (weighted ? " weighted" : ""));
      const Tensor& target = loss == &bce ? probs : t;
      auto [value, grad] = run_both(*loss, p, target, weighted ? w : Tensor(), 9);
      // The same rule (pointwise_rules.hpp) per element in double, the per-element values
      // summed in double in another order (CPU: one loop; CUDA: block trees), then rounded
      // to float once: 2^-24 relative from the rounding, with a factor 4 of room for the
      // double exp/log1p of the device, which may differ from the host's in the last bit.
      require_close(value.gpu, value.cpu, 0, 4 * kUnitFp32, "loss");
      if (loss == &bce) {
        // sigmoid(x) - t in double, rounded to float: a last-bit difference of exp can move
        // it by one float rounding (2^-24 relative); then the same float products.
        require_close(grad.gpu, grad.cpu, 1e-12, 2 * kUnitFp32, "grad");
      } else {
        // The float slope, weight and scale products are the same operations on both sides.
        require_equal(grad.gpu, grad.cpu, "grad");
      }
    }
  }
}

TEST_CASE("binary cross-entropy on CUDA is finite for large logits and rejects bad targets", "[gpu][losses]") {
  BinaryCrossEntropy bce;
  Tensor x = Tensor::from_vector({1000, -1000, 1000, -1000, 100, 1e30f}, {6});
  Tensor t = Tensor::from_vector({0, 1, 1, 0, 0.5f, 0.25f}, {6});
  auto [value, grad] = run_both(bce, x, t, Tensor(), 6);
  // Exact terms (1000, 0, 50, 0.75e30) summed in double: the same f32 result on both.
  require_close(value.gpu, value.cpu, 0, 2 * kUnitFp32, "loss");
  require_equal(grad.gpu, grad.cpu, "grad");  // +-1, 0, 0.5, 0.75 times 3/6: exact

  Tensor bad = Tensor::from_vector({0, 1, 0.5f, 1.5f, 0, 0}, {2, 3}).to(gpu());
  SavedState s;
  try {
    bce.forward(Tensor::zeros({2, 3}).to(gpu()), bad, 2, s);
    FAIL("target 1.5 was accepted");
  } catch (const InputError& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("target 1.5 of sample 1") != std::string::npos);
  }
}

TEST_CASE("softmax cross-entropy with sample weights: CUDA engine matches the CPU engine", "[gpu][losses]") {
  SoftmaxCrossEntropy loss;
  // (N, K) and (N, T, K): a sample's weight applies to each of its T rows.
  Tensor logits = test::random_tensor({6, 11}, "wxent_logits", -5.0f, 5.0f);
  Tensor labels = test::random_labels(6, 11, "wxent_labels");
  Tensor seq = test::random_tensor({3, 2, 11}, "wxent_seq", -5.0f, 5.0f);
  Tensor seq_labels = test::random_labels(6, 11, "wxent_seq_labels").reshape({3, 2});
  const Tensor w6 = weights_tensor({0.5f, 0.0f, 2.0f, 1.0f, 3.25f, 0.125f});
  const Tensor w3 = weights_tensor({1.5f, 0.0f, 0.75f});
  for (int c = 0; c < 2; ++c) {
    INFO((c == 0 ? "(N, K)" : "(N, T, K)"));
    auto [value, grad] = c == 0 ? run_both(loss, logits, labels, w6, 8) : run_both(loss, seq, seq_labels, w3, 8);
    // As the unweighted CUDA test: the same double arithmetic per row, sums in another
    // order, one rounding to float; the weight multiplies the row's double loss.
    require_close(value.gpu, value.cpu, 1e-7, 4 * kUnitFp32, "loss");
    // (softmax - onehot) * scale / batch in float, times the weight in float: a probability
    // may differ in its last bit, so 4 float roundings relative to the largest term (the
    // weight 3.25 times the factor 3/8).
    require_close(grad.gpu, grad.cpu, 4 * kUnitFp32 * 3.25 * 3.0 / 8, 4 * kUnitFp32, "grad");
  }
}
