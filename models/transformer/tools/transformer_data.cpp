// transformer_data: parallel text -> the Transformer's data directory, in the layout of
// TensorFlow's data_download.py:
//   <data_dir>/vocab.ende.32768                 the subtoken vocabulary (built from the
//                                               training text unless it exists or is given)
//   <data_dir>/wmt32k-train-00001-of-00100 ...  TFRecord shards of tf.train.Example records,
//   <data_dir>/wmt32k-dev-00001-of-00001        int64 lists "inputs" and "targets", each
//                                               ending in EOS = 1
// As there: each line is stripped of surrounding whitespace, sentence i goes to shard
// i mod shards, and the records of each training shard are then shuffled. Shards are
// written as <name>.incomplete and renamed when all are complete, so an interrupted run
// leaves no shard that looks finished. The inputs are checked (readable, source and target
// of equal length) before anything is written, and a vocabulary built here is written the
// same way, renamed only once the shards are complete: a failed run leaves none behind for a
// corrected rerun to pick up as if it were built from the right files.
#include "tool_main.hpp"

#include "common/wording.hpp"

#include <tarantella/files.hpp>
#include <tarantella/random.hpp>
#include <tarantella/text/subtokenizer.hpp>
#include <tarantella/tfrecord.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace {

struct Split {
  std::string tag;  // "train", "dev"
  std::string source, target;
  int shards = 1;
  bool shuffle = false;
};

std::string shard_name(const std::string& prefix, const std::string& tag, int index, int total) {
  return fmt::format("{}-{}-{:05d}-of-{:05d}", prefix, tag, index, total);
}

struct Written {
  int64_t pairs = 0;
  int64_t empty = 0;  // pairs left out: a side with no text
  int64_t source_ids = 0, target_ids = 0;
  std::vector<std::string> files;       // final names
  std::vector<std::string> incomplete;  // the names written to
};

// Fisher-Yates with Philox draws (tnt::CounterRng) keyed by the seed and the shard: the
// same order under any standard library (std::shuffle's use of its generator is the
// library's own, so libstdc++ and libc++ gave different shards for one seed).
void shuffle_records(std::vector<std::string>& records, uint64_t seed, size_t shard) {
  const tnt::CounterRng rng(seed, fmt::format("transformer_data train shard {}", shard));
  for (size_t j = records.size(); j > 1; --j) {
    const uint64_t draw = (uint64_t{rng.bits(2 * j)} << 32) | rng.bits(2 * j + 1);
    // An index in [0, j): the high half of draw * j (a bias below j / 2^64).
    const auto k = static_cast<size_t>((static_cast<unsigned __int128>(draw) * j) >> 64);
    std::swap(records[j - 1], records[k]);
  }
}

