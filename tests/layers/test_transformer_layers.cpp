// The Transformer's layers on the CPU: finite-difference gradients (gradcheck.hpp has the
// method and the tolerance's reasoning), values against closed forms, and mask behaviour.
#include "gradcheck.hpp"

#include "core/philox.hpp"
#include "layers/gelu_math.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/runtime.hpp"

#include <cmath>

using namespace tnt;
using tnt::test::GradCheck;

namespace {

RunContext training(int64_t step = 3) {
  RunContext rc;
  rc.training = true;
  rc.seed = 7;
  rc.step = step;
  return rc;
}

Tensor ids64(std::vector<int64_t> v, Shape shape) { return Tensor::from_data(v.data(), shape); }

std::vector<float> forward1(Layer& layer, const std::vector<Tensor>& inputs, const RunContext& rc = RunContext{}) {
  SavedState s;
  return layer.forward(inputs, rc, s).at(0).to_vector();
}

double loss_of(Loss& loss, const Tensor& p, const Tensor& t, int64_t batch) {
  SavedState s;
  return Loss::value(loss.forward(p, t, batch, s));
}

// A multi-head attention layer with random weights of a useful size (glorot on D = 8 is
// fine; the default initialisation is kept, only the seed is ours).
std::shared_ptr<MultiHeadAttention> attention(const std::string& name, MultiHeadAttentionOptions o, int64_t d = 8) {
  auto a = std::make_shared<MultiHeadAttention>(d, o, name);
  a->ensure_built({{1, 1, d}});
  a->initialize(5);
  return a;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Gradients

TEST_CASE("gradient: Embedding lookup and projection share one weight", "[grad][transformer]") {
  Embedding emb(6, 4, "embedding");
  emb.ensure_built({{2, 3}});
  emb.initialize(1);
  // Lookup: only the weight has a gradient (ids repeat, and 0 is padding: its row gets none).
  test::check_layer(emb, {ids64({1, 5, 0, 5, 2, 1}, {2, 3})}, training(), {}, {false});
  // Projection (B, T, D) -> (B, T, V): input and weight.
  test::check_layer(emb, {test::random_tensor({2, 3, 4}, 1, "x")}, training());
}

TEST_CASE("gradient: LayerNorm over the last axis", "[grad][transformer]") {
  LayerNorm ln("ln");
  ln.ensure_built({{2, 3, 5}});
  ln.weight().value.copy_from(test::random_tensor({5}, 2, "g", 0.5, 1.5));
  ln.bias().value.copy_from(test::random_tensor({5}, 2, "b"));
  test::check_layer(ln, {test::random_tensor({2, 3, 5}, 2, "x")}, training());
  LayerNorm ln2("ln2");
  test::check_layer(ln2, {test::random_tensor({4, 7}, 3, "x", -2.0, 3.0)}, training());
}

TEST_CASE("gradient: MultiHeadAttention, self and encoder-decoder, masks and dropout", "[grad][transformer]") {
  const Tensor x = test::random_tensor({2, 3, 8}, 4, "x");
  const Tensor mem = test::random_tensor({2, 4, 8}, 4, "mem");
  const Tensor src_ids = ids64({3, 1, 0, 0, 2, 2, 5, 0}, {2, 4});  // padding at the ends
  const Tensor self_ids = ids64({3, 1, 0, 2, 2, 5}, {2, 3});
  SECTION("self-attention with key padding") {
    auto a = attention("self_pad", {.num_heads = 2});
    test::check_layer(*a, {x.clone(), self_ids}, training(), {}, {true, false});
  }
  SECTION("causal self-attention") {
    auto a = attention("causal", {.num_heads = 2, .causal = true});
    test::check_layer(*a, {x.clone()}, training());
  }
  SECTION("encoder-decoder attention with the source's padding") {
    auto a = attention("cross", {.num_heads = 4});
    test::check_layer(*a, {x.clone(), mem.clone(), src_ids}, training(), {}, {true, true, false});
  }
  SECTION("attention dropout (a fixed mask for a fixed step)") {
    auto a = attention("drop", {.num_heads = 2, .dropout = 0.3});
    test::check_layer(*a, {x.clone(), mem.clone()}, training());
  }
}

TEST_CASE("gradient: position encoding, GELU and label-smoothed cross entropy", "[grad][transformer]") {
  PositionEncoding pe("pe");
  test::check_layer(pe, {test::random_tensor({2, 5, 6}, 5, "x")}, training());
  GELU approx(true, "gelu_tanh"), exact(false, "gelu_exact");
  test::check_layer(approx, {test::random_tensor({3, 7}, 6, "x", -3.0, 3.0)}, training());
  test::check_layer(exact, {test::random_tensor({3, 7}, 6, "x", -3.0, 3.0)}, training());
  LabelSmoothingCrossEntropy loss(0.1);
  const Tensor labels = ids64({2, 0, 4, 1, 3, 0}, {2, 3});
  test::check_loss(loss, test::random_tensor({2, 3, 5}, 7, "logits", -2.0, 2.0), labels, 9);
  test::check_loss(loss, test::random_tensor({2, 3, 5}, 8, "logits", -2.0, 2.0), labels, 0);
}

// ---------------------------------------------------------------------------------------
// Values

TEST_CASE("Embedding: scaled rows, zero rows for padding, logits x W^T, ids checked", "[transformer]") {
  Embedding emb(5, 4, "embedding");
  emb.ensure_built({{1, 1}});
  std::vector<float> w(20);
  for (int i = 0; i < 20; ++i) w[i] = static_cast<float>(i) * 0.25f - 2.0f;
  emb.weight().value.copy_from(Tensor::from_vector(w, {5, 4}));
  CHECK(emb.output_shapes_for({{2, 3}}, {DType::i64}) == std::vector<Shape>{{2, 3, 4}});
  CHECK(emb.output_shapes_for({{2, 3, 4}}, {DType::f32}) == std::vector<Shape>{{2, 3, 5}});
  std::vector<float> y = forward1(emb, {ids64({3, 0}, {1, 2})});
  REQUIRE(y.size() == 8);
  for (int j = 0; j < 4; ++j) {
    CHECK(y[j] == Approx(w[12 + j] * 2.0f));  // sqrt(4) = 2
    CHECK(y[4 + j] == 0.0f);                  // PAD
  }
  std::vector<int32_t> i32{4};
  CHECK(forward1(emb, {Tensor::from_data(i32.data(), {1, 1})})[1] == Approx(w[17] * 2.0f));
  // Projection: one row x = (1, 0, 0, 1): logits_v = W[v, 0] + W[v, 3].
  std::vector<float> logits = forward1(emb, {Tensor::from_vector({1, 0, 0, 1}, {1, 1, 4})});
  REQUIRE(logits.size() == 5);
  for (int v = 0; v < 5; ++v) CHECK(logits[v] == Approx(w[4 * v] + w[4 * v + 3]));
  CHECK_THROWS_AS(forward1(emb, {ids64({1, 5}, {1, 2})}), InputError);
  CHECK_THROWS_WITH(forward1(emb, {ids64({1, -1}, {1, 2})}), Catch::Contains("token id -1"));
  // The initialiser: N(0, D^-0.5).
  Embedding big(200, 64, "big");
  big.ensure_built({{1, 1}});
  big.initialize(3);
  std::vector<double> v = big.weight().value.to_double_vector();
  double sq = 0;
  for (double e : v) sq += e * e;
  // 12800 draws: the sample standard deviation is within 2% of 1/8 (5 sigma is ~3%).
  CHECK(std::sqrt(sq / static_cast<double>(v.size())) == Approx(0.125).epsilon(0.03));
}

TEST_CASE("LayerNorm: a constant row gives the bias; a known row", "[transformer]") {
  LayerNorm ln("ln");
  ln.ensure_built({{1, 4}});
  ln.weight().value.copy_from(Tensor::from_vector({1, 2, 3, 4}, {4}));
  ln.bias().value.copy_from(Tensor::from_vector({0.5f, -1, 0, 2}, {4}));
  std::vector<float> c = forward1(ln, {Tensor::from_vector({7, 7, 7, 7}, {1, 4})});
  CHECK(c == std::vector<float>{0.5f, -1, 0, 2});
  // Row (1, 2, 3, 4): mean 2.5, variance 1.25, xhat = (x - 2.5) / sqrt(1.25 + 1e-6).
  std::vector<float> y = forward1(ln, {Tensor::from_vector({1, 2, 3, 4}, {1, 4})});
  const double s = std::sqrt(1.25 + 1e-6);
  const double expect[4] = {-1.5 / s * 1 + 0.5, -0.5 / s * 2 - 1, 0.5 / s * 3, 1.5 / s * 4 + 2};
  for (int j = 0; j < 4; ++j) CHECK(y[j] == Approx(expect[j]).epsilon(1e-6));
  CHECK(ln.eps() == 1e-6);
  CHECK(ln.named_parameters()[0].first == "ln.weight");
  CHECK(ln.named_parameters()[1].first == "ln.bias");
}

TEST_CASE("MultiHeadAttention: one key gives its value; names as PyTorch", "[transformer]") {
  auto a = attention("attn", {.num_heads = 2});
  // A single key: softmax is 1, so every query's output is out_proj(v_proj(memory)).
  const Tensor x = test::random_tensor({1, 3, 8}, 9, "x");
  const Tensor mem = test::random_tensor({1, 1, 8}, 9, "mem");
  std::vector<float> y = forward1(*a, {x, mem});
  std::vector<float> wv = a->v_proj().weight().value.to_vector(), wo = a->out_proj().weight().value.to_vector();
  std::vector<float> m = mem.to_vector();
  std::vector<double> v(8, 0.0), expect(8, 0.0);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) v[i] += wv[i * 8 + j] * m[j];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) expect[i] += wo[i * 8 + j] * v[j];
  REQUIRE(y.size() == 24);
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < 8; ++i) CHECK(y[t * 8 + i] == Approx(expect[i]).margin(1e-5));
  std::vector<std::string> names;
  for (auto& [n, p] : a->named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                                          "attn.out_proj.weight"});
  CHECK(a->q_proj().bias() == nullptr);
}

