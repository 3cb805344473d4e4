// build/bin/transformer_data run as a user runs it, its output read back with the TFRecord
// reader and the vocabulary it wrote: shard names, round-robin assignment, shuffled
// training shards, records that decode to the stripped text lines with EOS at the end, and
// the refusals (files of different lengths, shards of another run) that leave nothing
// half-written.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>

#include "tarantella/tfrecord.hpp"
#include "tarantella/text/subtokenizer.hpp"

#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using namespace tnt;

namespace {

struct Run {
  int status = -1;
  std::string output;  // stdout and stderr
};

Run run_tool(const fs::path& dir, const std::string& args) {
  fs::path log = dir / "tool.log";
  std::string cmd = fmt::format("'{}/transformer_data' {} > '{}' 2>&1", TNT_TOOLS_DIR, args, log.string());
  int rc = std::system(cmd.c_str());
  Run r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  r.output = ss.str();
  return r;
}

void write_lines(const fs::path& path, const std::vector<std::string>& lines) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& l : lines) f << l << "\n";
  REQUIRE(f.good());
}

std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> read_pairs(const fs::path& shard) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
  TFRecordReader reader(shard.string());
  std::string rec;
  while (reader.next(rec)) {
    Example ex = parse_example(rec, shard.string());
    out.emplace_back(ex.int64_features.at("inputs"), ex.int64_features.at("targets"));
  }
  return out;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("transformer_data: parallel text to shards and back", "[tools]") {
  test::TempDir tmp;
  // 40 training pairs (words repeat, so the vocabulary has subtokens longer than a
  // character), some with spaces around them and non-ASCII letters; 5 dev pairs.
  const std::vector<std::string> words = {"haus", "baum", "straße", "über", "katze", "hund", "ein", "der"};
  std::vector<std::string> en, de;
  for (int i = 0; i < 40; ++i) {
    std::string s = fmt::format("{} {} {}.", words[i % 8], words[(i * 3) % 8], i);
    en.push_back(i % 7 == 0 ? "  " + s + " \t" : s);
    de.push_back(fmt::format("{} {} {}!", words[(i + 1) % 8], words[(i * 5) % 8], i));
  }
  std::vector<std::string> dev_en = {"a b.", "haus!", "c", "über baum", "1 2 3"};
  std::vector<std::string> dev_de = {"x", "y", "z", "w", "v"};
  write_lines(tmp.path / "train.en", en);
  write_lines(tmp.path / "train.de", de);
  write_lines(tmp.path / "dev.en", dev_en);
  write_lines(tmp.path / "dev.de", dev_de);
  fs::path out = tmp.path / "data";
  std::string common = fmt::format("--train_source='{0}/train.en' --train_target='{0}/train.de' "
                                   "--dev_source='{0}/dev.en' --dev_target='{0}/dev.de'",
                                   tmp.path.string());

  Run r = run_tool(tmp.path, fmt::format("--data_dir='{}' {} --train_shards=3 --target_vocab_size=60 --threshold=5",
                                         out.string(), common));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(names_in(out) == std::vector<std::string>{"vocab.ende.60", "wmt32k-dev-00001-of-00001",
                                                  "wmt32k-train-00001-of-00003", "wmt32k-train-00002-of-00003",
                                                  "wmt32k-train-00003-of-00003"});
  Subtokenizer sub = Subtokenizer::from_file((out / "vocab.ende.60").string());
  CHECK(sub.subtoken(0) == "<pad>");
  CHECK(sub.subtoken(1) == "<EOS>");

  auto check_record = [&](const std::vector<int64_t>& ids) {
    REQUIRE(!ids.empty());
    CHECK(ids.back() == kEosId);
    CHECK(std::count(ids.begin(), ids.end(), kEosId) == 1);
    CHECK(std::count(ids.begin(), ids.end(), kPadId) == 0);
  };
  // Sentence i went to training shard i mod 3, and the shard's records were shuffled: as a
  // set they are the shard's lines, each pair intact.
  size_t total = 0;
  bool any_shuffled = false;
  for (int s = 0; s < 3; ++s) {
    auto pairs = read_pairs(out / fmt::format("wmt32k-train-{:05d}-of-00003", s + 1));
    std::vector<std::string> got, want;
    std::vector<int> order;
    for (const auto& [in, tg] : pairs) {
      check_record(in);
      check_record(tg);
      std::string src = sub.decode(trim_at_eos(in));
      got.push_back(src + " | " + sub.decode(trim_at_eos(tg)));
    }
    for (int i = s; i < 40; i += 3) want.push_back(strip_whitespace(en[static_cast<size_t>(i)]) + " | " + de[static_cast<size_t>(i)]);
    if (got != want) any_shuffled = true;
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    CHECK(got == want);
    total += pairs.size();
  }
  CHECK(total == 40);
  CHECK(any_shuffled);
  // The dev shard keeps the order of the lines.
  auto dev = read_pairs(out / "wmt32k-dev-00001-of-00001");
  REQUIRE(dev.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CHECK(sub.decode(trim_at_eos(dev[i].first)) == dev_en[i]);
    CHECK(sub.decode(trim_at_eos(dev[i].second)) == dev_de[i]);
  }

  // A second run uses the vocabulary that is there; the same shard counts replace the shards.
  r = run_tool(tmp.path, fmt::format("--data_dir='{}' {} --train_shards=3 --target_vocab_size=60", out.string(), common));
  CHECK(r.status == 0);
  CHECK(r.output.find("vocabulary: using") != std::string::npos);
  // Other shard counts would leave the old shards to be read with the new ones: refused,
  // naming one, until --overwrite removes them.
  r = run_tool(tmp.path, fmt::format("--data_dir='{}' {} --train_shards=2 --target_vocab_size=60", out.string(), common));
  CHECK(r.status == 1);
  CHECK(r.output.find("holds 'wmt32k-train-00001-of-00003' and 2 more shards from an earlier run") != std::string::npos);
  r = run_tool(tmp.path,
               fmt::format("--data_dir='{}' {} --train_shards=2 --target_vocab_size=60 --overwrite", out.string(), common));
  CHECK(r.status == 0);
  CHECK(names_in(out) == std::vector<std::string>{"vocab.ende.60", "wmt32k-dev-00001-of-00001",
                                                  "wmt32k-train-00001-of-00002", "wmt32k-train-00002-of-00002"});
}

