// Incremental decoding with the key/value cache (Transformer::decode_step, the Translator's
// default) against the uncached reference (decoder_network over the whole prefix): the
// logits of every position with rows reordered between steps, and whole beam searches on a
// tiny Transformer with random weights (several batches, beams 1 and 4, sources of
// different lengths padded in one batch, searches ended by EOS and by the maximum length).
//
// Both paths compute the same sums; only the blocking of the products differs (oneDNN
// picks its kernels by shape: (B*k*t, D) rows against (B*k, D), Tq = t against Tq = 1), so
// they agree to float rounding, not bitwise. Each tolerance below says why it has its size.
#include <catch2/catch.hpp>

#include "beam_search.hpp"
#include "model.hpp"
#include "tarantella/tarantella.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace {

using tnt_models::Hypothesis;
using tnt_models::Transformer;

constexpr int64_t kEos = 1;

// As transformer_beam_search.cpp: the shared embedding scaled up so that next-token
// distributions are peaked (as in a trained model) and near ties rare; EOS's row scaled
// by eos_scale (0: its logit is 0, so a random model does not end every sentence at once).
tnt_models::TransformerParams tiny(int64_t vocab) {
  tnt_models::TransformerParams p;
  p.vocab_size = vocab;
  p.hidden_size = 8;
  p.num_heads = 2;
  p.filter_size = 16;
  p.num_hidden_layers = 2;
  return p;
}

void init(Transformer& model, uint64_t seed, float eos_scale) {
  auto net = model.training_network(2, 1);
  net->initialize(seed);
  for (auto& np : net->named_parameters()) {
    if (np.name != "embedding.weight") continue;
    float* w = np.param->value.data<float>();
    const int64_t d = np.param->value.dim(1);
    for (int64_t i = 0; i < np.param->value.numel(); ++i) w[i] *= (i / d == kEos ? eos_scale : 3.0f);
  }
}

tnt::RunContext inference() {
  tnt::RunContext rc;
  rc.training = false;
  return rc;
}

}  // namespace