TEST_CASE("MultiHeadAttention: padded keys get zero weight", "[transformer]") {
  auto a = attention("attn_pad", {.num_heads = 2});
  const Tensor x = test::random_tensor({1, 3, 8}, 10, "x");
  const Tensor mem = test::random_tensor({1, 5, 8}, 10, "mem");
  const Tensor ids = ids64({4, 2, 7, 0, 0}, {1, 5});
  std::vector<float> y = forward1(*a, {x, mem, ids});
  // The same as attending over the three real keys only...
  Tensor short_mem = Tensor::empty({1, 3, 8});
  for (int i = 0; i < 24; ++i) short_mem.data<float>()[i] = mem.data<float>()[i];
  std::vector<float> y3 = forward1(*a, {x, short_mem});
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == Approx(y3[i]).margin(1e-6));
  // ...and whatever the padded positions hold.
  Tensor mem2 = mem.clone();
  for (int i = 24; i < 40; ++i) mem2.data<float>()[i] = 100.0f;
  CHECK(forward1(*a, {x, mem2, ids}) == y);
  // Without the ids the padded keys do count.
  std::vector<float> unmasked = forward1(*a, {x, mem});
  double diff = 0;
  for (size_t i = 0; i < y.size(); ++i) diff += std::fabs(unmasked[i] - y[i]);
  CHECK(diff > 1e-3);
}

