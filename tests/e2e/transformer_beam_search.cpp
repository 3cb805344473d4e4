// Beam search (models/transformer/beam_search.hpp) against exhaustive search: with a beam at
// least as wide as the number of candidate sequences it must find the sequence that
// exhaustive search finds under the same length penalty, on made-up next-token
// distributions and on a tiny Transformer; batching (length-sorted) must give each sentence
// its own translation, in the order of the input.
#include <catch2/catch.hpp>

#include "beam_search.hpp"
#include "model.hpp"
#include "tarantella/tarantella.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

namespace {

using tnt_models::BeamSearchOptions;
using tnt_models::Hypothesis;

constexpr int64_t kEos = 1;

struct Best {
  std::vector<int64_t> ids;
  double score = -std::numeric_limits<double>::infinity();
  double second = -std::numeric_limits<double>::infinity();  // the runner-up's score
};

// Every sequence of non-EOS tokens followed by EOS, of at most max_len tokens in all, scored
// log P / ((5 + len) / 6)^alpha. log_probs(prefix with the leading 0) -> (V).
Best exhaustive(int64_t vocab, int64_t max_len, double alpha,
                const std::function<std::vector<double>(const std::vector<int64_t>&)>& log_probs) {
  Best best;
  std::function<void(std::vector<int64_t>&, double)> walk = [&](std::vector<int64_t>& prefix, double lp) {
    const std::vector<double> next = log_probs(prefix);
    const int64_t len = static_cast<int64_t>(prefix.size());  // tokens after this one: len
    const double finished = (lp + next[kEos]) / tnt_models::length_penalty(len, alpha);
    if (finished > best.score) {
      best.second = best.score;
      best.score = finished;
      best.ids.assign(prefix.begin() + 1, prefix.end());
      best.ids.push_back(kEos);
    } else if (finished > best.second) {
      best.second = finished;
    }
    if (len >= max_len) return;
    for (int64_t v = 0; v < vocab; ++v) {
      if (v == kEos) continue;
      prefix.push_back(v);
      walk(prefix, lp + next[v]);
      prefix.pop_back();
    }
  };
  std::vector<int64_t> start{0};
  walk(start, 0.0);
  return best;
}

// A made-up model: log-softmax of pseudo-random logits keyed by (item, prefix).
std::vector<double> made_up(uint64_t item, const std::vector<int64_t>& prefix, int64_t vocab, double sharpness) {
  uint64_t key = 1469598103934665603ull ^ (item * 1099511628211ull);
  for (int64_t id : prefix) key = (key ^ static_cast<uint64_t>(id + 7)) * 1099511628211ull;
  tnt::CounterRng rng(key, "beam");
  std::vector<double> x(static_cast<size_t>(vocab));
  double mx = -1e30;
  for (int64_t v = 0; v < vocab; ++v) {
    x[v] = sharpness * rng.uniform(static_cast<uint64_t>(v));
    mx = std::max(mx, x[v]);
  }
  double sum = 0;
  for (double xv : x) sum += std::exp(xv - mx);
  for (double& xv : x) xv -= mx + std::log(sum);
  return x;
}

}  // namespace

TEST_CASE("length penalty", "[transformer][beam]") {
  CHECK(tnt_models::length_penalty(1, 0.6) == Approx(1.0));
  CHECK(tnt_models::length_penalty(7, 0.6) == Approx(std::pow(2.0, 0.6)));
  CHECK(tnt_models::length_penalty(20, 0.0) == 1.0);
}

TEST_CASE("beam search finds the exhaustive best on made-up distributions", "[transformer][beam]") {
  // Vocabulary {PAD, EOS, 2, 3, 4}, at most 3 tokens: 1 + 4 + 16 finished sequences, 16
  // alive prefixes at the last step, 80 extensions: a beam of 40 keeps every candidate.
  const int64_t vocab = 5, max_len = 3, batch = 6;
  for (double alpha : {0.0, 0.6, 2.0}) {
    for (double sharpness : {1.0, 4.0}) {
      BeamSearchOptions opts{.beam_size = 40, .alpha = alpha, .eos_id = kEos};
      auto next = [&](const std::vector<int64_t>& ids, int64_t rows, int64_t t) {
        std::vector<float> out;
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<int64_t> prefix(ids.begin() + r * t, ids.begin() + (r + 1) * t);
          for (double v : made_up(static_cast<uint64_t>(r / opts.beam_size), prefix, vocab, sharpness))
            out.push_back(static_cast<float>(v));
        }
        return out;
      };
      std::vector<Hypothesis> got = tnt_models::beam_search(batch, vocab, max_len, next, opts);
      REQUIRE(got.size() == static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) {
        Best want = exhaustive(vocab, max_len, alpha, [&](const std::vector<int64_t>& prefix) {
          // the beam search sees float log probabilities: the same here
          std::vector<double> lp = made_up(static_cast<uint64_t>(b), prefix, vocab, sharpness);
          for (double& v : lp) v = static_cast<float>(v);
          return lp;
        });
        INFO("item " << b << " alpha " << alpha << " sharpness " << sharpness);
        CHECK(got[b].finished);
        // float sums in another order: 1e-9 relative; the runner-up is far further away
        // (checked, so that the comparison of sequences means something).
        CHECK(got[b].score == Approx(want.score).epsilon(1e-6));
        if (want.score - want.second > 1e-5) CHECK(got[b].ids == want.ids);
      }
    }
  }
}