Written write_split(const Split& split, const tnt::Subtokenizer& sub, const std::string& data_dir,
                    const std::string& prefix, uint64_t seed) {
  Written w;
  std::ifstream src = tnt::open_text_file(split.source, "--" + split.tag + "_source");
  std::ifstream tgt = tnt::open_text_file(split.target, "--" + split.tag + "_target");
  std::vector<std::unique_ptr<tnt::TFRecordWriter>> writers;
  for (int i = 0; i < split.shards; ++i) {
    std::string name = (fs::path(data_dir) / shard_name(prefix, split.tag, i + 1, split.shards)).string();
    w.files.push_back(name);
    w.incomplete.push_back(name + ".incomplete");
    writers.push_back(std::make_unique<tnt::TFRecordWriter>(w.incomplete.back()));
  }
  std::string s, t;
  int64_t line = 0;
  for (;;) {
    bool has_s = static_cast<bool>(std::getline(src, s));
    bool has_t = static_cast<bool>(std::getline(tgt, t));
    if (!has_s && !has_t) break;
    ++line;
    if (has_s != has_t)
      TNT_INPUT_ERROR("the {} files differ in length: '{}' ends after {} lines, '{}' goes on", split.tag,
                      has_s ? split.target : split.source, line - 1, has_s ? split.source : split.target);
    // A NUL byte is no text (a binary file given by mistake, or a damaged one).
    for (const auto* side : {&s, &t}) {
      const size_t nul = side->find('\0');
      if (nul != std::string::npos) {
        TNT_INPUT_ERROR("'{}' line {}: a NUL byte at column {}: not a text file of sentences (binary, or damaged)",
                        side == &s ? split.source : split.target, line, nul + 1);
      }
    }
    // A pair with an empty side would teach the model to translate something into nothing
    // (or nothing into something): left out, and counted in the summary.
    if (tnt::strip_whitespace(s).empty() || tnt::strip_whitespace(t).empty()) {
      ++w.empty;
      continue;
    }
    tnt::Example ex;
    auto encode = [&](const std::string& text, const std::string& path) {
      try {
        return sub.encode(tnt::strip_whitespace(text), /*add_eos=*/true);
      } catch (const tnt::InputError& e) {
        TNT_INPUT_ERROR("'{}' line {}: {}", path, line, e.what());
      }
    };
    ex.int64_features["inputs"] = encode(s, split.source);
    ex.int64_features["targets"] = encode(t, split.target);
    w.source_ids += static_cast<int64_t>(ex.int64_features["inputs"].size());
    w.target_ids += static_cast<int64_t>(ex.int64_features["targets"].size());
    writers[static_cast<size_t>(w.pairs % split.shards)]->write(tnt::serialize_example(ex));
    ++w.pairs;
  }
  if (src.bad()) TNT_INPUT_ERROR("--{}_source '{}': read error", split.tag, split.source);
  if (tgt.bad()) TNT_INPUT_ERROR("--{}_target '{}': read error", split.tag, split.target);
  TNT_INPUT_CHECK(w.pairs > 0, "--{}_source '{}': no lines{}", split.tag, split.source,
                  w.empty > 0 ? fmt::format(" with text on both sides ({} pair(s) with an empty side)", w.empty)
                              : std::string());
  for (auto& wr : writers) wr->close();
  writers.clear();

  if (split.shuffle) {
    // Each shard's records in a random order (data_download.py shuffles every training
    // shard the same way), keyed by the seed and the shard's number.
    for (size_t i = 0; i < w.incomplete.size(); ++i) {
      std::vector<std::string> records;
      {
        tnt::TFRecordReader reader(w.incomplete[i]);
        std::string r;
        while (reader.next(r)) records.push_back(r);
      }
      shuffle_records(records, seed, i);
      std::string tmp = w.incomplete[i] + ".tmp";  // skipped by readers, as .incomplete is
      tnt::TFRecordWriter out(tmp);
      for (const auto& r : records) out.write(r);
      out.close();
      fs::rename(tmp, w.incomplete[i]);
    }
  }
  return w;
}

// Lines as write_split reads them (std::getline: a last line without a newline counts).
int64_t count_lines(const std::string& path, const std::string& flag) {
  std::ifstream in = tnt::open_text_file(path, "--" + flag);
  int64_t lines = 0;
  char last = '\n';
  std::vector<char> buffer(1 << 16);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
    const auto n = static_cast<size_t>(in.gcount());
    lines += std::count(buffer.data(), buffer.data() + n, '\n');
    last = buffer[n - 1];
  }
  if (in.bad()) TNT_INPUT_ERROR("--{} '{}': read error", flag, path);
  return lines + (last != '\n' ? 1 : 0);
}

// Source and target of a split hold the same number of lines (line i translates line i).
void check_split(const Split& split) {
  const int64_t source = count_lines(split.source, split.tag + "_source");
  const int64_t target = count_lines(split.target, split.tag + "_target");
  TNT_INPUT_CHECK(source > 0, "--{}_source '{}': no lines", split.tag, split.source);
  if (source != target) {
    const bool source_short = source < target;
    TNT_INPUT_ERROR("the {} files differ in length: '{}' ends after {} (--{}_{}), '{}' has {} (--{}_{}); line i of "
                    "the source must be translated on line i of the target (nothing was written)",
                    split.tag, source_short ? split.source : split.target,
                    tnt_models::count_of(std::min(source, target), "line"), split.tag,
                    source_short ? "source" : "target", source_short ? split.target : split.source,
                    tnt_models::count_of(std::max(source, target), "line"), split.tag,
                    source_short ? "target" : "source");
  }
}

