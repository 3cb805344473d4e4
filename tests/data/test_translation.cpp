// The translation data set (tarantella/text/translation.hpp) on shards written here: shapes,
// padding, dropping long examples, shard order, num_sentences, token batch sizes, the
// manual (by rank) split, and the errors, each naming the file and offset.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>

#include "tarantella/check.hpp"
#include "tarantella/tfrecord.hpp"
#include "tarantella/text/translation.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>

using namespace tnt;
namespace fs = std::filesystem;

namespace {

using Ids = std::vector<int64_t>;

void write_shard(const fs::path& path, const std::vector<std::pair<Ids, Ids>>& pairs) {
  TFRecordWriter w(path.string());
  for (const auto& [in, out] : pairs) {
    Example ex;
    ex.int64_features["inputs"] = in;
    ex.int64_features["targets"] = out;
    w.write(serialize_example(ex));
  }
  w.close();
}

// Pair k: inputs (k+2, 3, ..., EOS) of length 1 + k % 5 ... lengths vary, ids identify k.
std::pair<Ids, Ids> pair_of(int64_t k, int64_t in_len, int64_t out_len) {
  Ids in(static_cast<size_t>(in_len), 7), out(static_cast<size_t>(out_len), 9);
  in[0] = 100 + k;  // the sample's identity
  out[0] = 200 + k;
  in.back() = out.back() = 1;  // EOS
  return {in, out};
}

std::vector<int32_t> row(const Tensor& t, int64_t r) {
  std::vector<int32_t> v(static_cast<size_t>(t.dim(1)));
  const int32_t* p = t.data<int32_t>() + r * t.dim(1);
  std::copy(p, p + t.dim(1), v.begin());
  return v;
}

template <class Fn>
std::string input_error(Fn fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("translation: shards read into padded id tensors", "[translation]") {
  test::TempDir dir;
  // Two training shards (read in name order: 00001 before 00002) and a dev shard. Shard 1
  // holds pairs 0..4, shard 2 pairs 5..9; pair 3's target (7 ids) and pair 6's input (8)
  // are longer than max_length 6 and are dropped.
  std::vector<std::pair<Ids, Ids>> s1, s2;
  for (int64_t k = 0; k < 5; ++k) s1.push_back(pair_of(k, 2 + k % 3, k == 3 ? 7 : 3));
  for (int64_t k = 5; k < 10; ++k) s2.push_back(pair_of(k, k == 6 ? 8 : 4, 2 + k % 4));
  write_shard(dir.path / "wmt32k-train-00002-of-00002", s2);
  write_shard(dir.path / "wmt32k-train-00001-of-00002", s1);
  write_shard(dir.path / "wmt32k-dev-00001-of-00001", {pair_of(50, 3, 3)});
  write_shard(dir.path / "wmt32k-train-00003-of-00003.incomplete", {pair_of(99, 2, 2)});  // skipped

  TranslationOptions o;
  o.max_length = 6;
  o.num_sentences = 0;  // all
  TranslationData d = read_translation(dir.path.string(), "train", o);
  REQUIRE(d.shards.size() == 2);
  CHECK(fs::path(d.shards[0]).filename() == "wmt32k-train-00001-of-00002");
  CHECK(d.records_read == 10);
  CHECK(d.dropped_too_long == 2);
  REQUIRE(d.size() == 8);
  CHECK(d.inputs.dtype() == DType::i32);
  CHECK(d.inputs.shape() == Shape{8, 6});
  CHECK(d.targets.shape() == Shape{8, 6});
  // Rows in file order without 3 and 6; each row: the ids, then PAD = 0 up to 6.
  std::vector<int64_t> kept = {0, 1, 2, 4, 5, 7, 8, 9};
  for (int64_t r = 0; r < 8; ++r) {
    int64_t k = kept[static_cast<size_t>(r)];
    auto [in, out] = pair_of(k, k < 5 ? 2 + k % 3 : 4, k < 5 ? 3 : 2 + k % 4);
    std::vector<int32_t> want_in(6, 0), want_out(6, 0);
    std::copy(in.begin(), in.end(), want_in.begin());
    std::copy(out.begin(), out.end(), want_out.begin());
    INFO("row " << r << " (pair " << k << ")");
    CHECK(row(d.inputs, r) == want_in);
    CHECK(row(d.targets, r) == want_out);
  }
  // An example of exactly max_length ids stays: pair 7's target has 5 ids; with
  // max_length 5 it is kept, with 4 it goes too.
  o.max_length = 5;
  CHECK(read_translation(dir.path.string(), "train", o).dropped_too_long == 2);
  o.max_length = 4;
  CHECK(read_translation(dir.path.string(), "train", o).dropped_too_long == 3);

  // num_sentences stops reading once that many are kept.
  o.max_length = 6;
  o.num_sentences = 3;
  TranslationData d3 = read_translation(dir.path.string(), "train", o);
  CHECK(d3.size() == 3);
  CHECK(d3.records_read == 3);
  CHECK(row(d3.inputs, 2)[0] == 102);

  TranslationData dev = read_translation(dir.path.string(), "dev", o);
  CHECK(dev.size() == 1);
  CHECK(row(dev.targets, 0)[0] == 250);

  // Samples: {inputs (T), targets (T)}; batched, (b, T).
  auto it = translation_dataset(d, {.max_length = 6, .shuffle = false}).batch(3).iterate(0);
  auto b = it.next();
  REQUIRE(b);
  CHECK((*b)[0].shape() == Shape{3, 6});
  CHECK((*b)[1].shape() == Shape{3, 6});
  CHECK((*b)[0].dtype() == DType::i32);
  CHECK(row((*b)[0], 2)[0] == 102);
  // Shuffled: every epoch a permutation of the same rows, and not the same one each time.
  auto order = [&](int64_t epoch) {
    std::vector<int32_t> ids;
    auto e = translation_dataset(d, {.max_length = 6, .seed = 3}).iterate(epoch);
    while (auto s = e.next()) ids.push_back((*s)[0].data<int32_t>()[0]);
    return ids;
  };
  auto e0 = order(0), e1 = order(1);
  CHECK(std::multiset<int32_t>(e0.begin(), e0.end()) == std::multiset<int32_t>(e1.begin(), e1.end()));
  CHECK(e0.size() == 8);
  CHECK(e0 != e1);
  CHECK(order(0) == e0);
}

TEST_CASE("translation: tokens per batch", "[translation]") {
  CHECK(sentences_per_batch(32736, 256) == 127);  // the tutorial's batch: 127 sentences
  CHECK(sentences_per_batch(4096, 256) == 16);
  CHECK(sentences_per_batch(256, 256) == 1);
  CHECK(input_error([] { sentences_per_batch(255, 256); }) ==
        "batch size 255 tokens holds no sentence of max_length 256 (sentences per batch = batch size // "
        "max_length); use at least 256");
}

TEST_CASE("translation: manual distribution by rank", "[translation]") {
  test::TempDir dir;
  std::vector<std::pair<Ids, Ids>> pairs;
  for (int64_t k = 0; k < 21; ++k) pairs.push_back(pair_of(k, 3, 3));
  write_shard(dir.path / "x-train-1", pairs);
  TranslationData d = read_translation(dir.path.string(), "train", {.max_length = 4, .num_sentences = 0});
  REQUIRE(d.size() == 21);
  // 8 sentences over 4 ranks: 2 each, rank r taking r, r+4 of every 8; 21 sentences make 2
  // whole global batches (the 5 left over are dropped on every rank alike).
  TranslationOptions o{.max_length = 4, .shuffle = false};
  for (int r = 0; r < 4; ++r) {
    auto it = translation_dataset_by_rank(d, 8, r, 4, o).iterate(0);
    std::vector<int32_t> got;
    int steps = 0;
    while (auto b = it.next()) {
      REQUIRE((*b)[0].shape() == Shape{2, 4});
      for (int64_t i = 0; i < 2; ++i) got.push_back(row((*b)[0], i)[0] - 100);
      ++steps;
    }
    CHECK(steps == 2);
    CHECK(got == std::vector<int32_t>{r, r + 4, 8 + r, 12 + r});
  }
  // 127 sentences do not split over 4 ranks: refused, with the numbers.
  std::string msg = input_error([&] { translation_dataset_by_rank(d, 127, 0, 4, o); });
  CHECK(msg.find("a global batch of 127 sentences does not split evenly over 4 ranks (127 % 4 = 3)") !=
        std::string::npos);
  CHECK(msg.find("automatic distribution") != std::string::npos);
}

TEST_CASE("translation: one complete set of PREFIX-train-NNNNN-of-MMMMM shards is read", "[translation]") {
  // Before, every file whose name held "train" was read: a backup copy beside the shards
  // trained its sentences twice, and a second corpus (another direction or vocabulary)
  // mixed in unseen.
  test::TempDir dir;
  const std::string d = dir.path.string();
  write_shard(dir.path / "wmt32k-train-00001-of-00002", {pair_of(0, 3, 3), pair_of(1, 3, 3)});
  write_shard(dir.path / "wmt32k-train-00002-of-00002", {pair_of(2, 3, 3)});
  fs::copy_file(dir.path / "wmt32k-train-00001-of-00002", dir.path / "wmt32k-train-00001-of-00002.bak");
  fs::copy_file(dir.path / "wmt32k-train-00002-of-00002", dir.path / "wmt32k-train-00002-of-00002 (copy)");
  TranslationData data = read_translation(d, "train", {.max_length = 4});
  CHECK(data.shards == std::vector<std::string>{(dir.path / "wmt32k-train-00001-of-00002").string(),
                                                (dir.path / "wmt32k-train-00002-of-00002").string()});
  CHECK(data.records_read == 3);
  CHECK(data.size() == 3);

  write_shard(dir.path / "other-train-00001-of-00001", {pair_of(5, 3, 3)});
  CHECK(input_error([&] { read_translation(d, "train"); }) ==
        "data directory '" + d + "': 2 sets of train shards: other-train-* (1 files), wmt32k-train-* (2 files); keep "
        "one set per directory (each is one corpus, direction and vocabulary), or point --data_dir at a directory "
        "with one");
  fs::remove(dir.path / "other-train-00001-of-00001");
  fs::remove(dir.path / "wmt32k-train-00002-of-00002");
  CHECK(input_error([&] { read_translation(d, "train"); }) ==
        "data directory '" + d + "': shard wmt32k-train-00002-of-00002 is missing (1 of 2 present)");
  write_shard(dir.path / "wmt32k-train-00002-of-00003", {pair_of(2, 3, 3)});
  CHECK(input_error([&] { read_translation(d, "train"); }) ==
        "data directory '" + d + "': the wmt32k-train shards disagree on how many there are (-of-2, -of-3)");

  // One shard under two names (numbers with and without their zeros): refused, naming both.
  test::TempDir twice;
  write_shard(twice.path / "x-train-00001-of-00001", {pair_of(0, 3, 3)});
  write_shard(twice.path / "x-train-1-of-1", {pair_of(0, 3, 3)});
  CHECK_THAT(input_error([&] { read_translation(twice.path.string(), "train"); }),
             Catch::Contains("are the same shard (") && Catch::Contains("keep one"));

  // Numbered from 0 as well; names without the pattern are read as before (*train*).
  test::TempDir zero;
  write_shard(zero.path / "x-train-00000-of-00002", {pair_of(0, 3, 3)});
  write_shard(zero.path / "x-train-00001-of-00002", {pair_of(1, 3, 3)});
  CHECK(read_translation(zero.path.string(), "train").records_read == 2);
  test::TempDir plain;
  write_shard(plain.path / "my_train.tfrecord", {pair_of(0, 3, 3)});
  CHECK(read_translation(plain.path.string(), "train").records_read == 1);

  // Parallel text where shards belong: a hint, not only the reader's checksum error.
  test::TempDir text;
  { std::ofstream(text.path / "train.en") << "Hello world, this is not a TFRecord file.\n"; }
  const std::string msg = input_error([&] { read_translation(text.path.string(), "train"); });
  CHECK_THAT(msg, Catch::Contains("(is '" + (text.path / "train.en").string() +
                                  "' a TFRecord file of tf.train.Example records? build/bin/transformer_data makes them "
                                  "from parallel text)"));
}

TEST_CASE("translation: errors name the directory, file and offset", "[translation]") {
  test::TempDir dir;
  std::string d = dir.path.string();
  CHECK(input_error([&] { read_translation(d, "train"); }).find("data directory '" + d + "': no train shards") == 0);
  CHECK(input_error([&] { read_translation(d + "/nope", "train"); }) ==
        "data directory '" + d + "/nope': not a directory");

  // The second record lacks "targets": named with its byte offset. The first record is
  // 12 + n + 4 bytes long, so the second starts there.
  Example good;
  good.int64_features = {{"inputs", {5, 1}}, {"targets", {6, 1}}};
  Example bad;
  bad.int64_features = {{"inputs", {5, 1}}};
  fs::path shard = dir.path / "t-train-1";
  {
    TFRecordWriter w(shard.string());
    w.write(serialize_example(good));
    w.write(serialize_example(bad));
    w.close();
  }
  size_t second = 12 + serialize_example(good).size() + 4;
  std::string msg = input_error([&] { read_translation(d, "train"); });
  CHECK(msg == fmt::format("'{}' at byte offset {}: the record has no int64 list \"targets\" (a translation record "
                           "holds \"inputs\" and \"targets\")",
                           shard.string(), second));

  // An id that does not fit int32.
  Example big;
  big.int64_features = {{"inputs", {int64_t{1} << 31, 1}}, {"targets", {6, 1}}};
  {
    TFRecordWriter w(shard.string());
    w.write(serialize_example(big));
    w.close();
  }
  CHECK(input_error([&] { read_translation(d, "train"); }) ==
        fmt::format("'{}' at byte offset 0: \"inputs\" holds the id 2147483648, outside [0, 2^31)", shard.string()));

  // A truncated file: the reader names it and the offset of the broken record.
  {
    TFRecordWriter w(shard.string());
    w.write(serialize_example(good));
    w.write(serialize_example(good));
    w.close();
  }
  fs::resize_file(shard, fs::file_size(shard) - 3);
  msg = input_error([&] { read_translation(d, "train"); });
  CHECK(msg.find(shard.string()) != std::string::npos);
  CHECK(msg.find(std::to_string(second)) != std::string::npos);

  // Everything too long.
  write_shard(shard, {pair_of(0, 9, 3)});
  CHECK(input_error([&] { read_translation(d, "train", {.max_length = 4}); }) ==
        "data directory '" + d + "': no train example fits max_length 4 (1 records read, 1 of them longer)");
}
