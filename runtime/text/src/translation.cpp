// Translation shards -> padded id tensors -> datasets (tarantella/text/translation.hpp). The
// kept sentences live in two host tensors (the tutorial's 10000 sentences of 256 ids are
// 20 MB), so every rank holds the same data and distribution only chooses rows.
#include "tarantella/text/translation.hpp"

#include "tarantella/check.hpp"
#include "tarantella/log.hpp"
#include "tarantella/tfrecord.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <set>

namespace tnt {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const std::vector<int64_t>& feature(const Example& ex, const char* name, const std::string& where) {
  auto it = ex.int64_features.find(name);
  if (it == ex.int64_features.end()) {
    bool other_kind = ex.float_features.count(name) || ex.bytes_features.count(name);
    TNT_INPUT_ERROR("{}: the record has no int64 list \"{}\"{} (a translation record holds \"inputs\" and "
                    "\"targets\")",
                    where, name, other_kind ? " (it has one of another type)" : "");
  }
  TNT_INPUT_CHECK(!it->second.empty(), "{}: \"{}\" is empty (every sentence ends in EOS = 1)", where, name);
  for (int64_t v : it->second)
    TNT_INPUT_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max(), "{}: \"{}\" holds the id {}, outside [0, 2^31)",
                    where, name, v);
  return it->second;
}

}  // namespace

namespace {

// "a, b, c and 2 more"
std::string some_names(const std::vector<std::string>& names) {
  constexpr size_t shown = 3;
  std::vector<std::string> quoted;
  for (size_t i = 0; i < names.size() && i < shown; ++i) quoted.push_back("'" + names[i] + "'");
  std::string out = fmt::format("{}", fmt::join(quoted, ", "));
  if (names.size() > shown) out += fmt::format(" and {} more", names.size() - shown);
  return out;
}

// A set of shards named PREFIX-SPLIT-NNNNN-of-MMMMM: every number of 1 to MMMMM (as the
// tutorial's data_download.py and transformer_data number them) or of 0 to MMMMM - 1.
struct ShardSet {
  std::map<int64_t, std::string> by_number;  // file name by its NNNNN
  std::set<int64_t> counts;                  // the MMMMM they give
};

void check_complete(const std::string& data_dir, const std::string& prefix, const std::string& split,
                    const ShardSet& set) {
  TNT_INPUT_CHECK(set.counts.size() == 1,
                  "data directory '{}': the {}-{} shards disagree on how many there are (-of-{})", data_dir, prefix,
                  split, fmt::join(set.counts, ", -of-"));
  const int64_t count = *set.counts.begin();
  const int64_t first = set.by_number.count(0) ? 0 : 1;
  for (int64_t i = first; i < first + count; ++i) {
    TNT_INPUT_CHECK(set.by_number.count(i), "data directory '{}': shard {}-{}-{:05d}-of-{:05d} is missing ({} of {} present)",
                    data_dir, prefix, split, i, count, set.by_number.size(), count);
  }
  for (const auto& [number, name] : set.by_number) {
    TNT_INPUT_CHECK(number >= first && number < first + count,
                    "data directory '{}': '{}' is numbered outside the set's {} to {} ({} shards)", data_dir, name,
                    first, first + count - 1, count);
  }
}

}  // namespace

