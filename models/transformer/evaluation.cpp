// The Transformer program's evaluation (BLEU on the translations of a source file) and its
// checks that training and decoding fit the rank's memory (evaluation.hpp).
#include "evaluation.hpp"

#include "common/flags.hpp"
#include "common/wording.hpp"

#include <tarantella/tarantella.hpp>
#include <tarantella/text/bleu.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace tnt_models {

namespace {

namespace fs = std::filesystem;

std::string serialize_translations(const std::vector<std::vector<int64_t>>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i].empty()) continue;
    fmt::format_to(std::back_inserter(out), "{}:", i);
    for (int64_t id : ids[i]) fmt::format_to(std::back_inserter(out), " {}", id);
    out.push_back('\n');
  }
  return out;
}

void deserialize_translations(const std::string& text, std::vector<std::vector<int64_t>>& ids) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    TNT_CHECK(colon != std::string::npos, "translations from another rank: bad line '{}'", line);
    const size_t idx = std::stoul(line.substr(0, colon));
    TNT_CHECK(idx < ids.size(), "translations from another rank: sentence {} of {}", idx, ids.size());
    std::istringstream nums(line.substr(colon + 1));
    int64_t v;
    ids[idx].clear();
    while (nums >> v) ids[idx].push_back(v);
  }
}

}  // namespace

