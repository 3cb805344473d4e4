#include "beam_search.hpp"

#include <tarantella/check.hpp>
#include <tarantella/runtime.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace tnt_models {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Beam {
  std::vector<int64_t> seq;  // with the leading 0
  double log_prob = kNegInf;
  double score = kNegInf;  // finished: normalised score
  int64_t parent = 0;      // alive: the row (item * beam + j) of the step that made it
};

struct Candidate {
  int64_t flat;  // beam * vocab + token: ties go to the lower index, as tf.nn.top_k
  double log_prob;
};

}  // namespace

double length_penalty(int64_t length, double alpha) {
  return std::pow((5.0 + static_cast<double>(length)) / 6.0, alpha);
}

std::vector<Hypothesis> beam_search(int64_t batch, int64_t vocab, int64_t max_decode_length, const NextLogProbs& next,
                                    const BeamSearchOptions& options) {
  return beam_search(vocab, std::vector<int64_t>(static_cast<size_t>(batch), max_decode_length), next, options);
}

std::vector<Hypothesis> beam_search(int64_t vocab, const std::vector<int64_t>& max_decode_lengths,
                                    const NextLogProbs& next, const BeamSearchOptions& options) {
  return beam_search(
      vocab, max_decode_lengths,
      [&](const std::vector<int64_t>& ids, const std::vector<int64_t>&, int64_t rows, int64_t t) {
        return next(ids, rows, t);
      },
      options);
}

std::vector<Hypothesis> beam_search(int64_t vocab, const std::vector<int64_t>& max_decode_lengths,
                                    const NextLogProbsWithParents& next, const BeamSearchOptions& options) {
  const int64_t k = options.beam_size;
  const int64_t batch = static_cast<int64_t>(max_decode_lengths.size());
  TNT_INPUT_CHECK(k >= 1, "beam search: beam size {} must be positive", k);
  int64_t max_decode_length = 0;
  for (int64_t m : max_decode_lengths) {
    TNT_INPUT_CHECK(m >= 1, "beam search: max decode length {} must be positive", m);
    max_decode_length = std::max(max_decode_length, m);
  }
  TNT_CHECK(vocab > options.eos_id, "beam search: vocabulary of {} has no EOS id {}", vocab, options.eos_id);
  // alive[b][j], finished[b][j]: item b's beams. One live start sequence [0] per item; the
  // other slots are placeholders that never win (log probability -inf).
  std::vector<std::vector<Beam>> alive(static_cast<size_t>(batch), std::vector<Beam>(static_cast<size_t>(k)));
  std::vector<std::vector<Beam>> finished(static_cast<size_t>(batch));
  for (auto& a : alive) {
    for (auto& beam : a) beam.seq = {0};
    a[0].log_prob = 0;
  }
  for (int64_t step = 0; step < max_decode_length; ++step) {
    const int64_t t = step + 1;  // prefix length, the leading 0 included
    std::vector<int64_t> ids(static_cast<size_t>(batch * k * t));  // (batch * k, t)
    std::vector<int64_t> parents;                                   // (batch * k), from the second step on
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < k; ++j) {
        std::copy(alive[b][j].seq.begin(), alive[b][j].seq.end(), ids.begin() + (b * k + j) * t);
        if (step > 0) parents.push_back(alive[b][j].parent);
      }
    const std::vector<float> lp = next(ids, parents, batch * k, t);  // (batch * k, vocab)
    TNT_CHECK(static_cast<int64_t>(lp.size()) == batch * k * vocab, "beam search: {} log probabilities for {} rows of {}",
              lp.size(), batch * k, vocab);
    bool all_bounded = true;
    for (int64_t b = 0; b < batch; ++b) {
      if (step >= max_decode_lengths[b]) {  // this item is done; the others go on
        for (int64_t j = 0; j < k; ++j) alive[b][j].parent = b * k + j;  // its rows continue themselves
        continue;
      }
      // The 2k best extensions of the alive beams.
      std::vector<Candidate> cand;
      cand.reserve(static_cast<size_t>(k * vocab));
      for (int64_t j = 0; j < k; ++j) {
        const double base = alive[b][j].log_prob;
        if (base == kNegInf) continue;
        for (int64_t v = 0; v < vocab; ++v) {
          const double x = base + static_cast<double>(lp[static_cast<size_t>((b * k + j) * vocab + v)]);
          if (x != kNegInf) cand.push_back({j * vocab + v, x});  // an impossible token is no candidate
        }
      }
      const size_t keep = std::min(cand.size(), static_cast<size_t>(2 * k));
      std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keep), cand.end(),
                        [](const Candidate& x, const Candidate& y) {
                          return x.log_prob > y.log_prob || (x.log_prob == y.log_prob && x.flat < y.flat);
                        });
      cand.resize(keep);
      std::vector<Beam> new_alive;
      std::vector<Beam> new_finished = finished[b];  // earlier finished first: they win ties
      for (const Candidate& c : cand) {
        Beam beam;
        beam.seq = alive[b][c.flat / vocab].seq;
        beam.parent = b * k + c.flat / vocab;
        const int64_t token = c.flat % vocab;
        beam.seq.push_back(token);
        beam.log_prob = c.log_prob;
        if (token == options.eos_id) {
          beam.score = c.log_prob / length_penalty(t, options.alpha);  // t generated tokens
          new_finished.push_back(std::move(beam));
        } else if (static_cast<int64_t>(new_alive.size()) < k) {
          new_alive.push_back(std::move(beam));
        }
      }
      while (static_cast<int64_t>(new_alive.size()) < k) {  // placeholders
        Beam beam;
        beam.seq = alive[b][0].seq;
        beam.seq.push_back(0);
        beam.parent = b * k;
        new_alive.push_back(std::move(beam));
      }
      std::stable_sort(new_finished.begin(), new_finished.end(),
                       [](const Beam& x, const Beam& y) { return x.score > y.score; });
      if (static_cast<int64_t>(new_finished.size()) > k) new_finished.resize(static_cast<size_t>(k));
      alive[b] = std::move(new_alive);
      finished[b] = std::move(new_finished);
      // Can an alive beam still beat the worst finished one? Not once its log probability
      // over the largest length penalty is below it (log probabilities only fall).
      const double best_alive = alive[b][0].log_prob / length_penalty(max_decode_lengths[b], options.alpha);
      const bool bounded =
          step + 1 >= max_decode_lengths[b] || (!finished[b].empty() && finished[b].back().score > best_alive);
      all_bounded = all_bounded && bounded;
    }
    if (all_bounded) break;
  }
  std::vector<Hypothesis> out(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const bool done = !finished[b].empty();
    const Beam& best = done ? finished[b][0] : alive[b][0];
    out[b].ids.assign(best.seq.begin() + 1, best.seq.end());
    out[b].log_prob = best.log_prob;
    out[b].score = done ? best.score : best.log_prob;
    out[b].finished = done;
  }
  return out;
}

