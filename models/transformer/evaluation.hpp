// The Transformer program's evaluation: the BLEU source translated on all ranks and scored
// on the master; and the checks, before anything big is allocated, that training and
// decoding fit the rank's memory.
#pragma once

#include "beam_search.hpp"
#include "model.hpp"

#include <tarantella/text/subtokenizer.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tnt_models {

struct BleuInputs {
  std::string source, reference;
  std::vector<std::vector<int64_t>> encoded;  // source lines, EOS-terminated, cut to decode_max_length
  std::vector<std::string> reference_lines;   // as compute_bleu.py reads the reference
};

// Translates the BLEU source on all ranks, gathers on the master, which writes
// <model_dir>/translations.txt atomically and prints the scores. Collective.
void evaluate_bleu(Translator& translator, const tnt::Subtokenizer& tokenizer, const BleuInputs& bleu,
                   int64_t decode_batch_size, const std::string& model_dir);

// Whether the model's training state and one step fit the rank's memory (a lower bound);
// an InputError naming the flags otherwise.
void check_fits_memory(const TransformerParams& p, int64_t sentences, bool half, int64_t batch_size);

// Whether decoding source line `line` of `file` (`length` subtokens) in batches of `batch`
// can fit the rank's memory; an InputError naming the line otherwise.
void check_decode_fits_memory(const TransformerParams& p, int64_t length, int64_t batch, const std::string& file,
                              int64_t line);

}  // namespace tnt_models