// Translates the BLEU source on all ranks, gathers on the master, which writes
// <model_dir>/translations.txt atomically (one line per source line, empty ones included)
// and prints the scores of its translations against the reference's lines. Collective.
void evaluate_bleu(tnt_models::Translator& translator, const tnt::Subtokenizer& tokenizer, const BleuInputs& bleu,
                   int64_t decode_batch_size, const std::string& model_dir) {
  const auto start = std::chrono::steady_clock::now();
  if (tnt::is_master_rank()) {
    // Said first: decoding a long sentence takes long, and nothing else is printed until
    // the scores come.
    size_t longest = 0;
    for (const auto& ids : bleu.encoded) longest = std::max(longest, ids.size());
    tnt::print("Translating {} of {} for BLEU ({}; the longest has {} subtokens{})",
               tnt_models::count_of(static_cast<int64_t>(bleu.encoded.size()), "sentence"), bleu.source,
               tnt_models::count_of(tnt::size(), "rank"), longest,
               longest > 512 ? ", which takes long to decode: --decode_max_length=N cuts the sources" : "");
  }
  std::vector<std::vector<int64_t>> mine;
  std::string failure;
  try {
    mine = translator.translate(bleu.encoded, decode_batch_size, tnt::rank(), tnt::size());
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Every rank's translations (or its error) reach every rank, one broadcast per rank.
  std::vector<std::vector<int64_t>> all(bleu.encoded.size());
  std::string first_failure;
  for (int r = 0; r < tnt::size(); ++r) {
    std::string blob = r == tnt::rank() ? (failure.empty() ? "ok\n" + serialize_translations(mine) : "error\n" + failure) : "";
    tnt::communicator().broadcast(blob, r);
    if (blob.rfind("error\n", 0) == 0) {
      if (first_failure.empty()) first_failure = fmt::format("translating on rank {}: {}", r, blob.substr(6));
    } else if (tnt::is_master_rank()) {
      deserialize_translations(blob.substr(3), all);
    }
  }
  if (!first_failure.empty()) throw tnt::Error(first_failure);

  std::string verdict;  // the master's: "" or what went wrong
  if (tnt::is_master_rank()) {
    try {
      const std::string path = model_dir + "/translations.txt";
      std::vector<std::string> translations;
      translations.reserve(all.size());
      for (const auto& ids : all) translations.push_back(tokenizer.decode(ids));
      std::string text;
      for (const std::string& line : translations) text += line + "\n";
      tnt::write_file_atomically(path, text, fmt::format("--model_dir={}: translations", model_dir));
      // The translations in hand, line i for source line i (an empty one scores nothing),
      // not the file read back: compute_bleu.py's reading strips blank lines at the file's
      // ends, which would misalign the lines after an empty first or last translation.
      const double uncased = tnt::bleu_on_lines(bleu.reference_lines, translations, /*case_sensitive=*/false);
      const double cased = tnt::bleu_on_lines(bleu.reference_lines, translations, /*case_sensitive=*/true);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      tnt::print("Translated {} of {} in {:.1f} s ({}) into {}", tnt_models::count_of(static_cast<int64_t>(all.size()), "sentence"),
                 bleu.source, seconds, tnt_models::count_of(tnt::size(), "rank"), path);
      tnt::print("Bleu score (uncased): {}", tnt::format_bleu(uncased));
      tnt::print("Bleu score (cased): {}", tnt::format_bleu(cased));
    } catch (const std::exception& e) {
      verdict = e.what();
      if (verdict.empty()) verdict = "evaluation failed";
    }
  }
  tnt::communicator().broadcast(verdict, tnt::master_rank());
  if (!verdict.empty()) throw tnt::InputError(verdict);
}

// Before anything big is allocated: whether the model's training state and one step's
// activations fit the rank's memory (the host's, shared by its local ranks; or the GPU's).
// A lower bound: the weights with their gradients and Adam's moments (and the half copy in
// mixed precision), the activations every layer must keep for backward (below), the
// attention weights of every attention (encoder self, decoder self, encoder-decoder: heads x
// max_length^2 per sentence and layer) and the logits with their gradient. A model that passes may still not fit; one that
// fails cannot, and would otherwise end in the kernel's out-of-memory killer (no message).
void check_fits_memory(const tnt_models::TransformerParams& p, int64_t sentences, bool half, int64_t batch_size) {
  const tnt_models::RankMemory memory = tnt_models::rank_memory();
  const tnt::Device device = memory.device;
  const double capacity = memory.capacity;
  if (capacity == 0) return;  // unknown: nothing to compare with
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double params = static_cast<double>(tnt_models::transformer_parameter_count(p));
  const double state = params * (half ? 18.0 : 16.0);
  const double rows = std::ceil(static_cast<double>(sentences) / tnt::size());
  const double t = static_cast<double>(p.max_length), elt = half ? 2.0 : 4.0;
  // Per layer pair and token, what backward must keep at the least: the encoder layer's
  // input, its two LayerNorm outputs, q, k, v and the attention's output, the FFN's hidden
  // activation (linear1's output, ReLU and dropout applied in it); the decoder layer's the
  // same plus the encoder-decoder attention's: 16 hidden + 2 filter values. The attention weights once per attention
  // (twice with attention dropout: before and after it), except where the fused CUDA
  // attention runs (TNT_FUSED_ATTENTION, on by default, on a GPU in bf16/fp16 with a head depth of 16 to 128
  // in steps of 16, the runtime's rule in layers/attention_fused.hpp), or cuDNN's
  // (TNT_CUDNN_ATTENTION): it keeps none. (Where
  // the fused kernels do not fit a GPU's shared memory, e.g. depth 128 on an A100, the
  // unfused engine runs; the check, a lower bound, then counts less than is kept.)
  const int64_t depth = p.num_heads > 0 ? p.hidden_size / p.num_heads : 0;
  // TNT_CUDNN_ATTENTION's engine (depth a multiple of 8 up to 128; at auto it may run) keeps
  // none either: only its per-row statistics.
  const bool fused = device.is_cuda() && half && depth >= 8 && depth <= 128 &&
                     ((tnt::config().fused_attention && depth >= 16 && depth % 16 == 0) ||
                      (!tnt::config().cudnn_attention.off() && depth % 8 == 0));
  const double attention_copies = fused ? 0.0 : p.attention_dropout > 0 ? 2.0 : 1.0;
  const double layers = static_cast<double>(p.num_hidden_layers);
  const double h = static_cast<double>(p.hidden_size), f = static_cast<double>(p.filter_size);
  const double step = rows * elt *
                      (3.0 * attention_copies * layers * static_cast<double>(p.num_heads) * t * t +
                       layers * t * (16.0 * h + 2.0 * f) + 2.0 * t * static_cast<double>(p.vocab_size));
  TNT_INPUT_CHECK(state + step <= capacity,
                  "the model and one training step need at least {:.1f} GiB per rank, more than the {:.1f} GiB of {}: "
                  "{:.0f} parameters (--hidden_size={}, --filter_size={}, --num_hidden_layers={}, {} subtokens) take "
                  "{:.1f} GiB with their gradients and Adam's moments, and one step's activations, attention weights "
                  "(--num_heads={}) and logits for {} of --max_length={} tokens (--batch_size={} over {}) take {:.1f} "
                  "GiB; make the model or the batch smaller",
                  (state + step) / gib, capacity / gib,
                  memory.what,
                  params, p.hidden_size, p.filter_size, p.num_hidden_layers, p.vocab_size, state / gib, p.num_heads,
                  tnt_models::count_of(static_cast<int64_t>(rows), "sentence"), p.max_length, batch_size,
                  tnt_models::count_of(tnt::size(), "rank"), step / gib);
}

// Before training: whether decoding the source line `line` of `file` (its `length` subtokens,
// EOS included) can fit the rank's memory, so that an over-long line (a whole document on one
// line) is refused at the start, naming it, rather than failing after the training with an
// allocation of terabytes. A lower bound for a decode batch of `batch` sentences padded to
// this one: the encoder's attention weights (heads x length^2 per sentence), and for each of
// the beam's hypotheses the decoder's key/value cache over length + extra_decode_length
// positions and the encoder-decoder attention over the source.
void check_decode_fits_memory(const tnt_models::TransformerParams& p, int64_t length, int64_t batch,
                              const std::string& file, int64_t line) {
  const tnt_models::RankMemory memory = tnt_models::rank_memory();
  const double capacity = memory.capacity;
  if (capacity == 0) return;
  const double l = static_cast<double>(length), b = static_cast<double>(batch), elt = 4.0;
  const double decode = l + static_cast<double>(p.extra_decode_length);
  const double heads = static_cast<double>(p.num_heads), beam = static_cast<double>(p.beam_size);
  const double need = b * elt *
                      (heads * l * l + beam * static_cast<double>(p.num_hidden_layers) *
                                           (2.0 * decode * static_cast<double>(p.hidden_size) + heads * l));
  if (need <= capacity) return;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  TNT_INPUT_ERROR("--bleu_source={} line {}: {} subtokens; decoding it in a batch of {} (--decode_batch_size) needs at "
                  "least {:.1f} GiB (attention of --num_heads={} over {}^2 positions, a key/value cache of --beam_size={} "
                  "over {} + --extra_decode_length={} positions), more than the {:.1f} GiB of {}: cut the sources "
                  "with --decode_max_length (e.g. --decode_max_length={}), or split that line",
                  file, line, length, batch, need / gib, p.num_heads, length, p.beam_size, length,
                  p.extra_decode_length, capacity / gib,
                  memory.what,
                  std::max<int64_t>(p.max_length, 2));
}

}  // namespace tnt_models
