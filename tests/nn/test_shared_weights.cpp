// Weight sharing in the graph, as the Transformer uses it: ONE Embedding layer called at
// three places (encoder ids, decoder ids, and the pre-softmax projection). Its weight is
// listed once, its gradient is the sum over the three uses (checked against finite
// differences of the whole network), and its gradient hook fires exactly once, after its
// last backward, with the final value.
#include "gradcheck.hpp"

#include "tarantella/graph.hpp"
#include "tarantella/layers.hpp"

#include <cmath>
#include <map>

using namespace tnt;

namespace {

RunContext training() {
  RunContext rc;
  rc.training = true;
  rc.seed = 3;
  return rc;
}

Tensor ids64(std::vector<int64_t> v, Shape shape) { return Tensor::from_data(v.data(), shape); }

struct SharedNet {
  std::shared_ptr<Embedding> emb = std::make_shared<Embedding>(7, 4, "embedding");
  std::shared_ptr<Network> net;
  SharedNet() {
    SymTensor src = Input({3}, DType::i64, "src");
    SymTensor tgt = Input({3}, DType::i64, "tgt");
    auto add = std::make_shared<Add>("add");
    auto ln = std::make_shared<LayerNorm>(1e-6, "ln");
    SymTensor h = call(ln, SymTensor(call(add, std::vector<SymTensor>{call(emb, src), call(emb, tgt)})));
    net = std::make_shared<Network>(std::vector<SymTensor>{src, tgt}, std::vector<SymTensor>{call(emb, h)}, "shared");
    net->initialize(11);
  }
};

}  // namespace

TEST_CASE("shared embedding: listed once, gradient summed over its uses, hook once at the end", "[nn][shared]") {
  SharedNet s;
  std::vector<std::string> names;
  for (auto& np : s.net->named_parameters()) names.push_back(np.name);
  CHECK(names == std::vector<std::string>{"embedding.weight", "ln.weight", "ln.bias"});
  CHECK(s.net->parameter_count() == 7 * 4 + 4 + 4);

  const Tensor src = ids64({1, 2, 0, 3, 3, 6}, {2, 3});
  const Tensor tgt = ids64({4, 1, 5, 0, 2, 2}, {2, 3});
  const Tensor w = test::random_tensor({2, 3, 7}, 5, "w");  // the objective: sum w * logits
  s.net->zero_grad();
  s.net->forward({src, tgt}, training());
  std::map<size_t, int> hooks;
  std::vector<float> at_hook;
  s.net->backward({w}, training(), [&](size_t index, Parameter& p) {
    ++hooks[index];
    if (index == 0) at_hook = p.grad.to_vector();
  });
  CHECK(hooks == std::map<size_t, int>{{0, 1}, {1, 1}, {2, 1}});
  Parameter& weight = s.emb->weight();
  CHECK(at_hook == weight.grad.to_vector());  // final when the hook fired

  // The summed gradient against central differences of the whole network's objective.
  Tensor analytic = weight.grad.clone();
  auto objective = [&] {
    auto out = s.net->forward({src, tgt}, RunContext{}, false);
    return test::dot(out[0], w);
  };
  test::compare("embedding.weight (3 uses)", weight.value, analytic, objective, {});

  // A row used only by the lookups (id 5: decoder only) and the padding row (id 0: only
  // the projection, since padding looks up nothing) both get gradients; so do rows
  // never looked up (projection).
  std::vector<float> g = analytic.to_vector();
  for (int v = 0; v < 7; ++v) {
    double norm = 0;
    for (int j = 0; j < 4; ++j) norm += std::fabs(g[v * 4 + j]);
    INFO("row " << v);
    CHECK(norm > 0);
  }
}

TEST_CASE("shared embedding: the lookup alone adds nothing to the padding row", "[nn][shared]") {
  Embedding emb(5, 3, "e");
  emb.ensure_built({{1, 1}});
  SavedState s1, s2;
  RunContext rc = training();
  emb.forward({ids64({0, 2, 2}, {1, 3})}, rc, s1);
  emb.forward({ids64({4, 0}, {1, 2})}, rc, s2);
  emb.zero_grad();
  emb.backward({Tensor::full({1, 3, 3}, 1.0)}, rc, s1);
  emb.backward({Tensor::full({1, 2, 3}, 1.0)}, rc, s2);
  std::vector<float> g = emb.weight().grad.to_vector();
  const float s = std::sqrt(3.0f);
  for (int j = 0; j < 3; ++j) {
    CHECK(g[j] == 0.0f);                    // PAD
    CHECK(g[2 * 3 + j] == Approx(2 * s));   // id 2 twice, accumulated over calls
    CHECK(g[4 * 3 + j] == Approx(s));       // id 4 once
    CHECK(g[1 * 3 + j] == 0.0f);
  }
}

TEST_CASE("shared embedding under emulated bf16 mixed precision", "[nn][shared]") {
  SharedNet f32, bf16;
  bf16.net->set_compute_dtype(DType::bf16);
  const Tensor src = ids64({1, 2, 0, 3, 3, 6}, {2, 3});
  const Tensor tgt = ids64({4, 1, 5, 0, 2, 2}, {2, 3});
  std::vector<float> a = f32.net->forward({src, tgt}, RunContext{}, false)[0].to_vector();
  Tensor b = bf16.net->forward({src, tgt}, RunContext{}, false)[0];
  CHECK(b.dtype() == DType::f32);
  std::vector<float> bv = b.to_vector();
  // Activations are rounded to bf16 (8 significant bits, relative 2^-8) at each of the 4
  // layer outputs; logits here are O(1), so 0.05 absolute is ample and far below a wrong path.
  for (size_t i = 0; i < a.size(); ++i) CHECK(bv[i] == Approx(a[i]).margin(0.05));
}