std::vector<std::vector<int64_t>> length_sorted_batches(const std::vector<std::vector<int64_t>>& sources,
                                                        int64_t batch_size) {
  TNT_INPUT_CHECK(batch_size >= 1, "--decode_batch_size={}: must be positive", batch_size);
  std::vector<int64_t> order(sources.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return sources[a].size() > sources[b].size(); });
  std::vector<std::vector<int64_t>> batches;
  for (size_t i = 0; i < order.size(); i += static_cast<size_t>(batch_size)) {
    const size_t end = std::min(order.size(), i + static_cast<size_t>(batch_size));
    batches.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return batches;
}

Translator::Translator(Transformer& model, const BeamSearchOptions& options, int64_t extra_decode_length,
                       bool decode_cache)
    : model_(model), options_(options), extra_decode_length_(extra_decode_length), decode_cache_(decode_cache) {}

std::shared_ptr<tnt::Network> Translator::encoder(int64_t s) {
  auto& net = encoders_[s];
  if (!net) {
    net = model_.encoder_network(s);
    net->to(tnt::default_device());
  }
  return net;
}

std::shared_ptr<tnt::Network> Translator::decoder(int64_t s, int64_t t) {
  auto& net = decoders_[{s, t}];
  if (!net) {
    net = model_.decoder_network(s, t);
    net->to(tnt::default_device());
  }
  return net;
}

