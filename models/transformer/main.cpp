// The Transformer (TF Model Garden's transformer v2, the Tarantella tutorial's second program)
// on TensorFlow's translation data, data parallel:
//
//   tarantella --hostfile ./hostfile --devices-per-node 4 -- build/bin/transformer
//       --data_dir=$WMT14_PATH --vocab_file=$WMT14_PATH/vocab.ende.32768
//       --bleu_ref=$WMT14_PATH/newstest2014.de --bleu_source=$WMT14_PATH/newstest2014.en
//       --param_set=big --train_epochs=30 --epochs_between_evals=30 --batch_size=32736
//   (one command line)
//
// --batch_size counts TOKENS: a global batch holds batch_size // max_length sentences, each
// padded to max_length. With --auto_data_dist (default) fit() splits every global batch over
// the ranks, unevenly when they do not divide it, and the loss is averaged over the GLOBAL
// number of real target tokens, so p ranks give one rank's result. With
// --auto_data_dist=false (the tutorial's manual mode, fit's distribute_dataset=false) every
// rank takes sentences // ranks sentences a step, the data batched by that many and the
// batches dealt to the ranks in turn; when the ranks do not divide the sentences, a global
// batch is that many times the ranks, fewer sentences than --batch_size gives (said once at
// the start). --micro_batch_size (tokens per rank) sets --batch_size to micro x ranks.
//
// As the tutorial writes it, training is fit(initial_epoch, epochs) in a loop with an
// evaluation after every --epochs_between_evals epochs: the source file is translated by
// beam search (models/transformer/beam_search.hpp; with a key/value cache unless
// --decode_cache=false) and scored with BLEU against the reference. All ranks decode (batch
// i of the length-sorted sentences on rank i % p) and the master gathers, writes
// <model_dir>/translations.txt (one line per source line) and prints the scores of the
// translations it holds against the reference's lines (an empty translation is a line that
// scores nothing; read back from the file, compute_bleu.py would drop it at the file's
// start or end); no rank waits on a collective for longer than the imbalance of that split.
// <model_dir>/model.safetensors is written after every fit() call, before its evaluation,
// so a failed evaluation cannot lose the trained weights.
#include "beam_search.hpp"
#include "evaluation.hpp"
#include "model.hpp"

#include "common/flags.hpp"
#include "common/signals.hpp"
#include "common/wording.hpp"

#include <tarantella/text/bleu.hpp>
#include <tarantella/tarantella.hpp>
#include <tarantella/text/subtokenizer.hpp>
#include <tarantella/text/translation.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

namespace {

namespace fs = std::filesystem;
using tnt_models::BleuInputs;
using tnt_models::check_decode_fits_memory;
using tnt_models::check_fits_memory;
using tnt_models::evaluate_bleu;

// One training sample (or batch) {inputs (..., T), targets (..., T)} of i32 ids ->
// {inputs, decoder inputs = targets shifted right (0 first, the last id dropped), targets},
// all i64, as the training network takes them.
tnt::Element add_decoder_inputs(tnt::Element e) {
  TNT_CHECK(e.size() == 2, "translation sample: {} columns, expected inputs and targets", e.size());
  const tnt::Tensor& src = e[0];
  const tnt::Tensor& tgt = e[1];
  const int64_t t = tgt.shape().back();
  const int64_t rows = tgt.numel() / t;
  tnt::Tensor src64 = tnt::Tensor::empty(src.shape(), tnt::DType::i64);
  tnt::Tensor tgt64 = tnt::Tensor::empty(tgt.shape(), tnt::DType::i64);
  tnt::Tensor dec64 = tnt::Tensor::empty(tgt.shape(), tnt::DType::i64);
  for (int64_t i = 0; i < src.numel(); ++i) src64.data<int64_t>()[i] = src.data<int32_t>()[i];
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* in = tgt.data<int32_t>() + r * t;
    int64_t* out = tgt64.data<int64_t>() + r * t;
    int64_t* dec = dec64.data<int64_t>() + r * t;
    dec[0] = 0;
    for (int64_t i = 0; i < t; ++i) {
      out[i] = in[i];
      if (i + 1 < t) dec[i + 1] = in[i];
    }
  }
  return {src64, dec64, tgt64};
}

