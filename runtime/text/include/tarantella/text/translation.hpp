// The Transformer's translation data: TFRecord shards as TensorFlow's data_download.py
// writes them (and build/bin/transformer_data), read into sentence pairs of token ids.
//
// data_dir holds shards whose names contain the split ("wmt32k-train-00001-of-00100", ...,
// "wmt32k-dev-00001-of-00001"); each record is a tf.train.Example with int64 lists
// "inputs" and "targets" (subtoken ids, each ending in EOS = 1). Shards are read in name
// order; examples with more than max_length ids on either side are dropped (as the
// reference's filter does); the first num_sentences that remain make the data set, each side
// padded with PAD = 0 to max_length.
//
// Batches count TOKENS, as in the tutorial: a global batch of batch_size tokens holds
// batch_size // max_length sentences (sentences_per_batch).
//
//   auto data = tnt::read_translation(dir, "train", {.max_length = 256});
//   int64_t B = tnt::sentences_per_batch(flags.batch_size, 256);     // e.g. 32736 -> 127
//   // automatic distribution: fit() splits every global batch of B over the ranks (unevenly
//   // when they do not divide it; the result equals one rank's)
//   model.fit(tnt::translation_dataset(data, {.seed = 1}), {.batch_size = B, ...});
//   // manual (the tutorial's distribute_dataset=false): every rank reads its own shard
//   auto mine = tnt::translation_dataset_by_rank(data, B, tnt::rank(), tnt::size(), {.seed = 1});
#pragma once

#include "tarantella/dataset.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace tnt {

struct TranslationOptions {
  int64_t max_length = 256;       // T: longer examples are dropped, shorter ones padded
  int64_t num_sentences = 10000;  // sentence pairs kept (an epoch); 0 keeps all
  bool shuffle = true;            // a new order in every epoch, by (seed, epoch)
  uint64_t seed = 0;
};

struct TranslationData {
  Tensor inputs;    // i32 (N, T) source ids, EOS-terminated, PAD after
  Tensor targets;   // i32 (N, T) target ids, likewise
  int64_t records_read = 0;      // records looked at
  int64_t dropped_too_long = 0;  // ... of them longer than max_length
  std::vector<std::string> shards;  // the files, in the order read
  int64_t size() const { return inputs.defined() ? inputs.dim(0) : 0; }
};

// The shards of data_dir whose file names contain split ("train", "dev"), sorted by name
// (names ending in .incomplete or .tmp, which writers leave while they work, are skipped).
// InputError naming data_dir when there is none.
std::vector<std::string> translation_shards(const std::string& data_dir, const std::string& split);

// Reads examples until num_sentences are kept. InputError naming the file and byte
// offset for a corrupt record, a record without "inputs" or "targets", or an id outside
// [0, 2^31); naming data_dir when no example fits max_length.
TranslationData read_translation(const std::string& data_dir, const std::string& split,
                                 const TranslationOptions& options = {});

// batch_size // max_length; InputError when that is 0 (the message names both numbers).
int64_t sentences_per_batch(int64_t batch_size_tokens, int64_t max_length);

// Unbatched samples {inputs i32 (T), targets i32 (T)}, shuffled by (seed, epoch) when
// options.shuffle: for fit() with distribute_dataset (or distribute()).
Dataset translation_dataset(const TranslationData& data, const TranslationOptions& options = {});

// Manual distribution: this rank's micro-batches {inputs i32 (b, T), targets i32 (b, T)} of
// b = global_sentences / size sentences, rank r taking samples r, r + size, ... of the
// (shuffled) order, so that the ranks' batches of a step together are one global batch. A
// last incomplete global batch is dropped. InputError when size does not divide
// global_sentences (automatic distribution splits such batches unevenly).
Dataset translation_dataset_by_rank(const TranslationData& data, int64_t global_sentences, int rank, int size,
                                    const TranslationOptions& options = {});

}  // namespace tnt