TEST_CASE("MultiHeadAttention: causal, no leakage from the future", "[transformer]") {
  auto a = attention("attn_causal", {.num_heads = 2, .causal = true});
  const Tensor x = test::random_tensor({2, 4, 8}, 11, "x");
  std::vector<float> y = forward1(*a, {x});
  for (int t = 0; t < 4; ++t) {
    // Change position t of both sequences: outputs before t stay, outputs at t move.
    Tensor x2 = x.clone();
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 8; ++i) x2.data<float>()[(b * 4 + t) * 8 + i] += 1.0f;
    std::vector<float> y2 = forward1(*a, {x2});
    for (int b = 0; b < 2; ++b) {
      for (int s = 0; s < t; ++s)
        for (int i = 0; i < 8; ++i) CHECK(y2[(b * 4 + s) * 8 + i] == y[(b * 4 + s) * 8 + i]);
      double moved = 0;
      for (int i = 0; i < 8; ++i) moved += std::fabs(y2[(b * 4 + t) * 8 + i] - y[(b * 4 + t) * 8 + i]);
      CHECK(moved > 1e-4);
    }
  }
  // The first query sees only the first key: its output is attention over x_0 alone.
  auto b = attention("attn_causal", {.num_heads = 2});  // same name: same weights, no mask
  std::vector<float> xs = x.to_vector();
  const Tensor x0 = Tensor::from_vector(std::vector<float>(xs.begin(), xs.begin() + 8), {1, 1, 8});
  std::vector<float> one = forward1(*b, {x.slice_rows(0, 1), x0});
  for (int i = 0; i < 8; ++i) CHECK(y[i] == Approx(one[i]).margin(1e-6));
}