std::vector<std::string> translation_shards(const std::string& data_dir, const std::string& split) {
  std::error_code ec;
  TNT_INPUT_CHECK(fs::is_directory(data_dir, ec), "data directory '{}': not a directory", data_dir);
  std::vector<std::string> named;  // every regular file whose name holds the split (the tutorial's *train*)
  for (const auto& entry : fs::directory_iterator(data_dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.find(split) == std::string::npos || ends_with(name, ".incomplete") || ends_with(name, ".tmp")) continue;
    if (!entry.is_regular_file(ec)) continue;
    named.push_back(name);
  }
  if (ec) TNT_INPUT_ERROR("data directory '{}': cannot list it: {}", data_dir, ec.message());
  std::sort(named.begin(), named.end());
  TNT_INPUT_CHECK(!named.empty(),
                  "data directory '{}': no {} shards (files named *{}*, e.g. wmt32k-{}-00001-of-00001; "
                  "build/bin/transformer_data makes them from parallel text)",
                  data_dir, split, split, split);
  // Where shards are named PREFIX-SPLIT-NNNNN-of-MMMMM, only a complete set of them is read:
  // a copy beside them ("... (copy)", ".bak") would train its sentences twice, and a second
  // set (another direction, another vocabulary) would mix into the first unseen.
  const std::regex pattern("(.+)-" + std::regex_replace(split, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                           "-([0-9]{1,9})-of-([0-9]{1,9})");
  std::map<std::string, ShardSet> sets;
  std::vector<std::string> others;
  for (const std::string& name : named) {
    std::smatch m;
    if (std::regex_match(name, m, pattern)) {
      ShardSet& set = sets[m[1].str()];
      const auto [at, added] = set.by_number.emplace(std::stoll(m[2].str()), name);
      TNT_INPUT_CHECK(added, "data directory '{}': '{}' and '{}' are the same shard ({} of {}); keep one", data_dir,
                      at->second, name, m[2].str(), m[3].str());
      set.counts.insert(std::stoll(m[3].str()));
    } else {
      others.push_back(name);
    }
  }
  std::vector<std::string> shards;
  if (sets.empty()) {
    for (const std::string& name : named) shards.push_back((fs::path(data_dir) / name).string());
    return shards;
  }
  if (sets.size() > 1) {
    std::vector<std::string> each;
    for (const auto& [prefix, set] : sets) each.push_back(fmt::format("{}-{}-* ({} files)", prefix, split, set.by_number.size()));
    TNT_INPUT_ERROR("data directory '{}': {} sets of {} shards: {}; keep one set per directory (each is one "
                    "corpus, direction and vocabulary), or point --data_dir at a directory with one",
                    data_dir, sets.size(), split, fmt::join(each, ", "));
  }
  const auto& [prefix, set] = *sets.begin();
  check_complete(data_dir, prefix, split, set);
  if (!others.empty()) {
    log_warning("data directory '{}': not read: {} (the {} shards are {}-{}-NNNNN-of-{:05d}; other names holding "
                "'{}' are taken for copies)",
                data_dir, some_names(others), split, prefix, split, *set.counts.begin(), split);
  }
  for (const auto& [number, name] : set.by_number) shards.push_back((fs::path(data_dir) / name).string());
  return shards;
}

TranslationData read_translation(const std::string& data_dir, const std::string& split,
                                 const TranslationOptions& options) {
  TNT_INPUT_CHECK(options.max_length > 0, "max_length {}: must be positive", options.max_length);
  TNT_INPUT_CHECK(options.num_sentences >= 0, "num_sentences {}: must be at least 0 (0 keeps all)",
                  options.num_sentences);
  TranslationData data;
  data.shards = translation_shards(data_dir, split);
  const auto T = static_cast<size_t>(options.max_length);
  std::vector<int32_t> inputs, targets;  // (N, T), grown sentence by sentence
  int64_t kept = 0;
  std::string record;
  for (const auto& path : data.shards) {
    if (options.num_sentences > 0 && kept >= options.num_sentences) break;
    TFRecordReader reader(path);
    // A text file or anything else that is no TFRecord file fails its first record's check.
    auto next = [&](uint64_t at) {
      try {
        return reader.next(record);
      } catch (const InputError& e) {
        if (at > 0) throw;
        TNT_INPUT_ERROR("{} (is '{}' a TFRecord file of tf.train.Example records? build/bin/transformer_data makes "
                        "them from parallel text)",
                        e.what(), path);
      }
    };
    for (uint64_t at = reader.offset(); next(at); at = reader.offset()) {
      std::string where = fmt::format("'{}' at byte offset {}", path, at);
      Example ex = parse_example(record, where);
      const auto& in = feature(ex, "inputs", where);
      const auto& out = feature(ex, "targets", where);
      ++data.records_read;
      if (in.size() > T || out.size() > T) {
        ++data.dropped_too_long;
        continue;
      }
      inputs.resize((static_cast<size_t>(kept) + 1) * T, 0);
      targets.resize((static_cast<size_t>(kept) + 1) * T, 0);
      std::copy(in.begin(), in.end(), inputs.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(kept) * T));
      std::copy(out.begin(), out.end(), targets.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(kept) * T));
      ++kept;
      if (options.num_sentences > 0 && kept >= options.num_sentences) break;
    }
  }
  TNT_INPUT_CHECK(kept > 0,
                  "data directory '{}': no {} example fits max_length {} ({} records read, {} of them longer)",
                  data_dir, split, options.max_length, data.records_read, data.dropped_too_long);
  data.inputs = Tensor::from_data(inputs.data(), {kept, options.max_length});
  data.targets = Tensor::from_data(targets.data(), {kept, options.max_length});
  return data;
}

int64_t sentences_per_batch(int64_t batch_size_tokens, int64_t max_length) {
  TNT_INPUT_CHECK(max_length > 0, "max_length {}: must be positive", max_length);
  TNT_INPUT_CHECK(batch_size_tokens >= max_length,
                  "batch size {} tokens holds no sentence of max_length {} (sentences per batch = batch size // "
                  "max_length); use at least {}",
                  batch_size_tokens, max_length, max_length);
  return batch_size_tokens / max_length;
}

Dataset translation_dataset(const TranslationData& data, const TranslationOptions& options) {
  TNT_INPUT_CHECK(data.size() > 0, "translation data set: empty");
  Dataset d = Dataset::from_tensors({data.inputs, data.targets});
  if (options.shuffle) d = d.shuffle(data.size(), options.seed);
  return d;
}

Dataset translation_dataset_by_rank(const TranslationData& data, int64_t global_sentences, int rank, int size,
                                    const TranslationOptions& options) {
  TNT_INPUT_CHECK(size > 0 && rank >= 0 && rank < size, "rank {} of {}: not a rank", rank, size);
  TNT_INPUT_CHECK(global_sentences > 0, "a global batch of {} sentences: must be positive", global_sentences);
  TNT_INPUT_CHECK(global_sentences % size == 0,
                  "manual data distribution: a global batch of {} sentences does not split evenly over {} ranks "
                  "({} % {} = {}); choose a batch size in tokens whose sentence count (batch size // max_length) "
                  "is a multiple of {}, or use automatic distribution, which splits it unevenly",
                  global_sentences, size, global_sentences, size, global_sentences % size, size);
  TNT_INPUT_CHECK(data.size() >= global_sentences,
                  "manual data distribution: {} sentences do not fill one global batch of {}", data.size(),
                  global_sentences);
  // Only whole global batches, so that every rank has the same number of steps.
  int64_t whole = data.size() / global_sentences * global_sentences;
  return translation_dataset(data, options)
      .take(whole)
      .shard(size, rank)
      .batch(global_sentences / size, /*drop_remainder=*/true);
}

}  // namespace tnt
