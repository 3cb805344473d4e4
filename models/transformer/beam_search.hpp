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
// The model is asked, per step, for the next-token log probabilities of every alive row;
// it is also told which row of the previous step each row extends (its parent), because the
// beams are reordered every step. The Translator decodes in one of two ways:
//   - with the key/value cache (default, --decode_cache=true): per decoder layer the
//     self-attention keys and values of the tokens so far are kept per row; each step
//     gathers them by parent, embeds only the last token and runs the decoder on that one
//     position (Transformer::decode_step), attending over the cache; the encoder-decoder
//     keys and values of the memory are projected once per batch. Linear in the output
//     length per step.
//   - without (--decode_cache=false): the decoder is recomputed over the whole prefix (the
//     causal self-attention makes the last position's logits those of the prefix), quadratic
//     per step; kept as the reference the cached path is tested against.
// Both compute the same sums in other blockings, so their log probabilities agree to float
// rounding (tests/e2e/transformer_decode_cache.cpp: same tokens, scores within 1e-5).
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

// The same, also given for every row the row of the previous step it extends (parents, rows
// values in [0, rows), item b's rows always from item b's; empty at the first step), for a
// model that keeps per-row state such as a key/value cache.
using NextLogProbsWithParents = std::function<std::vector<float>(
    const std::vector<int64_t>& ids, const std::vector<int64_t>& parents, int64_t rows, int64_t t)>;

// The search for `batch` items; rows of ids handed to next are item-major
// (item b's beams are rows b*beam .. b*beam+beam-1).
std::vector<Hypothesis> beam_search(int64_t batch, int64_t vocab, int64_t max_decode_length, const NextLogProbs& next,
                                    const BeamSearchOptions& options = {});
// The same with a max decode length per item (the Translator gives each sentence its own
// source length + extra_decode_length, where TF takes the batch's padded length, so that a
// translation does not depend on the sentences it is batched with).
std::vector<Hypothesis> beam_search(int64_t vocab, const std::vector<int64_t>& max_decode_lengths,
                                    const NextLogProbs& next, const BeamSearchOptions& options = {});
std::vector<Hypothesis> beam_search(int64_t vocab, const std::vector<int64_t>& max_decode_lengths,
                                    const NextLogProbsWithParents& next, const BeamSearchOptions& options = {});

// Sentences sorted by length (longest first, stable), cut into batches of at most
// batch_size: each batch a list of indices into the input.
std::vector<std::vector<int64_t>> length_sorted_batches(const std::vector<std::vector<int64_t>>& sources,
                                                        int64_t batch_size);

// Translation with a Transformer's weights: encoder_network once per batch, then with
// decode_cache Transformer::start_decoding once and decode_step per step, else
// decoder_network on the growing prefix. Networks are made per (source length, prefix
// length) and kept.
class Translator {
 public:
  Translator(Transformer& model, const BeamSearchOptions& options, int64_t extra_decode_length,
             bool decode_cache = true);

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
  bool decode_cache_;
  std::map<int64_t, std::shared_ptr<tnt::Network>> encoders_;
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<tnt::Network>> decoders_;
};

}  // namespace tnt_models
