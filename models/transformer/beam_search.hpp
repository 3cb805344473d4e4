// Beam search as TensorFlow Model Garden's transformer v2 decodes (its beam_search.py), and
// the inference path of the Transformer program over the training weights.
//
// Per batch item, `beam` alive sequences (starting from the single sequence [0]) and up to
// `beam` finished ones (ended by EOS). Each step scores every alive sequence's next token,
// keeps the 2*beam best extensions by log probability, of which
//   - those not ending in EOS, best first, become the next alive beams (up to beam);
//   - those ending in EOS get the score log_prob / ((5 + len) / 6)^alpha (len: generated
//     tokens, EOS included) and compete with the finished ones for the beam best.
// The search stops after max_decode_length steps, or as soon as, for every item, the worst
// finished score beats the best that an alive beam could still reach (its log probability
// over the length penalty of max_decode_length). The result is the best finished sequence,
// or the best alive one when none finished.
//
// The decoder is recomputed over the whole prefix at every step (the causal self-attention
// makes the last position's logits those of the prefix): simple and exact, quadratic in the
// output length; a key/value cache is a later optimisation.
#pragma once

#include "model.hpp"

#include <tarantella/tensor.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace tnt_models {

struct BeamSearchOptions {
  int64_t beam_size = 4;
  double alpha = 0.6;
  int64_t eos_id = 1;
};

// ((5 + length) / 6)^alpha
double length_penalty(int64_t length, double alpha);

struct Hypothesis {
  std::vector<int64_t> ids;  // generated tokens, without the leading 0; ends in EOS when finished
  double score = 0;          // finished: log_prob / length_penalty; alive fallback: log_prob
  double log_prob = 0;
  bool finished = false;
};

// ids: (rows, t) row-major, each row a prefix starting with 0; returns the log
// probabilities of the next token, (rows, vocab) row-major.
using NextLogProbs = std::function<std::vector<float>(const std::vector<int64_t>& ids, int64_t rows, int64_t t)>;

// The search for `batch` items; rows of ids handed to next are item-major
// (item b's beams are rows b*beam .. b*beam+beam-1).
std::vector<Hypothesis> beam_search(int64_t batch, int64_t vocab, int64_t max_decode_length, const NextLogProbs& next,
                                    const BeamSearchOptions& options = {});
// The same with a max decode length per item (the Translator gives each sentence its own
// source length + extra_decode_length, where TF takes the batch's padded length, so that a
// translation does not depend on the sentences it is batched with).
std::vector<Hypothesis> beam_search(int64_t vocab, const std::vector<int64_t>& max_decode_lengths,
                                    const NextLogProbs& next, const BeamSearchOptions& options = {});

// Sentences sorted by length (longest first, stable), cut into batches of at most
// batch_size: each batch a list of indices into the input.
std::vector<std::vector<int64_t>> length_sorted_batches(const std::vector<std::vector<int64_t>>& sources,
                                                        int64_t batch_size);

// Translation with a Transformer's weights: encoder_network once per batch, decoder_network
// on the growing prefix. Networks are made per (source length, prefix length) and kept.
class Translator {
 public:
  Translator(Transformer& model, const BeamSearchOptions& options, int64_t extra_decode_length);

  // sources: subtoken ids, each ending in EOS (an empty one gets an EOS). Returns, in the
  // order of sources, each best hypothesis' ids with EOS and what follows removed. Only the
  // batches b with b % num_shards == shard are decoded (the others come back empty), so
  // several ranks can share the work.
  std::vector<std::vector<int64_t>> translate(const std::vector<std::vector<int64_t>>& sources, int64_t batch_size,
                                              int shard = 0, int num_shards = 1);
  // One batch of at most batch_size sources, padded to the longest: the best hypotheses.
  std::vector<Hypothesis> translate_batch(const std::vector<std::vector<int64_t>>& sources);

 private:
  std::shared_ptr<tnt::Network> encoder(int64_t s);
  std::shared_ptr<tnt::Network> decoder(int64_t s, int64_t t);

  Transformer& model_;
  BeamSearchOptions options_;
  int64_t extra_decode_length_;
  std::map<int64_t, std::shared_ptr<tnt::Network>> encoders_;
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<tnt::Network>> decoders_;
};

}  // namespace tnt_models