TEST_CASE("MultiHeadAttention: dropout follows the step and keeps the expectation", "[transformer]") {
  auto a = attention("attn_drop", {.num_heads = 2, .dropout = 0.5});
  const Tensor x = test::random_tensor({2, 3, 8}, 12, "x");
  std::vector<float> inference = forward1(*a, {x});
  std::vector<float> s3 = forward1(*a, {x}, training(3)), s3b = forward1(*a, {x}, training(3));
  std::vector<float> s4 = forward1(*a, {x}, training(4));
  CHECK(s3 == s3b);   // a pure function of (seed, name, step, sample)
  CHECK(s3 != s4);
  CHECK(s3 != inference);
}

// The documented rule (attention_cuda.hpp), which the CUDA engines follow too (compared with
// this engine on a GPU): probability (b, h, i, j) is kept iff philox::uniform4(key, base +
// ((b*H + h)*Tq + i)*Tk + j) >= rate. With q = 0 every probability is 1/Tk; with v and the
// output projection the identity and the memory's key j the unit vector e_j, output (i, j)
// is probability (i, j) after dropout. Tk = 7 and a sample offset of 1 put the counters of
// row 1 off the 4-aligned Philox blocks.
TEST_CASE("MultiHeadAttention: the dropout mask is uniform4 of the probability's counter", "[transformer]") {
  constexpr int64_t tq = 2, tk = 7;
  auto a = attention("attn_rule", {.num_heads = 1, .dropout = 0.5}, tk);
  auto set = [](Dense& dense, bool identity) {
    float* w = dense.weight().value.data<float>();
    for (int64_t r = 0; r < tk; ++r)
      for (int64_t c = 0; c < tk; ++c) w[r * tk + c] = identity && r == c ? 1.0f : 0.0f;
  };
  set(a->q_proj(), false);
  set(a->k_proj(), false);
  set(a->v_proj(), true);
  set(a->out_proj(), true);
  std::vector<float> eye(tk * tk, 0.0f);
  for (int64_t j = 0; j < tk; ++j) eye[j * tk + j] = 1.0f;
  const Tensor mem = Tensor::from_vector(eye, {1, tk, tk});
  const Tensor x = test::random_tensor({1, tq, tk}, 40, "x_rule");
  RunContext rc = training(6);
  rc.sample_offset = 1;
  const std::vector<float> y = forward1(*a, {x, mem}, rc);
  REQUIRE(y.size() == static_cast<size_t>(tq * tk));
  const uint64_t key = a->dropout_key(rc), base = static_cast<uint64_t>(rc.sample_offset * tq * tk);
  int kept = 0;
  for (int64_t i = 0; i < tq; ++i) {
    for (int64_t j = 0; j < tk; ++j) {
      const bool keep = philox::uniform4(key, base + static_cast<uint64_t>(i * tk + j)) >= 0.5f;
      INFO("row " << i << ", key " << j);
      // 1/7 times 2 through the products: a few float roundings.
      CHECK(y[i * tk + j] == Approx(keep ? 2.0 / tk : 0.0).margin(1e-6));
      kept += keep;
    }
  }
  CHECK(kept > 0);
  CHECK(kept < tq * tk);  // the draws do decide something here
}