TEST_CASE("decode_step gives decode()'s logits at every position, rows reordered between steps",
          "[transformer][cache]") {
  const int64_t vocab = 11, s = 5, rows = 6, steps = 7;
  Transformer model(tiny(vocab));
  init(model, 21, 3.0f);
  tnt::CounterRng rng(77, "decode_cache");
  uint64_t draw = 0;
  auto random_id = [&](int64_t lo) {  // uniform in [lo, vocab)
    return std::min(vocab - 1, lo + static_cast<int64_t>(rng.uniform(draw++) * static_cast<float>(vocab - lo)));
  };
  // Sources of lengths 5, 1, 2 (padding in two of them), each twice: a row's parent must
  // keep its source, so parents are drawn within the pair of rows {2q, 2q + 1}.
  std::vector<int64_t> src(static_cast<size_t>(rows * s), 0);  // (rows, S)
  const int64_t lengths[rows / 2] = {5, 1, 2};
  for (int64_t q = 0; q < rows / 2; ++q) {
    for (int64_t j = 0; j < lengths[q]; ++j) {
      const int64_t id = j + 1 == lengths[q] ? kEos : random_id(2);
      src[static_cast<size_t>(2 * q * s + j)] = src[static_cast<size_t>((2 * q + 1) * s + j)] = id;
    }
  }
  const tnt::Tensor src_ids = tnt::Tensor::from_data(src.data(), {rows, s});
  const tnt::Tensor memory = model.encoder_network(s)->forward({src_ids}, inference(), false).at(0);  // (rows, S, D)
  Transformer::DecoderCache cache = model.start_decoding(memory, src_ids, inference());

  std::vector<std::vector<int64_t>> prefix(static_cast<size_t>(rows), std::vector<int64_t>{0});
  double worst = 0, largest = 0;
  int64_t reordered = 0;
  for (int64_t t = 1; t <= steps; ++t) {
    std::vector<int64_t> parents;
    if (t > 1) {
      std::vector<std::vector<int64_t>> next(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t parent = (r & ~int64_t{1}) + static_cast<int64_t>(rng.uniform(draw++) * 2.0) % 2;
        reordered += parent != r;
        parents.push_back(parent);
        next[static_cast<size_t>(r)] = prefix[static_cast<size_t>(parent)];
        next[static_cast<size_t>(r)].push_back(random_id(0));  // PAD and EOS too: any id is an input
      }
      prefix = next;
    }
    std::vector<int64_t> last, ids;
    for (const auto& p : prefix) {
      last.push_back(p.back());
      ids.insert(ids.end(), p.begin(), p.end());
    }
    const tnt::Tensor got =
        model.decode_step(cache, tnt::Tensor::from_data(last.data(), {rows, 1}), parents, inference());  // (rows, 1, V)
    REQUIRE(got.shape() == tnt::Shape{rows, 1, vocab});
    CHECK(cache.length == t);
    const tnt::Tensor want =
        model.decoder_network(s, t)
            ->forward({tnt::Tensor::from_data(ids.data(), {rows, t}), memory, src_ids}, inference(), false)
            .at(0);  // (rows, t, V)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t v = 0; v < vocab; ++v) {
        const double a = got.data<float>()[r * vocab + v], b = want.data<float>()[(r * t + t - 1) * vocab + v];
        worst = std::max(worst, std::fabs(a - b));
        largest = std::max(largest, std::fabs(b));
      }
    }
  }
  INFO("largest |logit| " << largest << ", largest difference " << worst);
  // The drawn parents did reorder rows (else the gather would go untested).
  CHECK(reordered >= 5);
  // Logits are O(10) here (the embedding is scaled by 3); each is a dot product of D = 8
  // terms after 2 layers whose products (at most 16 terms) and softmaxes round in float in
  // another order: a few ulps of the largest intermediate, ~1e-6 relative. 1e-5 of the
  // largest logit is ten times that, and far below what a wrong position, mask or parent
  // moves (O(1), checked by the exhaustive and program tests failing on such bugs).
  CHECK(worst <= 1e-5 * largest);
  CHECK(largest > 1.0);
}

TEST_CASE("cached and uncached beam search give the same translations", "[transformer][cache]") {
  struct Case {
    int64_t vocab, beam, extra;
    uint64_t seed;
    float eos_scale;
  };
  // eos_scale 0 leaves EOS a logit of 0 (some searches end by EOS, some at the maximum
  // length); 3 lets EOS compete like every other token.
  const std::vector<Case> cases{{9, 4, 4, 12, 0.0f},  {9, 1, 4, 12, 0.0f}, {13, 4, 6, 31, 0.0f},
                                {13, 1, 3, 32, 3.0f}, {7, 4, 5, 33, 3.0f}, {20, 4, 8, 34, 0.0f}};
  const std::vector<std::vector<std::vector<int64_t>>> batches{
      {{2, kEos}, {3, 4, 5, 6, kEos}, {7, kEos}, {8, 2, kEos}},
      {{5, 5, 3, 2, kEos}, {6, kEos}, {2, 3, kEos}},
      {{4, 4, 4, 4, 4, 4, kEos}},
      {{3, kEos}, {2, 6, 5, kEos}, {6, 2, 3, 4, 5, kEos}, {kEos}, {5, 4, kEos}},
  };
  int64_t by_eos = 0, by_length = 0, compared = 0;
  std::set<std::vector<int64_t>> distinct;
  for (const Case& c : cases) {
    Transformer model(tiny(c.vocab));
    init(model, c.seed, c.eos_scale);
    const tnt_models::BeamSearchOptions options{.beam_size = c.beam, .alpha = 0.6, .eos_id = kEos};
    tnt_models::Translator cached(model, options, c.extra, true);
    tnt_models::Translator uncached(model, options, c.extra, false);
    for (size_t i = 0; i < batches.size(); ++i) {
      std::vector<std::vector<int64_t>> sources = batches[i];
      for (auto& src : sources)
        for (int64_t& id : src) id = id == kEos ? kEos : 2 + (id - 2) % (c.vocab - 2);  // within the vocabulary
      const std::vector<Hypothesis> got = cached.translate_batch(sources);
      const std::vector<Hypothesis> want = uncached.translate_batch(sources);
      REQUIRE(got.size() == sources.size());
      REQUIRE(want.size() == sources.size());
      for (size_t j = 0; j < sources.size(); ++j) {
        INFO("vocab " << c.vocab << " beam " << c.beam << " seed " << c.seed << " batch " << i << " source " << j);
        CHECK(got[j].ids == want[j].ids);
        CHECK(got[j].finished == want[j].finished);
        // The same log probabilities up to float rounding in another order (~1e-6 relative
        // per step, see the first test), summed over at most 13 steps: 1e-5 relative.
        CHECK(got[j].score == Approx(want[j].score).epsilon(1e-5));
        CHECK(got[j].log_prob == Approx(want[j].log_prob).epsilon(1e-5));
        ++compared;
        (want[j].finished ? by_eos : by_length) += 1;
        distinct.insert(want[j].ids);
        const int64_t max_length = static_cast<int64_t>(sources[j].size()) + c.extra;
        if (!want[j].finished) CHECK(static_cast<int64_t>(want[j].ids.size()) == max_length);
      }
    }
  }
  INFO(compared << " translations: " << by_eos << " ended by EOS, " << by_length << " at the maximum length, "
                << distinct.size() << " distinct");
  // The comparison covers both ways a search ends, and outputs that differ.
  CHECK(by_eos >= 5);
  CHECK(by_length >= 5);
  CHECK(distinct.size() >= 10);
}