// Shards of an earlier run with another count would be read together with the new ones.
void refuse_foreign_shards(const std::string& data_dir, const std::string& prefix,
                           const std::vector<std::string>& ours, bool overwrite) {
  std::error_code ec;
  std::vector<fs::path> foreign;
  for (const auto& entry : fs::directory_iterator(data_dir, ec)) {
    std::string name = entry.path().filename().string();
    bool shard = name.rfind(prefix + "-train-", 0) == 0 || name.rfind(prefix + "-dev-", 0) == 0;
    if (shard && std::find(ours.begin(), ours.end(), entry.path().string()) == ours.end())
      foreign.push_back(entry.path());
  }
  std::sort(foreign.begin(), foreign.end());
  if (foreign.empty()) return;
  if (overwrite) {
    for (const auto& f : foreign) fs::remove(f, ec);
    return;
  }
  TNT_INPUT_ERROR("--data_dir '{}' holds '{}'{} from an earlier run with other shard counts; the Transformer "
                  "would read them with the new shards. Remove them, choose another --data_dir, or pass --overwrite",
                  data_dir, foreign[0].filename().string(),
                  foreign.size() > 1 ? fmt::format(" and {} more shards", foreign.size() - 1) : std::string());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string tool = "transformer_data";
  cxxopts::Options cli(tool, tnt_tools::help_text(
      "Converts parallel text (one sentence per line, line i of the source translated on line i of the\n"
      "target, UTF-8) into the Transformer's data directory, as TensorFlow's data_download.py writes it:\n"
      "TFRecord shards <prefix>-train-NNNNN-of-NNNNN and <prefix>-dev-NNNNN-of-NNNNN of tf.train.Example\n"
      "records with int64 lists \"inputs\" and \"targets\" (subtoken ids ending in EOS = 1), and the\n"
      "vocabulary. The vocabulary file is used when it exists; otherwise it is built from the training\n"
      "text (both sides; the min_count search for --target_vocab_size, or a fixed --min_count; the\n"
      "original script uses --min_count=6 unless told to search) and written there once the shards are\n"
      "complete. Source and target files of different lengths are refused before anything is written.",
      {"build/bin/transformer_data --data_dir=data --train_source=train.en --train_target=train.de \\\n"
       "      --dev_source=newstest2013.en --dev_target=newstest2013.de",
       "build/bin/transformer_data --data_dir=demo --train_source=demo/train.en --train_target=demo/train.de \\\n"
       "      --dev_source=demo/dev.en --dev_target=demo/dev.de --target_vocab_size=1000 --train_shards=4",
       "build/bin/transformer_data --data_dir=data --vocab_file=vocab.ende.32768 --train_source=... (existing vocabulary)"}));
  // clang-format off
  std::map<std::string, tnt_models::FlagKind> kinds;
  tnt_models::FlagAdder(cli.add_options(), kinds)
    ("data_dir", "output directory (created if missing)", cxxopts::value<std::string>())
    ("train_source", "training source text", cxxopts::value<std::string>())
    ("train_target", "training target text", cxxopts::value<std::string>())
    ("dev_source", "development source text (with --dev_target)", cxxopts::value<std::string>())
    ("dev_target", "development target text", cxxopts::value<std::string>())
    ("vocab_file", "vocabulary: used if it exists, else built and written here (default <data_dir>/vocab.ende.<target_vocab_size>)", cxxopts::value<std::string>())
    ("target_vocab_size", "vocabulary size to aim for", cxxopts::value<int64_t>()->default_value("32768"))
    ("threshold", "accept a vocabulary this close to the target size", cxxopts::value<int64_t>()->default_value("327"))
    ("min_count", "fixed min_count instead of the search (0: search)", cxxopts::value<int64_t>()->default_value("0"))
    ("file_byte_limit", "characters of each training file sampled for the vocabulary", cxxopts::value<double>()->default_value("1000000"))
    ("train_shards", "training shards", cxxopts::value<int>()->default_value("100"))
    ("dev_shards", "development shards", cxxopts::value<int>()->default_value("1"))
    ("prefix", "shard name prefix", cxxopts::value<std::string>()->default_value("wmt32k"))
    ("seed", "seed of the shuffle of the training shards", cxxopts::value<uint64_t>()->default_value("1"))
    ("overwrite", "remove shards of an earlier run with other shard counts", cxxopts::value<bool>()->default_value("false"));
  // clang-format on
  cxxopts::ParseResult args;
  if (auto status = tnt_tools::parse(tool, cli, kinds, argc, argv, args)) return *status;
  for (const char* required : {"data_dir", "train_source", "train_target"})
    if (!args.count(required)) return tnt_tools::usage_error(tool, fmt::format("--{} is required", required));
  if (args.count("dev_source") != args.count("dev_target"))
    return tnt_tools::usage_error(tool, "--dev_source and --dev_target go together");
  if (!args.unmatched().empty()) return tnt_tools::usage_error(tool, "unexpected argument '" + args.unmatched()[0] + "'");

  std::vector<std::string> incomplete;  // removed if anything fails
  int status = tnt_tools::run(tool, [&] {
    const std::string data_dir = args["data_dir"].as<std::string>();
    const std::string prefix = args["prefix"].as<std::string>();
    int train_shards = args["train_shards"].as<int>(), dev_shards = args["dev_shards"].as<int>();
    TNT_INPUT_CHECK(train_shards >= 1 && train_shards <= 99999, "--train_shards={}: must be in [1, 99999]", train_shards);
    TNT_INPUT_CHECK(dev_shards >= 1 && dev_shards <= 99999, "--dev_shards={}: must be in [1, 99999]", dev_shards);
    TNT_INPUT_CHECK(!prefix.empty() && prefix.find('/') == std::string::npos, "--prefix='{}': must be a file name part",
                    prefix);
    std::error_code ec;
    fs::create_directories(data_dir, ec);
    TNT_INPUT_CHECK(fs::is_directory(data_dir), "--data_dir '{}': cannot create it{}", data_dir,
                    ec ? ": " + ec.message() : std::string());

    tnt::VocabularyOptions vo;
    vo.target_size = args["target_vocab_size"].as<int64_t>();
    vo.threshold = args["threshold"].as<int64_t>();
    vo.min_count = args["min_count"].as<int64_t>();
    vo.file_byte_limit = args["file_byte_limit"].as<double>();
    TNT_INPUT_CHECK(vo.target_size > 2, "--target_vocab_size={}: must be larger than the 2 reserved tokens",
                    vo.target_size);
    TNT_INPUT_CHECK(vo.threshold > 0, "--threshold={}: must be positive", vo.threshold);
    TNT_INPUT_CHECK(vo.min_count >= 0, "--min_count={}: must be at least 0 (0 searches)", vo.min_count);
    TNT_INPUT_CHECK(vo.file_byte_limit >= 1, "--file_byte_limit={}: must be at least 1 (characters)",
                    vo.file_byte_limit);
    std::vector<Split> splits = {{"train", args["train_source"].as<std::string>(),
                                  args["train_target"].as<std::string>(), train_shards, true}};
    if (args.count("dev_source"))
      splits.push_back({"dev", args["dev_source"].as<std::string>(), args["dev_target"].as<std::string>(), dev_shards, false});
    // The inputs first: no vocabulary or shard is written for files that do not fit together.
    for (const auto& sp : splits) check_split(sp);
    std::string vocab_file = args.count("vocab_file")
                                 ? args["vocab_file"].as<std::string>()
                                 : (fs::path(data_dir) / fmt::format("vocab.ende.{}", vo.target_size)).string();
    // Before the minutes of the vocabulary search and the shards: a vocabulary that could not
    // be written would leave shards without it.
    TNT_INPUT_CHECK(!vocab_file.empty(), "--vocab_file is empty: give the vocabulary's path, or leave the flag out");
    const fs::file_status vocab_status = fs::status(vocab_file, ec);
    TNT_INPUT_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "--vocab_file={}: {}", vocab_file, ec.message());
    if (!fs::exists(vocab_status)) {
      const fs::path parent = fs::path(vocab_file).parent_path();
      const fs::file_status parent_status = fs::status(parent, ec);
      TNT_INPUT_CHECK(parent.empty() || fs::is_directory(parent_status),
                      "--vocab_file={}: no such file, and '{}' {} to build it in", vocab_file, parent.string(),
                      fs::exists(parent_status) ? "is not a directory" : "does not exist");
      TNT_INPUT_CHECK(!fs::is_symlink(fs::symlink_status(vocab_file, ec)),
                      "--vocab_file={}: a link to nothing", vocab_file);
    } else {
      TNT_INPUT_CHECK(fs::is_regular_file(vocab_status), "--vocab_file={}: not a regular file", vocab_file);
    }
    std::vector<std::string> ours;
    for (const auto& sp : splits)
      for (int i = 0; i < sp.shards; ++i)
        ours.push_back((fs::path(data_dir) / shard_name(prefix, sp.tag, i + 1, sp.shards)).string());
    refuse_foreign_shards(data_dir, prefix, ours, args["overwrite"].as<bool>());

    // A vocabulary built here goes to <vocab_file>.incomplete, renamed with the shards.
    std::string new_vocab;
    size_t new_vocab_size = 0;
    std::string vocab_note;  // how the built vocabulary's size differs from the target, if it does
    if (fs::exists(vocab_file)) {
      fmt::print("vocabulary: using {}\n", vocab_file);
    } else {
      fmt::print("vocabulary: building it from {} and {}\n", splits[0].source, splits[0].target);
      std::vector<std::string> log;
      auto counts = tnt::count_tokens({splits[0].source, splits[0].target}, vo.file_byte_limit);
      auto list = tnt::build_vocabulary(counts, vo, &log);
      for (const auto& l : log) fmt::print("  {}\n", l);
      new_vocab = vocab_file + ".incomplete";
      incomplete.push_back(new_vocab);
      tnt::Subtokenizer(list).save(new_vocab);
      new_vocab_size = list.size();
      // A small text has fewer subtokens than the target even at min_count 1 (the demo's
      // corpus: 405 of 1000): said here, and in the line that names the file, whose name
      // (<data_dir>/vocab.ende.<target> by default) says what was asked for, not what it holds.
      const auto size = static_cast<int64_t>(list.size());
      if (vo.min_count == 0 && std::abs(size - vo.target_size) >= vo.threshold) {
        vocab_note = fmt::format(" ({} --target_vocab_size={} by more than --threshold={}: {})",
                                 size < vo.target_size ? "short of" : "over", vo.target_size, vo.threshold,
                                 size < vo.target_size
                                     ? "the training text holds no more subtokens, even at min_count 1; a larger "
                                       "or more varied text would"
                                     : "no min_count gives a size closer to it");
        fmt::print("vocabulary: {} subtokens{}\n", size, vocab_note);
      }
    }
    tnt::Subtokenizer sub = tnt::Subtokenizer::from_file(new_vocab.empty() ? vocab_file : new_vocab);

    std::vector<Written> written;
    for (const auto& sp : splits) {
      // Registered before writing, so that a failure midway removes what was started.
      for (int i = 0; i < sp.shards; ++i)
        incomplete.push_back((fs::path(data_dir) / shard_name(prefix, sp.tag, i + 1, sp.shards)).string() +
                             ".incomplete");
      written.push_back(write_split(sp, sub, data_dir, prefix, args["seed"].as<uint64_t>()));
    }
    // Every shard complete: into place, the vocabulary with them.
    for (const auto& w : written)
      for (size_t i = 0; i < w.files.size(); ++i) fs::rename(w.incomplete[i], w.files[i]);
    if (!new_vocab.empty()) {
      fs::rename(new_vocab, vocab_file);
      fmt::print("vocabulary: {} subtokens written to {}{}\n", new_vocab_size, vocab_file, vocab_note);
    }
    incomplete.clear();
    for (size_t k = 0; k < splits.size(); ++k)
      fmt::print("{}: {} ({:.1f} source and {:.1f} target ids each, EOS included) in {} {}-{}-*{}\n", splits[k].tag,
                 tnt_models::count_of(written[k].pairs, "sentence pair"),
                 static_cast<double>(written[k].source_ids) / written[k].pairs,
                 static_cast<double>(written[k].target_ids) / written[k].pairs,
                 tnt_models::count_of(splits[k].shards, "shard"), prefix, splits[k].tag,
                 written[k].empty > 0
                     ? fmt::format("; {} left out: an empty source or target line",
                                   tnt_models::count_of(written[k].empty, "pair"))
                     : std::string());
  });
  for (const auto& f : incomplete) {
    std::error_code ec;
    fs::remove(f, ec);
    fs::remove(f + ".tmp", ec);
  }
  return status;
}