TEST_CASE("MultiHeadAttention: incremental step and attend give forward()'s outputs", "[transformer][cache]") {
  auto a = attention("attn_step", {.num_heads = 2, .causal = true});
  const int64_t rows = 3, d = 8, steps = 5;
  // Each step row r continues row parents[r] of the previous step (duplicates and swaps, as
  // beam search reorders beams); seq holds every row's whole input sequence so far.
  const std::vector<std::vector<int64_t>> parents{{}, {0, 0, 2}, {2, 1, 0}, {1, 1, 1}, {0, 2, 1}};
  std::vector<std::vector<float>> seq(rows);
  AttentionCache cache;
  for (int64_t t = 1; t <= steps; ++t) {
    const Tensor x = test::random_tensor({rows, 1, d}, 20 + t, "x_step");  // (B, 1, D)
    std::vector<std::vector<float>> next(rows);
    for (int64_t r = 0; r < rows; ++r) {
      next[r] = t == 1 ? std::vector<float>{} : seq[parents[t - 1][r]];
      next[r].insert(next[r].end(), x.data<float>() + r * d, x.data<float>() + (r + 1) * d);
    }
    seq = next;
    std::vector<float> all;
    for (const auto& s : seq) all.insert(all.end(), s.begin(), s.end());
    std::vector<float> want = forward1(*a, {Tensor::from_vector(all, {rows, t, d})});  // (B, t, D), causal
    std::vector<float> got = a->step(x, cache, parents[t - 1], RunContext{}).to_vector();  // (B, 1, D)
    REQUIRE(cache.length() == t);
    REQUIRE(got.size() == static_cast<size_t>(rows * d));
    // The same sums with other matrix shapes (Tq 1 against t): float rounding only, on
    // outputs of O(1).
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d; ++i) CHECK(got[r * d + i] == Approx(want[(r * t + t - 1) * d + i]).margin(1e-6));
  }
  // attend() over a projected memory with padding = forward({x, memory, ids}).
  auto c = attention("attn_cross", {.num_heads = 2});
  const Tensor x = test::random_tensor({2, 3, d}, 30, "x_attend");
  const Tensor mem = test::random_tensor({2, 4, d}, 30, "mem_attend");
  const Tensor ids = ids64({3, 5, 1, 0, 2, 1, 0, 0}, {2, 4});
  std::vector<float> want = forward1(*c, {x, mem, ids});
  std::vector<float> got = c->attend(x, c->project(mem, RunContext{}), ids, RunContext{}).to_vector();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-6));
  // Misuse is refused: in training, several positions at once, a parent outside the cache.
  RunContext train = training();
  CHECK_THROWS_AS(a->step(test::random_tensor({rows, 1, d}, 31, "x"), cache, {}, train), Error);
  CHECK_THROWS_AS(a->step(test::random_tensor({rows, 2, d}, 31, "x"), cache, {}, RunContext{}), Error);
  CHECK_THROWS_AS(a->step(test::random_tensor({rows, 1, d}, 31, "x"), cache, {0, 1, 3}, RunContext{}), Error);
  CHECK(cache.length() == steps);  // untouched by the refused calls
}