TEST_CASE("decoding with the cache checks its inputs", "[transformer][cache]") {
  Transformer model(tiny(7));
  init(model, 5, 3.0f);
  std::vector<int64_t> src{2, 3, kEos, 4, kEos, 0};
  const tnt::Tensor src_ids = tnt::Tensor::from_data(src.data(), {2, 3});
  const tnt::Tensor memory = model.encoder_network(3)->forward({src_ids}, inference(), false).at(0);
  tnt::RunContext training = inference();
  training.training = true;
  CHECK_THROWS_AS(model.start_decoding(memory, src_ids, training), tnt::Error);
  CHECK_THROWS_AS(model.start_decoding(memory, src_ids.slice_rows(0, 1), inference()), tnt::Error);
  Transformer::DecoderCache cache = model.start_decoding(memory, src_ids, inference());
  std::vector<int64_t> first{0, 0};
  model.decode_step(cache, tnt::Tensor::from_data(first.data(), {2, 1}), {}, inference());
  // A parent outside the rows, and the wrong number of ids.
  CHECK_THROWS_AS(model.decode_step(cache, tnt::Tensor::from_data(first.data(), {2, 1}), {0, 2}, inference()),
                  tnt::Error);
  CHECK_THROWS_AS(model.decode_step(cache, tnt::Tensor::from_data(first.data(), {1, 1}), {0}, inference()), tnt::Error);
}

// The program refuses a model too big for the memory from this count, before building it
// (models/transformer/main.cpp), so it must be the built network's count exactly.
TEST_CASE("transformer_parameter_count is the built network's parameter count", "[transformer]") {
  std::vector<tnt_models::TransformerParams> sets = {tnt_models::transformer_params("tiny"),
                                                     tnt_models::transformer_params("base")};
  sets[0].vocab_size = 1000;
  sets[1].vocab_size = 33708;
  tnt_models::TransformerParams odd = tiny(97);
  odd.hidden_size = 48;
  odd.num_heads = 6;
  odd.filter_size = 80;
  odd.num_hidden_layers = 3;
  sets.push_back(odd);
  for (const tnt_models::TransformerParams& p : sets) {
    Transformer model(p);
    auto net = model.training_network(4, 4);
    CAPTURE(p.hidden_size, p.filter_size, p.num_hidden_layers, p.vocab_size);
    CHECK(net->parameter_count() == tnt_models::transformer_parameter_count(p));
  }
  CHECK(tnt_models::transformer_parameter_count(sets[1]) > 60000000);  // Transformer-base: about 61M
}