// Lines as TF's translate_file reads them: split at '\n', each stripped, a last empty one
// (the file's final newline) dropped.
std::vector<std::string> read_source_lines(const std::string& path, const std::string& flag) {
  std::ifstream in = tnt::open_text_file(path, "--" + flag);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<std::string> lines;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    const std::string_view line =
        std::string_view(text).substr(start, end == std::string::npos ? std::string::npos : end - start);
    try {
      lines.push_back(tnt::strip_whitespace(line));
    } catch (const tnt::InputError& e) {
      TNT_INPUT_ERROR("--{}={}: line {}: {}", flag, path, lines.size() + 1, e.what());
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// Tokens per second of training (padded tokens: sentences * max_length, what the step
// computes on), from the time between consecutive step ends of an epoch.
class TokenThroughput : public tnt::Callback {
 public:
  TokenThroughput(int64_t sentences, int64_t max_length)
      : tnt::Callback(Ranks::master), sentences_(sentences), max_length_(max_length) {}
  void on_epoch_begin(int, const tnt::Logs&) override { have_last_ = false; }
  void on_train_batch_end(int64_t, const tnt::Logs&) override {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    if (have_last_) {
      seconds_ += t - last_;
      ++steps_;
    }
    last_ = t;
    have_last_ = true;
  }
  void on_train_end(const tnt::Logs&) override {
    if (steps_ == 0) return;
    const double tokens = static_cast<double>(sentences_ * max_length_ * steps_);
    tnt::print("tokens/s: {:.0f} ({} x {} per global batch, {}, {}, {:.1f} ms/step)", tokens / seconds_,
               tnt_models::count_of(sentences_, "sentence"), tnt_models::count_of(max_length_, "token"),
               tnt_models::count_of(tnt::size(), "rank"), tnt_models::count_of(steps_, "timed step"),
               1e3 * seconds_ / static_cast<double>(steps_));
  }

 private:
  int64_t sentences_, max_length_;
  bool have_last_ = false;
  double last_ = 0, seconds_ = 0;
  int64_t steps_ = 0;
};

// The Transformer's loss, keeping what it divides by: the real (not padding) target tokens
// of the step's GLOBAL batch, which Model sums over the ranks before the loss runs
// (loss.hpp's normalizes_by_tokens). --enable_time_history counts them, so that its tokens/s
// are those of the sentences and not of their padding.
class TokenCountingLoss : public tnt::LabelSmoothingCrossEntropy {
 public:
  using tnt::LabelSmoothingCrossEntropy::LabelSmoothingCrossEntropy;
  tnt::Tensor forward(const tnt::Tensor& logits, const tnt::Tensor& labels, int64_t global_tokens,
                      tnt::SavedState& saved) override {
    last_tokens_ = global_tokens;
    return tnt::LabelSmoothingCrossEntropy::forward(logits, labels, global_tokens, saved);
  }
  int64_t last_tokens() const { return last_tokens_; }

 private:
  int64_t last_tokens_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  tnt_models::hold_warning_signals();  // first: a warning while the program starts is kept
  const tnt_models::TransformerParams base;
  tnt_models::ProgramFlags flags(
      "transformer",
      "Trains the Transformer (TF Model Garden's transformer v2) on TensorFlow's translation data (TFRecord shards and "
      "a subword vocabulary), data parallel over the ranks that tarantella starts; evaluates BLEU with beam search.\n"
      "--batch_size counts TOKENS: a global batch holds batch_size // max_length sentences.",
      {"tarantella --hostfile ./hostfile --devices-per-node 4 -- build/bin/transformer \\\n"
       "--data_dir=$WMT14_PATH --vocab_file=$WMT14_PATH/vocab.ende.32768 \\\n"
       "--bleu_ref=$WMT14_PATH/newstest2014.de --bleu_source=$WMT14_PATH/newstest2014.en \\\n"
       "--param_set=big --train_epochs=30 --epochs_between_evals=30 --batch_size=32736",
       "scripts/demo transformer   (generates a small English-German corpus, trains tiny on 2 ranks)",
       "tarantella -n 2 -- build/bin/transformer --data_dir=transformer_demo/data \\\n"
       "--vocab_file=transformer_demo/data/vocab.ende.1000 --bleu_source=transformer_demo/dev.en \\\n"
       "--bleu_ref=transformer_demo/dev.de --param_set=tiny --max_length=24 --batch_size=1536",
       "tarantella -n 2 -- build/bin/transformer ... --resume   (continue the run in --model_dir)",
       "tarantella -n 4 -- build/bin/transformer ... --auto_data_dist=false   (manual sharding by rank)",
       "tarantella -n 2 -- build/bin/transformer ... --enable_time_history --log_steps=10 --enable_tensorboard \\\n"
       "--profile_steps=2,3   (real tokens/s every 10 steps; a timeline of steps 2-3)"},
      {.data_dir = "",
       .data_dir_help = "directory with the TFRecord shards *train* and *dev* (as TensorFlow's data_download.py or "
                        "build/bin/transformer_data write them)",
       .model_dir = "./transformer_model",
       .model_dir_help = "where history.csv, checkpoint.safetensors, model.safetensors and translations.txt go",
       .batch_size = 4096,
       .train_epochs = 1,
       .epochs_between_evals_help = "translate --bleu_source and print BLEU every this many epochs",
       .seed_help = "seed of weights, dropout and shuffling",
       .verbose = 2,
       .micro_batch_size_help =
           "TOKENS per rank and step: the global batch is then micro_batch_size x ranks tokens, (micro_batch_size x "
           "ranks) // max_length sentences, so a weak-scaling series keeps this flag and changes only the ranks; "
           "e.g. tarantella -n 4 -- build/bin/transformer ... --micro_batch_size=4096 trains on global batches of "
           "16384 tokens. 0: --batch_size alone; given with --batch_size, batch_size must be micro_batch_size x "
           "ranks"});
  // clang-format off
  flags.add_options()
    ("vocab_file", "subtoken vocabulary (TensorFlow's format, e.g. vocab.ende.32768)", cxxopts::value<std::string>()->default_value(""))
    ("bleu_source", "source sentences to translate for BLEU (one per line)", cxxopts::value<std::string>()->default_value(""))
    ("bleu_ref", "reference translations of --bleu_source (one per line)", cxxopts::value<std::string>()->default_value(""))
    ("param_set", "tiny, base or big (the Model Garden's sets; the flags below override single values)", cxxopts::value<std::string>()->default_value("big"))
    ("num_sentences", "sentence pairs per epoch (the first ones that fit max_length); 0 = all", cxxopts::value<int64_t>()->default_value("10000"))
    ("auto_data_dist", "let fit() split every global batch over the ranks (false: the tutorial's manual sharding: each rank takes sentences // ranks sentences a step, so a global batch the ranks do not divide shrinks to the nearest multiple of the ranks)", cxxopts::value<bool>()->default_value("true"))
    ("decode_batch_size", "sentences per beam-search batch", cxxopts::value<int64_t>()->default_value("32"))
    ("decode_cache", "beam search keeps each decoder layer's keys and values of the tokens so far and runs the decoder on the new position only (false: recomputes the whole prefix every step, the reference)", cxxopts::value<bool>()->default_value("true"))
    ("decode_max_length", "source sentences are cut to this many subtokens (EOS included) for decoding; 0 = no cut, as TensorFlow's translate_file", cxxopts::value<int64_t>()->default_value("0"))
    ("resume", std::string("continue from <model_dir>/checkpoint.safetensors") + tnt_models::kResumeAutoHelp, tnt_models::resume_flag_value())
    ("dtype", "fp32, bf16 or fp16: the last two are mixed precision with fp32 master weights (fp16 with dynamic loss scaling); on a CPU rank only emulated", cxxopts::value<std::string>()->default_value("fp32"))
    ("vocab_size", "default: the vocabulary file's size (a larger value pads the embedding)", cxxopts::value<int64_t>())
    ("hidden_size", "model width (param set)", cxxopts::value<int64_t>())
    ("num_hidden_layers", "layers per stack (param set)", cxxopts::value<int64_t>())
    ("num_heads", "attention heads (param set)", cxxopts::value<int64_t>())
    ("filter_size", "feed-forward width (param set)", cxxopts::value<int64_t>())
    ("layer_postprocess_dropout", "dropout after each sublayer and the embedding (0.1)", cxxopts::value<double>())
    ("attention_dropout", "dropout of the attention weights (0.1)", cxxopts::value<double>())
    ("relu_dropout", "dropout inside the feed-forward block (0.1)", cxxopts::value<double>())
    ("label_smoothing", "label smoothing of the loss (0.1)", cxxopts::value<double>())
    ("learning_rate", "scale of the schedule scale * hidden^-0.5 * min(1, step/warmup) / sqrt(max(step, warmup)) (2.0)", cxxopts::value<double>())
    ("learning_rate_warmup_steps", "warmup steps of the schedule (16000)", cxxopts::value<int64_t>())
    ("optimizer_adam_beta1", "Adam beta1 (0.9)", cxxopts::value<double>())
    ("optimizer_adam_beta2", "Adam beta2 (0.997)", cxxopts::value<double>())
    ("optimizer_adam_epsilon", "Adam epsilon (1e-9)", cxxopts::value<double>())
    ("max_length", "longest sentence (subtokens, EOS included) kept for training; every sentence is padded to it", cxxopts::value<int64_t>()->default_value(std::to_string(base.max_length)))
    ("extra_decode_length", "beam search decodes up to the source length plus this (50)", cxxopts::value<int64_t>())
    ("beam_size", "beams of the search (4)", cxxopts::value<int64_t>())
    ("alpha", "length penalty exponent: ((5 + length) / 6)^alpha (0.6)", cxxopts::value<double>())
    ("log_steps", "with --enable_time_history: print tokens/s every this many training steps", cxxopts::value<int64_t>()->default_value("100"));
  // clang-format on
  tnt_models::add_callback_flags(flags, "tokens", "real target tokens, padding not counted");
  if (std::optional<int> status = flags.parse(argc, argv)) return *status;

  return tnt::run_main(argc, argv, [&] {
    const cxxopts::ParseResult& args = flags.args();
    // Flags are checked in the order a user reads them: the model, the data, the run.
    tnt_models::TransformerParams p = tnt_models::transformer_params(args["param_set"].as<std::string>());
    // Upper bounds far above any real model's (Transformer-big: hidden 1024, filter 4096, 6
    // layers, 16 heads) that keep the size arithmetic of a typo from overflowing; whether a
    // model within them fits the memory is checked once the vocabulary is known.
    auto override_int = [&](const char* name, int64_t& field, int64_t min, int64_t max) {
      if (args.count(name)) field = args[name].as<int64_t>();
      TNT_INPUT_CHECK(field >= min && field <= max, "--{}={}: must be in [{}, {}]", name, field, min, max);
    };
    // lo_open: lo itself is refused (a learning rate or epsilon of 0), and the range says so.
    auto override_double = [&](const char* name, double& field, double lo, double hi, bool hi_open,
                               bool lo_open = false) {
      if (args.count(name)) field = args[name].as<double>();
      TNT_INPUT_CHECK((lo_open ? field > lo : field >= lo) && (hi_open ? field < hi : field <= hi),
                      "--{}={}: must be in {}{}, {}{}", name, field, lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
    };
    override_int("hidden_size", p.hidden_size, 2, 65536);
    override_int("num_hidden_layers", p.num_hidden_layers, 1, 1024);
    override_int("num_heads", p.num_heads, 1, 4096);
    override_int("filter_size", p.filter_size, 1, 1 << 20);
    TNT_INPUT_CHECK(p.hidden_size % 2 == 0 && p.hidden_size % p.num_heads == 0,
                    "--hidden_size={}: must be even and a multiple of --num_heads={}", p.hidden_size, p.num_heads);
    override_double("layer_postprocess_dropout", p.layer_postprocess_dropout, 0, 1, true);
    override_double("attention_dropout", p.attention_dropout, 0, 1, true);
    override_double("relu_dropout", p.relu_dropout, 0, 1, true);
    override_double("label_smoothing", p.label_smoothing, 0, 1, true);
    override_double("learning_rate", p.learning_rate, 0, 1e30, false, true);
    override_int("learning_rate_warmup_steps", p.learning_rate_warmup_steps, 1, int64_t{1} << 40);
    override_double("optimizer_adam_beta1", p.optimizer_adam_beta1, 0, 1, true);
    override_double("optimizer_adam_beta2", p.optimizer_adam_beta2, 0, 1, true);
    override_double("optimizer_adam_epsilon", p.optimizer_adam_epsilon, 0, 1, false, true);
    p.max_length = args["max_length"].as<int64_t>();
    TNT_INPUT_CHECK(p.max_length >= 2 && p.max_length <= 65536,
                    "--max_length={}: must be in [2, 65536] (at least a word and EOS)", p.max_length);
    override_int("extra_decode_length", p.extra_decode_length, 0, 65536);
    override_int("beam_size", p.beam_size, 1, 1024);
    override_double("alpha", p.alpha, 0, 1e6, false);

    const tnt_models::CommonFlags common = flags.common();
    tnt_models::take_warning_signals("transformer", true);
    const tnt_models::CallbackFlags callback_flags = tnt_models::callback_flags(flags, common);
    const std::string param_set = args["param_set"].as<std::string>();
    const int64_t num_sentences = args["num_sentences"].as<int64_t>();
    const bool auto_dist = args["auto_data_dist"].as<bool>();
    const int64_t decode_batch_size = args["decode_batch_size"].as<int64_t>();
    const int64_t decode_max_length = args["decode_max_length"].as<int64_t>();
    const bool decode_cache = args["decode_cache"].as<bool>();
    const tnt_models::ResumeFlag resume_given = tnt_models::parse_resume_flag(args);
    const bool resume = resume_given.resume;
    const std::string dtype = args["dtype"].as<std::string>();
    TNT_INPUT_CHECK(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", "--dtype={}: expected fp32, bf16 or fp16",
                    dtype);
    // bf16/fp16: layers compute in half precision, weights, gradients, the allreduce and
    // Adam stay fp32 (and fp16 scales the loss). On a CPU rank this is emulated.
    const tnt::Precision precision = tnt::Precision::from_name(dtype);
    TNT_INPUT_CHECK(num_sentences >= 0, "--num_sentences={}: must be at least 0 (0 = all)", num_sentences);
    TNT_INPUT_CHECK(decode_batch_size >= 1 && decode_batch_size <= 65536, "--decode_batch_size={}: must be in [1, 65536]",
                    decode_batch_size);
    TNT_INPUT_CHECK(decode_max_length == 0 || (decode_max_length >= 2 && decode_max_length <= 65536),
                    "--decode_max_length={}: must be 0 (no cut) or in [2, 65536] (at least a subtoken and EOS)",
                    decode_max_length);
    TNT_INPUT_CHECK(common.batch_size >= p.max_length,
                    "--batch_size={}: fewer tokens than --max_length={} (a global batch holds batch_size // max_length "
                    "sentences); use at least {}",
                    common.batch_size, p.max_length, p.max_length);
    const int64_t sentences = tnt::sentences_per_batch(common.batch_size, p.max_length);
    TNT_INPUT_CHECK(sentences >= tnt::size(),
                    "--batch_size={}: {} per global batch (batch_size // max_length = {} // {}), fewer than the {}",
                    common.batch_size, tnt_models::count_of(sentences, "sentence"), common.batch_size, p.max_length,
                    tnt_models::count_of(tnt::size(), "rank"));
    // Manual distribution takes what the tutorial's pipeline takes: sentences // ranks per
    // rank, so a global batch of micro x ranks sentences.
    const int64_t manual_micro = sentences / tnt::size();
    const int64_t step_sentences = auto_dist ? sentences : manual_micro * tnt::size();

    // The vocabulary and the BLEU files, before any training.
    const std::string vocab_file = args["vocab_file"].as<std::string>();
    TNT_INPUT_CHECK(!vocab_file.empty(), "--vocab_file is missing: give the subtoken vocabulary (e.g. "
                                         "$DATA/vocab.ende.32768)");
    tnt_models::check_file_flag("vocab_file", vocab_file);
    const tnt::Subtokenizer tokenizer = tnt::Subtokenizer::from_file(vocab_file);
    const int64_t file_vocab = tokenizer.vocab_size();
    p.vocab_size = file_vocab;
    if (args.count("vocab_size")) {
      p.vocab_size = args["vocab_size"].as<int64_t>();
      TNT_INPUT_CHECK(p.vocab_size >= file_vocab, "--vocab_size={}: smaller than the {} subtokens of --vocab_file={}",
                      p.vocab_size, file_vocab, vocab_file);
    }
    TNT_INPUT_CHECK(p.vocab_size > 2, "--vocab_file={}: {} subtokens, too few for a model", vocab_file, p.vocab_size);
    TNT_INPUT_CHECK(p.vocab_size <= (int64_t{1} << 24), "--vocab_size={}: must be at most {}", p.vocab_size,
                    int64_t{1} << 24);
    check_fits_memory(p, sentences, precision.mixed(), common.batch_size);
    // Continues an earlier run's checkpoint: --resume, or a restart of the same launch
    // (tarantella --max-restarts) after a rank or host failed. A refusal comes now, before the
    // data are read and the model is made.
    const tnt_models::ModelDir model_dir_use{
        .path = common.model_dir,
        .given = common.model_dir_given,
        .outputs = {"checkpoint.safetensors", "history.csv", "model.safetensors", "translations.txt"},
        .can_resume = true,
        .resume = resume,
        .resume_auto = resume_given.automatic,
        .overwrite = common.overwrite,
        .checkpoint = "checkpoint.safetensors",
        .checkpoint_flag = ""};
    tnt_models::check_model_dir_early(model_dir_use);

    BleuInputs bleu{args["bleu_source"].as<std::string>(), args["bleu_ref"].as<std::string>(), {}, {}};
    TNT_INPUT_CHECK(bleu.source.empty() == bleu.reference.empty(),
                    "--bleu_source and --bleu_ref: give both (the sentences to translate and their references) or "
                    "neither");
    const bool with_bleu = !bleu.source.empty();
    if (with_bleu) {
      tnt_models::check_file_flag("bleu_source", bleu.source);
      tnt_models::check_file_flag("bleu_ref", bleu.reference);
      const std::vector<std::string> lines = read_source_lines(bleu.source, "bleu_source");
      bleu.reference_lines = tnt::read_bleu_lines(bleu.reference);
      const size_t refs = bleu.reference_lines.size();
      TNT_INPUT_CHECK(lines.size() == refs, "--bleu_source={} has {} lines, --bleu_ref={} has {}: they must match",
                      bleu.source, lines.size(), bleu.reference, refs);
      TNT_INPUT_CHECK(!lines.empty(), "--bleu_source={}: no sentence", bleu.source);
      for (size_t i = 0; i < lines.size(); ++i) {
        std::vector<int64_t> ids = tokenizer.encode(lines[i]);
        if (decode_max_length > 0 && static_cast<int64_t>(ids.size()) > decode_max_length - 1)
          ids.resize(static_cast<size_t>(decode_max_length - 1));
        ids.push_back(tnt::kEosId);
        check_decode_fits_memory(p, static_cast<int64_t>(ids.size()), std::min<int64_t>(decode_batch_size, lines.size()),
                                 bleu.source, static_cast<int64_t>(i + 1));
        bleu.encoded.push_back(std::move(ids));
      }
    }

    // The data.
    TNT_INPUT_CHECK(!common.data_dir.empty(), "--data_dir is missing: give the directory of the TFRecord shards");
    tnt_models::check_directory_flag("data_dir", common.data_dir);
    tnt::TranslationOptions topts{.max_length = p.max_length, .num_sentences = num_sentences, .shuffle = true,
                                  .seed = common.seed};
    const tnt::TranslationData data = tnt::read_translation(common.data_dir, "train", topts);
    TNT_INPUT_CHECK(data.size() >= sentences,
                    "--data_dir={}: {} training sentences fit --max_length={}, fewer than one global batch of {} "
                    "(--batch_size={})",
                    common.data_dir, data.size(), p.max_length, sentences, common.batch_size);
    {
      // Ids beyond the vocabulary mean the data was made with another one.
      int64_t max_id = 0;
      for (const tnt::Tensor* t : {&data.inputs, &data.targets})
        for (int64_t i = 0; i < t->numel(); ++i) max_id = std::max<int64_t>(max_id, t->data<int32_t>()[i]);
      TNT_INPUT_CHECK(max_id < p.vocab_size,
                      "--data_dir={}: the data hold the id {}, beyond the {} subtokens of --vocab_file={} (data and "
                      "vocabulary do not belong together)",
                      common.data_dir, max_id, p.vocab_size, vocab_file);
    }

    // The model, loss, optimizer (Adam and the Transformer's schedule).
    tnt_models::Transformer transformer(p);
    auto net = transformer.training_network(p.max_length, p.max_length);
    tnt::Model model(net, common.seed);
    auto schedule = std::make_shared<tnt::InverseSqrtWithWarmup>(p.hidden_size, p.learning_rate_warmup_steps,
                                                                  p.learning_rate);
    tnt::AdamOptions adam;
    adam.beta1 = p.optimizer_adam_beta1;
    adam.beta2 = p.optimizer_adam_beta2;
    adam.eps = p.optimizer_adam_epsilon;
    auto loss = std::make_shared<TokenCountingLoss>(p.label_smoothing);
    model.compile(std::make_shared<tnt::Adam>(schedule, adam), loss, {}, precision);

    const tnt_models::RunDir run = tnt_models::prepare_model_dir(model_dir_use);
    const bool continue_run = run.resume;
    const std::string& model_dir = run.path;
    const std::string checkpoint = model_dir + "/checkpoint.safetensors";
    int initial_epoch = 0;
    // What a resume compares: the model's shape must be the same (--num_heads changes what
    // the same weights compute); the training settings a resumed run may change, and is told.
    using tnt_models::flag_text;
    const tnt_models::RunFlags run_flags{
        .same = {{"vocab_size", flag_text(p.vocab_size)},
                 {"hidden_size", flag_text(p.hidden_size)},
                 {"num_hidden_layers", flag_text(p.num_hidden_layers)},
                 {"num_heads", flag_text(p.num_heads)},
                 {"filter_size", flag_text(p.filter_size)}},
        .noted = {{"learning_rate", flag_text(p.learning_rate)},
                  {"learning_rate_warmup_steps", flag_text(p.learning_rate_warmup_steps)},
                  {"label_smoothing", flag_text(p.label_smoothing)},
                  {"layer_postprocess_dropout", flag_text(p.layer_postprocess_dropout)},
                  {"attention_dropout", flag_text(p.attention_dropout)},
                  {"relu_dropout", flag_text(p.relu_dropout)},
                  {"optimizer_adam_beta1", flag_text(p.optimizer_adam_beta1)},
                  {"optimizer_adam_beta2", flag_text(p.optimizer_adam_beta2)},
                  {"optimizer_adam_epsilon", flag_text(p.optimizer_adam_epsilon)},
                  {"batch_size", flag_text(common.batch_size)},
                  {"max_length", flag_text(p.max_length)}},
        // Another vocabulary of the same size gives every id another subtoken.
        .same_contents = {{"vocab_file", tnt_models::file_fingerprint("vocab_file", vocab_file)}},
        .same_inside_epoch = {"batch_size", "max_length"},
        .micro_batch_size = common.micro_batch_size};
    if (continue_run) initial_epoch = tnt_models::resume_from_checkpoint(model, checkpoint, common.seed, run_flags, common.seed_given);
    tnt_models::record_run_flags(model, run_flags);

    if (common.verbose > 0) {
      tnt::print("Transformer ({}): {} parameters, vocabulary {}, hidden {}, {} + {} layers, {} heads, filter {}",
                 param_set, net->parameter_count(), p.vocab_size, p.hidden_size, p.num_hidden_layers,
                 p.num_hidden_layers, p.num_heads, p.filter_size);
      tnt::print("{}, global batch {} tokens = {} of {}, {} training sentences per epoch ({} read, {} "
                 "longer than max_length dropped), {} data distribution, {}",
                 tnt_models::count_of(tnt::size(), "rank"), common.batch_size,
                 tnt_models::count_of(sentences, "sentence"), p.max_length, data.size(), data.records_read,
                 data.dropped_too_long, auto_dist ? "automatic" : "manual", schedule->describe());
      if (precision.mixed()) {
        tnt::print("precision: {} compute, fp32 master weights{}", precision.name(),
                   precision.scales_loss() ? fmt::format(", dynamic loss scaling from {}", precision.initial_scale) : "");
      }
    }

    tnt::FitOptions fit;
    fit.batch_size = step_sentences;
    fit.verbose = common.verbose;
    fit.remainder = tnt::Remainder::drop;  // as the manual mode: every step a full global batch
    tnt::Dataset train;
    if (auto_dist) {
      train = tnt::translation_dataset(data, topts).map(add_decoder_inputs);
    } else {
      if (step_sentences != sentences) {
        tnt::print("--auto_data_dist=false: {} per global batch (--batch_size={} // --max_length={}) do not split "
                   "evenly over {}: each rank takes {} // {} = {} a step, so a global batch is {}, not {} (as the "
                   "tutorial's manual pipeline; --auto_data_dist=true splits all {} unevenly over the ranks)",
                   tnt_models::count_of(sentences, "sentence"), common.batch_size, p.max_length,
                   tnt_models::count_of(tnt::size(), "rank"), sentences, tnt::size(),
                   tnt_models::count_of(manual_micro, "sentence"), tnt_models::count_of(step_sentences, "sentence"),
                   sentences, sentences);
      }
      fit.distribute_dataset = false;
      fit.micro_batch_size = manual_micro;
      // The tutorial's pipeline: batches of micro sentences, batch i to rank i % ranks;
      // whole global batches only, so that every rank has the same number of steps.
      const int64_t whole = data.size() / step_sentences * step_sentences;
      train = tnt::translation_dataset(data, topts)
                  .take(whole)
                  .batch(manual_micro, /*drop_remainder=*/true)
                  .shard(tnt::size(), tnt::rank())
                  .map(add_decoder_inputs);
    }

    tnt_models::Translator translator(
        transformer, tnt_models::BeamSearchOptions{.beam_size = p.beam_size, .alpha = p.alpha, .eos_id = tnt::kEosId},
        p.extra_decode_length, decode_cache);
    auto nan_guard = std::make_shared<tnt::TerminateOnNaN>(tnt::TerminateOnNaN::Action::raise);
    // --enable_time_history: TimeHistory's real tokens/s replace the padded tokens/s line.
    std::shared_ptr<tnt::Callback> throughput = std::make_shared<TokenThroughput>(step_sentences, p.max_length);
    if (callback_flags.time_history) {
      tnt::TimeHistoryOptions time_options;
      time_options.unit = "tokens";
      time_options.step_units = [loss] { return static_cast<double>(loss->last_tokens()); };
      throughput = std::make_shared<tnt::TimeHistory>(step_sentences, callback_flags.log_steps, time_options);
    }
    // A model file (tnt::load_model: the architecture in its metadata), its tensors under the
    // PyTorch module's names (scripts/transformer_torch.py). Written before each evaluation:
    // an evaluation that fails cannot lose the trained weights.
    const std::string weights = model_dir + "/model.safetensors";
    // One writer for the whole run: its event files span the fit() calls of the loop.
    const auto tensorboard = common.enable_tensorboard
                                 ? std::make_shared<tnt::TensorBoard>(model_dir, 0, callback_flags.profile_steps)
                                 : nullptr;
    // fit(initial_epoch, epochs) in a loop with an evaluation in between, as the tutorial.
    for (int epoch = initial_epoch; epoch < common.train_epochs; epoch += common.epochs_between_evals) {
      fit.initial_epoch = epoch;
      // The first piece of a run resumed inside an epoch (a warning signal stopped it there).
      fit.initial_step = epoch == initial_epoch ? model.checkpoint_epoch_step() : 0;
      fit.epochs = std::min(epoch + common.epochs_between_evals, common.train_epochs);
      fit.total_epochs = common.train_epochs;  // one count over the loop: "Epoch 4/6" after "3/6"
      auto csv = std::make_shared<tnt::CSVLogger>(model_dir + "/history.csv", epoch > 0 || fit.initial_step > 0);
      std::vector<std::string> columns = {"loss", "learning_rate", "seconds"};
      if (precision.scales_loss()) columns.push_back("loss_scale");  // fp16 (docs/library.md)
      csv->set_columns(columns);
      fit.callbacks = {nan_guard, csv, std::make_shared<tnt::ModelCheckpoint>(checkpoint, "loss"), throughput};
      if (tensorboard) fit.callbacks.push_back(tensorboard);
      model.fit(train, fit);
      if (tnt::default_device().is_cuda()) {
        // What the caching allocator handed out at most, evaluations before this fit included
        // (scripts/bench/transformer_gpu reads it).
        {
          // In use at the peak, and what the caching allocator held from the driver at the end (the
          // difference, the pool's spare blocks, is part of what nvidia-smi shows beyond the peak).
          const tnt::MemoryStats m = tnt::memory_stats(tnt::default_device());
          tnt::print("peak GPU memory: {} MiB in use, {} MiB held by the allocator", m.peak_bytes >> 20,
                     m.reserved_bytes >> 20);
        }
      }
      if (tnt_models::stopped_on_warning_signal(model, "transformer", checkpoint)) return;
      tnt::save_model(model, weights);
      if (model.stop_requested()) break;
      if (with_bleu) evaluate_bleu(translator, tokenizer, bleu, decode_batch_size, model_dir);
    }
    if (initial_epoch >= common.train_epochs) {
      tnt::save_model(model, weights);
      // Said as fashion_mnist and resnet50 say it; only the BLEU evaluation is optional here.
      tnt_models::print_nothing_to_train(continue_run, initial_epoch, common.train_epochs, with_bleu);
      if (with_bleu) evaluate_bleu(translator, tokenizer, bleu, decode_batch_size, model_dir);
    }
  });
}