TEST_CASE("a narrow beam keeps finished sequences and stops when no alive beam can win", "[transformer][beam]") {
  // EOS is by far the best first token: the search must return [EOS] after one step, and
  // must stop right away (an alive beam's best possible score is already lower).
  int64_t calls = 0;
  auto next = [&](const std::vector<int64_t>&, int64_t rows, int64_t) {
    ++calls;
    std::vector<float> out;
    for (int64_t r = 0; r < rows; ++r) {
      for (float v : {-20.f, -0.01f, -6.f, -7.f}) out.push_back(v);
    }
    return out;
  };
  auto got = tnt_models::beam_search(2, 4, 50, next, {.beam_size = 2, .alpha = 0.6, .eos_id = kEos});
  REQUIRE(got.size() == 2);
  CHECK(got[0].ids == std::vector<int64_t>{kEos});
  CHECK(got[0].finished);
  CHECK(calls == 1);
  // EOS impossible (log probability -inf): after max_decode_length steps the best alive sequence comes back.
  auto never = [&](const std::vector<int64_t>&, int64_t rows, int64_t) {
    std::vector<float> out;
    for (int64_t r = 0; r < rows; ++r) {
      for (float v : {-5.f, -std::numeric_limits<float>::infinity(), -0.1f, -3.f}) out.push_back(v);
    }
    return out;
  };
  got = tnt_models::beam_search(1, 4, 5, never, {.beam_size = 3, .alpha = 0.6, .eos_id = kEos});
  CHECK_FALSE(got[0].finished);
  CHECK(got[0].ids == std::vector<int64_t>(5, 2));
}

TEST_CASE("each row's parent is the row of the previous step it extends", "[transformer][beam]") {
  // The invariant a key/value cache relies on: row r's prefix without its last token is
  // the whole prefix of row parents[r] one step earlier. Items with other maximum lengths,
  // so that some stop while the others go on (their rows must continue themselves).
  const int64_t vocab = 6, k = 3;
  std::vector<int64_t> previous;  // (rows, t - 1) of the previous step
  int64_t checked = 0, moved = 0, steps = 0;
  auto next = [&](const std::vector<int64_t>& ids, const std::vector<int64_t>& parents, int64_t rows, int64_t t) {
    ++steps;
    if (t == 1) {
      CHECK(parents.empty());
    } else {
      REQUIRE(static_cast<int64_t>(parents.size()) == rows);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t p = parents[r];
        REQUIRE(p >= 0);
        REQUIRE(p < rows);
        CHECK(p / k == r / k);  // within the item
        CHECK(std::equal(ids.begin() + r * t, ids.begin() + r * t + t - 1, previous.begin() + p * (t - 1)));
        ++checked;
        moved += p != r;
      }
    }
    previous = ids;
    std::vector<float> out;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int64_t> prefix(ids.begin() + r * t, ids.begin() + (r + 1) * t);
      std::vector<double> lp = made_up(static_cast<uint64_t>(r / k), prefix, vocab, 3.0);
      lp[kEos] -= 3.0;  // rarer EOS: longer searches
      for (double v : lp) out.push_back(static_cast<float>(v));
    }
    return out;
  };
  const std::vector<int64_t> max_lengths{2, 7, 4, 7};
  auto got = tnt_models::beam_search(
      vocab, max_lengths, tnt_models::NextLogProbsWithParents(next), {.beam_size = k, .alpha = 0.6, .eos_id = kEos});
  REQUIRE(got.size() == max_lengths.size());
  INFO(steps << " steps, " << checked << " rows checked, " << moved << " continued another row");
  CHECK(steps >= 4);
  CHECK(moved >= 3);  // the beams were reordered, so the check above means something
}

TEST_CASE("length-sorted batches", "[transformer][beam]") {
  std::vector<std::vector<int64_t>> src{{1, 1, 1}, {1, 1, 1, 1, 1}, {1}, {1, 1, 1, 1, 1}, {1, 1}};
  auto batches = tnt_models::length_sorted_batches(src, 2);
  CHECK(batches == std::vector<std::vector<int64_t>>{{1, 3}, {0, 4}, {2}});
  CHECK_THROWS_AS(tnt_models::length_sorted_batches(src, 0), tnt::InputError);
}