TEST_CASE("Position encoding: TensorFlow's sin half then cos half", "[transformer]") {
  const int64_t t = 50, d = 8, n = 4;
  Tensor p = position_encoding(t, d);
  REQUIRE(p.shape() == Shape{t, d});
  const float* v = p.data<float>();
  for (int64_t pos = 0; pos < t; ++pos) {
    for (int64_t k = 0; k < n; ++k) {
      // timescale 1e4^(k / (n - 1)): 1, 1e4^(1/3), 1e4^(2/3), 1e4
      const double angle = static_cast<double>(pos) / std::pow(1e4, static_cast<double>(k) / (n - 1));
      CHECK(v[pos * d + k] == Approx(std::sin(angle)).margin(1e-6));
      CHECK(v[pos * d + n + k] == Approx(std::cos(angle)).margin(1e-6));
    }
  }
  CHECK(v[d + 0] == Approx(std::sin(1.0)));       // position 1, fastest timescale
  CHECK(v[d + n - 1] == Approx(std::sin(1e-4)));  // position 1, slowest
  PositionEncoding layer("pe");
  const Tensor x = test::random_tensor({2, 3, 8}, 13, "x");
  std::vector<float> y = forward1(layer, {x});
  std::vector<float> xs = x.to_vector();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 24; ++i) CHECK(y[b * 24 + i] == xs[b * 24 + i] + v[i]);
  CHECK_THROWS(forward1(layer, {test::random_tensor({2, 3, 7}, 13, "odd")}));
}

TEST_CASE("GELU: known values of both forms", "[transformer]") {
  GELU approx(true, "g1"), exact(false, "g2");
  const Tensor x = Tensor::from_vector({-1, 0, 1, 3}, {4});
  // exact: x Phi(x); tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  std::vector<float> ye = forward1(exact, {x}), ya = forward1(approx, {x});
  for (int i = 0; i < 4; ++i) {
    const double v = x.data<float>()[i];
    CHECK(ye[i] == Approx(0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))).margin(1e-6));
    CHECK(ya[i] == Approx(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))).margin(1e-6));
  }
  CHECK(ye[2] == Approx(0.8413447).margin(1e-6));
  CHECK(ya[2] == Approx(0.8411920).margin(1e-6));
  // Far out both forms are x (or 0) and their slope 1 (or 0); before, the tanh form's slope
  // was NaN from |x| about 1.9e19 on (0 * an overflowed x^2).
  for (bool form : {true, false}) {
    for (float v : {1e20f, -1e20f, 1e30f, -3e38f, 50.0f, -50.0f}) {
      INFO("approximate " << form << ", x " << v);
      CHECK(tnt::gelu::derivative(v, form) == (v > 0 ? 1.0f : 0.0f));
      CHECK(std::isfinite(tnt::gelu::value(v, form)));
    }
  }
}

TEST_CASE("Label-smoothed cross entropy writes its gradient over logits nobody else holds", "[transformer][loss]") {
  // Model's step lets its predictions go before the loss's backward: the gradient then needs
  // no second (..., V) buffer. The values are those of the out-of-place gradient, the label's
  // own logit included (read before its row is overwritten), padding rows 0.
  LabelSmoothingCrossEntropy loss(0.1);
  const Tensor labels = ids64({3, 0, 1, 4, 2, 6}, {2, 3});
  const Tensor held = test::random_tensor({2, 3, 7}, 41, "smooth_in_place", -4.0, 4.0);
  SavedState kept, handed;
  const Tensor l_kept = loss.forward(held, labels, 0, kept);
  const Tensor g_kept = loss.backward(kept, 3.0);
  CHECK(g_kept.raw() != held.raw());  // the caller holds its logits: a new gradient
  CHECK(kept.tensors.size() == 3);
  Tensor given = held.clone();
  const void* where = given.raw();
  const Tensor l_given = loss.forward(given, labels, 0, handed);
  given = Tensor();
  const Tensor g_given = loss.backward(handed, 3.0);
  // TNT_LOSS_GRAD_IN_PLACE=0 (layers_transformer_no_in_place) keeps the logits: a buffer
  // of its own, the same bits.
  CHECK((g_given.raw() == where) == tnt::config().loss_grad_in_place);
  CHECK(Loss::value(l_given) == Loss::value(l_kept));
  CHECK(g_given.to_vector() == g_kept.to_vector());
  for (int j = 0; j < 7; ++j) CHECK(g_given.to_vector()[7 + j] == 0.0f);  // token 1 is padding
  if (!tnt::config().loss_grad_in_place) return;  // the saved state stays: it was not spent
  CHECK(handed.tensors.empty());
  CHECK_THROWS_WITH(loss.backward(handed, 3.0), Catch::Contains("backward without a forward"));
}