std::vector<Hypothesis> Translator::translate_batch(const std::vector<std::vector<int64_t>>& sources) {
  const int64_t batch = static_cast<int64_t>(sources.size());
  if (batch == 0) return {};
  const int64_t k = options_.beam_size;
  const int64_t vocab = model_.params().vocab_size;
  const int64_t hidden = model_.params().hidden_size;
  int64_t s = 1;
  for (const auto& src : sources) s = std::max<int64_t>(s, static_cast<int64_t>(src.size()));
  std::vector<int64_t> max_lengths;  // each sentence's own: the result does not depend on the batch
  for (const auto& src : sources)
    max_lengths.push_back(std::max<int64_t>(1, static_cast<int64_t>(src.size())) + extra_decode_length_);
  const tnt::Device device = tnt::default_device();
  // Sources padded to the longest (B, S), and once more per beam (B * k, S).
  tnt::Tensor src = tnt::Tensor::zeros({batch, s}, tnt::DType::i64);
  tnt::Tensor src_tiled = tnt::Tensor::zeros({batch * k, s}, tnt::DType::i64);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> ids = sources[b];
    if (ids.empty()) ids.push_back(options_.eos_id);
    std::copy(ids.begin(), ids.end(), src.data<int64_t>() + b * s);
    for (int64_t j = 0; j < k; ++j) std::copy(ids.begin(), ids.end(), src_tiled.data<int64_t>() + (b * k + j) * s);
  }
  tnt::RunContext rc;
  rc.training = false;
  rc.device = device;
  const tnt::Tensor memory = encoder(s)->forward({src.to(device)}, rc, false).at(0).to(tnt::Device::cpu());  // (B, S, D)
  tnt::Tensor memory_tiled = tnt::Tensor::empty({batch * k, s, hidden}, tnt::DType::f32);  // (B * k, S, D)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < k; ++j)
      std::copy(memory.data<float>() + b * s * hidden, memory.data<float>() + (b + 1) * s * hidden,
                memory_tiled.data<float>() + (b * k + j) * s * hidden);
  const tnt::Tensor memory_dev = memory_tiled.to(device);
  const tnt::Tensor src_dev = src_tiled.to(device);

  // With the cache, the decoder state of every row (its layers' keys and values) follows
  // the beams: the search names each row's parent, decode_step reorders and extends.
  Transformer::DecoderCache cache;
  if (decode_cache_) cache = model_.start_decoding(memory_dev, src_dev, rc);

  auto next = [&](const std::vector<int64_t>& ids, const std::vector<int64_t>& parents, int64_t rows, int64_t t) {
    tnt::Tensor logits;     // (B * k, positions, V)
    int64_t positions = t;  // the uncached decoder gives every position's logits, the last is wanted
    if (decode_cache_) {
      TNT_CHECK(cache.length == t - 1, "beam search: the decoder cache holds {} positions at step {}", cache.length, t);
      std::vector<int64_t> last(static_cast<size_t>(rows));  // (B * k): position t - 1 of every row
      for (int64_t r = 0; r < rows; ++r) last[static_cast<size_t>(r)] = ids[static_cast<size_t>(r * t + t - 1)];
      const tnt::Tensor last_ids = tnt::Tensor::from_data(last.data(), {rows, 1});
      logits = model_.decode_step(cache, last_ids.to(device), parents, rc).to(tnt::Device::cpu());
      positions = 1;
    } else {
      const tnt::Tensor dec = tnt::Tensor::from_data(ids.data(), {rows, t});  // (B * k, t)
      logits = decoder(s, t)->forward({dec.to(device), memory_dev, src_dev}, rc, false).at(0).to(tnt::Device::cpu());
    }
    std::vector<float> lp(static_cast<size_t>(rows * vocab));  // (B * k, V): log_softmax of the last position
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = logits.data<float>() + (r * positions + positions - 1) * vocab;
      double mx = x[0];
      for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(x[v]));
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(x[v]) - mx);
      const double lse = mx + std::log(sum);
      for (int64_t v = 0; v < vocab; ++v) lp[static_cast<size_t>(r * vocab + v)] = static_cast<float>(x[v] - lse);
    }
    return lp;
  };
  return beam_search(vocab, max_lengths, next, options_);
}

std::vector<std::vector<int64_t>> Translator::translate(const std::vector<std::vector<int64_t>>& sources,
                                                        int64_t batch_size, int shard, int num_shards) {
  std::vector<std::vector<int64_t>> out(sources.size());
  const auto batches = length_sorted_batches(sources, batch_size);
  for (size_t i = 0; i < batches.size(); ++i) {
    if (static_cast<int>(i % static_cast<size_t>(num_shards)) != shard) continue;
    std::vector<std::vector<int64_t>> group;
    for (int64_t idx : batches[i]) group.push_back(sources[static_cast<size_t>(idx)]);
    std::vector<Hypothesis> best = translate_batch(group);
    for (size_t j = 0; j < best.size(); ++j) {
      std::vector<int64_t> ids = best[j].ids;
      auto eos = std::find(ids.begin(), ids.end(), options_.eos_id);
      ids.erase(eos, ids.end());
      out[static_cast<size_t>(batches[i][j])] = std::move(ids);
    }
  }
  return out;
}

}  // namespace tnt_models