namespace {

// The shared embedding scaled up, so that next-token distributions are peaked (as in a
// trained model) and near ties rare; EOS's row set to 0 (its logit 0), else a random model
// ends every sentence at once and all translations are the same empty one.
constexpr float kScale = 3.0f, kEosScale = 0.0f;

tnt_models::TransformerParams tiny(int64_t vocab) {
  tnt_models::TransformerParams p;
  p.vocab_size = vocab;
  p.hidden_size = 8;
  p.num_heads = 2;
  p.filter_size = 16;
  p.num_hidden_layers = 2;
  return p;
}

// Random weights, the embedding scaled as above.
std::shared_ptr<tnt::Network> init(tnt_models::Transformer& model, int64_t s, uint64_t seed) {
  auto net = model.training_network(s, 1);
  net->initialize(seed);
  for (auto& np : net->named_parameters()) {
    if (np.name != "embedding.weight") continue;
    float* w = np.param->value.data<float>();
    const int64_t d = np.param->value.dim(1);
    for (int64_t i = 0; i < np.param->value.numel(); ++i) w[i] *= (i / d == kEos ? kEosScale : kScale);
  }
  return net;
}

}  // namespace

TEST_CASE("beam search over a tiny Transformer finds the exhaustive best", "[transformer][beam]") {
  const int64_t vocab = 5, extra = 1;
  tnt_models::Transformer model(tiny(vocab));
  init(model, 2, 11);
  // Sources of 2 ids (a word and EOS): max decode length 2 + 1 = 3 tokens.
  std::vector<std::vector<int64_t>> sources{{2, kEos}, {3, kEos}, {4, kEos}, {0, kEos}};
  // With the key/value cache (the default) and without (the whole prefix every step).
  const bool decode_cache = GENERATE(true, false);
  INFO("decode_cache " << decode_cache);
  tnt_models::Translator translator(model, {.beam_size = 40, .alpha = 0.6, .eos_id = kEos}, extra, decode_cache);
  std::vector<Hypothesis> got = translator.translate_batch(sources);
  REQUIRE(got.size() == sources.size());
  const int64_t s = 2;
  auto encoder = model.encoder_network(s);
  for (size_t b = 0; b < sources.size(); ++b) {
    const tnt::Tensor src = tnt::Tensor::from_data(sources[b].data(), {1, s});
    const tnt::Tensor memory = encoder->forward({src}, tnt::RunContext{}, false).at(0);
    Best want = exhaustive(vocab, s + extra, 0.6, [&](const std::vector<int64_t>& prefix) {
      const int64_t t = static_cast<int64_t>(prefix.size());
      auto decoder = model.decoder_network(s, t);
      const tnt::Tensor ids = tnt::Tensor::from_data(prefix.data(), {1, t});
      const tnt::Tensor logits = decoder->forward({ids, memory, src}, tnt::RunContext{}, false).at(0);  // (1, t, V)
      const float* x = logits.data<float>() + (t - 1) * vocab;
      double mx = -1e30, sum = 0;
      for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, static_cast<double>(x[v]));
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(x[v] - mx);
      std::vector<double> lp(static_cast<size_t>(vocab));
      for (int64_t v = 0; v < vocab; ++v) lp[v] = static_cast<float>(x[v] - mx - std::log(sum));
      return lp;
    });
    INFO("source " << b << ": exhaustive best score " << want.score << ", runner-up " << want.second);
    CHECK(got[b].finished);
    // The decoder runs on 40 beams at once in the search and on one sequence here: float
    // products in another blocking, 1e-5 relative on log probabilities of order 1.
    CHECK(got[b].score == Approx(want.score).epsilon(1e-5));
    if (want.score - want.second > 1e-4) CHECK(got[b].ids == want.ids);
  }
}

TEST_CASE("batched, length-sorted translation gives each sentence its own result, in input order",
          "[transformer][beam]") {
  const int64_t vocab = 9;
  tnt_models::Transformer model(tiny(vocab));
  init(model, 4, 12);
  tnt_models::Translator translator(model, {.beam_size = 4, .alpha = 0.6, .eos_id = kEos}, 4);
  std::vector<std::vector<int64_t>> sources{{2, kEos}, {3, 4, 5, 6, kEos}, {7, kEos},
                                            {8, 2, kEos}, {5, 5, 3, 2, kEos}, {6, kEos}};
  auto batched = translator.translate(sources, 4);
  REQUIRE(batched.size() == sources.size());
  std::set<std::vector<int64_t>> distinct;
  for (size_t i = 0; i < sources.size(); ++i) {
    std::vector<Hypothesis> alone = translator.translate_batch({sources[i]});
    std::vector<int64_t> ids = alone.at(0).ids;
    ids.erase(std::find(ids.begin(), ids.end(), kEos), ids.end());
    INFO("source " << i);
    CHECK(batched[i] == ids);
    distinct.insert(ids);
  }
  // The check above means little if every sentence had the same translation.
  CHECK(distinct.size() >= 3);
  // Sharded over 2 "ranks": each half decodes its batches, together the whole.
  auto part0 = translator.translate(sources, 2, 0, 2);
  auto part1 = translator.translate(sources, 2, 1, 2);
  for (size_t i = 0; i < sources.size(); ++i) {
    INFO("source " << i);
    CHECK((part0[i].empty() != part1[i].empty() || batched[i].empty()));
    CHECK((part0[i].empty() ? part1[i] : part0[i]) == batched[i]);
  }
}