TEST_CASE("transformer_data: bad input leaves nothing behind", "[tools]") {
  test::TempDir tmp;
  write_lines(tmp.path / "a.en", {"one", "two", "three"});
  write_lines(tmp.path / "a.de", {"eins", "zwei"});
  fs::path out = tmp.path / "data";
  Run r = run_tool(tmp.path, fmt::format("--data_dir='{0}' --train_source='{1}/a.en' --train_target='{1}/a.de' "
                                         "--vocab_file='{1}/v' --min_count=1 --train_shards=2",
                                         out.string(), tmp.path.string()));
  CHECK(r.status == 1);
  CHECK(r.output.find(fmt::format("the train files differ in length: '{}/a.de' ends after 2 lines",
                                  tmp.path.string())) != std::string::npos);
  CHECK(names_in(out).empty());  // no shard, complete or not

  write_lines(tmp.path / "b.de", {"eins", "zwei", "dr\xC3"});  // invalid UTF-8 on line 3
  r = run_tool(tmp.path, fmt::format("--data_dir='{0}' --train_source='{1}/a.en' --train_target='{1}/b.de' "
                                     "--vocab_file='{1}/v'",
                                     out.string(), tmp.path.string()));
  CHECK(r.status == 1);
  CHECK(r.output.find(fmt::format("'{}/b.de' line 3", tmp.path.string())) != std::string::npos);
  CHECK(names_in(out).empty());

  r = run_tool(tmp.path, fmt::format("--data_dir='{}' --train_source=x", out.string()));
  CHECK(r.status == 2);
  CHECK(r.output.find("--train_target is required") != std::string::npos);
  r = run_tool(tmp.path, fmt::format("--data_dir='{0}' --train_source='{1}/a.en' --train_target='{1}/a.de' "
                                     "--target_vocab_size=2",
                                     out.string(), tmp.path.string()));
  CHECK(r.status == 1);
  CHECK(r.output.find("--target_vocab_size=2: must be larger than the 2 reserved tokens") != std::string::npos);
  r = run_tool(tmp.path, "--help");
  CHECK(r.status == 0);
  CHECK(r.output.find("Examples:") != std::string::npos);
}