TEST_CASE("Label-smoothed cross entropy: values by hand, padding, token normaliser", "[transformer][loss]") {
  LabelSmoothingCrossEntropy loss(0.1);
  CHECK(loss.normalizes_by_tokens());
  // V = 4, uniform logits: -sum_j q_j log(1/4) = ln 4 for any q; minus the constant
  // c = -(0.9 ln 0.9 + 3 (0.1/3) ln(0.1/3)) = 0.0948245 + 0.3401197 = 0.4349442.
  const double c = -(0.9 * std::log(0.9) + 0.1 * std::log(0.1 / 3));
  CHECK(loss.min_entropy(4) == Approx(c));
  CHECK(c == Approx(0.4349442).epsilon(1e-6));
  const Tensor uniform = Tensor::zeros({1, 3, 4});
  const Tensor labels = ids64({2, 0, 1}, {1, 3});  // the middle token is padding
  CHECK(loss.count_tokens(labels) == 2);
  CHECK(loss_of(loss, uniform, labels, 0) == Approx(std::log(4.0) - c).epsilon(1e-6));
  // The sum over the 2 real tokens, divided by the count given (a global token count).
  CHECK(loss_of(loss, uniform, labels, 8) == Approx(2 * (std::log(4.0) - c) / 8).epsilon(1e-6));
  // Logits (ln 6, 0, 0, 0) = p (2/3, 1/9, 1/9, 1/9), label 0:
  // -(0.9 ln(2/3) + 3 (0.1/3) ln(1/9)) - c
  const Tensor one = Tensor::from_vector({static_cast<float>(std::log(6.0)), 0, 0, 0}, {1, 4});
  const double hand = -(0.9 * std::log(2.0 / 3) + 0.1 * std::log(1.0 / 9)) - c;
  CHECK(loss_of(loss, one, ids64({0}, {1}), 1) == 0.0);  // label 0 is padding: nothing counts
  std::vector<float> rotated{0, static_cast<float>(std::log(6.0)), 0, 0};
  CHECK(loss_of(loss, Tensor::from_vector(rotated, {1, 4}), ids64({1}, {1}), 0) == Approx(hand).epsilon(1e-6));
  // A perfect, confident prediction of the smoothed target costs ~0: logits ln q.
  std::vector<float> lq{static_cast<float>(std::log(0.1 / 3)), static_cast<float>(std::log(0.9)),
                        static_cast<float>(std::log(0.1 / 3)), static_cast<float>(std::log(0.1 / 3))};
  CHECK(loss_of(loss, Tensor::from_vector(lq, {1, 4}), ids64({1}, {1}), 0) == Approx(0.0).margin(1e-6));
  // Gradient (p - q) / N on real tokens, 0 on padding.
  SavedState s;
  loss.forward(uniform, labels, 4, s);
  std::vector<float> g = loss.backward(s, 2.0).to_vector();
  CHECK(g[2] == Approx(2 * (0.25 - 0.9) / 4));
  CHECK(g[0] == Approx(2 * (0.25 - 0.1 / 3) / 4));
  for (int j = 4; j < 8; ++j) CHECK(g[j] == 0.0f);
  // Without smoothing: plain cross entropy, constant 0.
  LabelSmoothingCrossEntropy plain(0.0);
  CHECK(plain.min_entropy(4) == 0.0);
  CHECK(loss_of(plain, uniform, labels, 0) == Approx(std::log(4.0)).epsilon(1e-6));
  CHECK_THROWS_AS(loss_of(loss, uniform, ids64({2, 0, 4}, {1, 3}), 0), InputError);
  CHECK_THROWS_WITH(loss_of(loss, uniform, ids64({2, 0, 4}, {1, 3}), 0), Catch::Contains("label 4"));
}
