// Every reader of a file a user names refuses what is not a regular file, naming the file:
// /dev/zero would be read without end (a vocabulary or a CSV of unbounded size), a FIFO's
// open waits for a writer that never comes (before the fix such a test hangs until CTest's
// timeout ends it), a directory is no data. One helper (tarantella/files.hpp) decides, so
// the message is the same everywhere: "<what> '<path>': not a regular file (<kind>)".
#include "temp_dir.hpp"
#include <catch2/catch.hpp>

#include "tarantella/text/bleu.hpp"
#include "tarantella/checkpoint.hpp"
#include "tarantella/dataset.hpp"
#include "tarantella/files.hpp"
#include "tarantella/imagenet.hpp"
#include "tarantella/text/subtokenizer.hpp"
#include "tarantella/tfrecord.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace {

struct Reader {
  const char* name;
  std::function<void(const std::string&)> read;
};

}  // namespace

TEST_CASE("readers of users' files refuse special files, naming them and their kind", "[files]") {
  tnt::test::TempDir dir("tnt-special");
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string directory = dir.path.string();
  const std::vector<std::pair<std::string, std::string>> specials = {
      {"/dev/zero", "a character device"}, {fifo, "a FIFO"}, {directory, "a directory"}};
  const std::vector<Reader> readers = {
      {"CSV", [](const std::string& p) { tnt::Dataset::from_csv(p); }},
      {"TFRecordReader", [](const std::string& p) { tnt::TFRecordReader r(p); }},
      {"index_tfrecord", [](const std::string& p) { tnt::index_tfrecord(p); }},
      {"vocabulary", [](const std::string& p) { tnt::Subtokenizer::from_file(p); }},
      {"count_tokens", [](const std::string& p) { tnt::count_tokens({p}, 1e6); }},
      {"BLEU lines", [](const std::string& p) { tnt::read_bleu_lines(p); }},
      {"checkpoint", [](const std::string& p) { tnt::Checkpoint::read(p); }},
      {"check_regular_file", [](const std::string& p) { tnt::check_regular_file(p, "history"); }},
  };
  for (const Reader& reader : readers) {
    for (const auto& [path, kind] : specials) {
      INFO(reader.name << " on " << path);
      CHECK_THROWS_AS(reader.read(path), tnt::InputError);
      CHECK_THROWS_WITH(reader.read(path), Catch::Contains("'" + path + "'") &&
                                               Catch::Contains("not a regular file (" + kind));
    }
  }
  const std::string missing = dir.file("missing");
  CHECK_THROWS_WITH(tnt::check_regular_file(missing, "--vocab_file"),
                    Catch::Equals("--vocab_file '" + missing + "': no such file"));
  tnt::test::write_bytes(dir.file("plain"), {1, 2, 3});
  CHECK(tnt::check_regular_file(dir.file("plain"), "data") == 3);
}

TEST_CASE("write_file_atomically replaces a link at the path, never its target, and fails whole", "[files]") {
  // Before, the transformer's translations and the run marker were written through fixed
  // temporary names (translations.txt.tmp, .tarantella-run.new): a link placed there had
  // its target outside --model_dir overwritten.
  tnt::test::TempDir dir("tnt-atomic");
  const std::string victim = dir.file("victim.txt");
  {
    std::FILE* f = std::fopen(victim.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs("keep me\n", f);
    std::fclose(f);
  }
  const std::string path = dir.file("out.txt");
  REQUIRE(::symlink(victim.c_str(), path.c_str()) == 0);
  tnt::write_file_atomically(path, "new text\n", "test file");
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  auto text_of = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  CHECK(text_of(path) == "new text\n");
  CHECK(text_of(victim) == "keep me\n");
  // A directory in the file's place: refused, naming it, and no temporary file is left.
  const std::string taken = dir.file("taken");
  std::filesystem::create_directory(taken);
  CHECK_THROWS_WITH(tnt::write_file_atomically(taken, "x", "test file"),
                    Catch::Contains("test file '" + taken + "': cannot rename the temporary file to it") &&
                        Catch::Contains("(the file is as it was)"));
  int left = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path)) {
    left += entry.path().filename().string().rfind(".taken.tmp", 0) == 0 ? 1 : 0;
  }
  CHECK(left == 0);
}
