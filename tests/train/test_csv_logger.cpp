// CSVLogger driven directly (no MPI): a file it cannot open is named with the reason, no
// file from a fit without epochs, no rows appended to a file of another format.
// Tests run as root, so a directory without write permission would not fail: the paths
// here fail for everyone (a regular file as a directory, a missing parent).
#include <catch2/catch.hpp>

#include "tarantella/callbacks.hpp"
#include "tarantella/check.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/tnt_csv_logger_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

}  // namespace

TEST_CASE("CSVLogger: a path it cannot open is named with the system's reason") {
  const std::string dir = temp_dir();
  const std::string file = dir + "/plain_file";
  std::ofstream(file) << "x\n";

  SECTION("a regular file where a directory should be") {
    const std::string path = file + "/history.csv";
    tnt::CSVLogger csv(path);
    CHECK_THROWS_MATCHES(csv.on_train_begin({}), tnt::InputError,
                         Catch::Message("CSVLogger: cannot open '" + path + "' for writing: Not a directory"));
  }
  SECTION("a parent directory that does not exist") {
    const std::string path = dir + "/no_such_dir/history.csv";
    tnt::CSVLogger csv(path);
    CHECK_THROWS_MATCHES(csv.on_train_begin({}), tnt::InputError,
                         Catch::Message("CSVLogger: cannot open '" + path + "' for writing: No such file or directory"));
  }
  SECTION("appending (a resumed run) to a path under a regular file") {
    const std::string path = file + "/history.csv";
    tnt::CSVLogger csv(path, /*append=*/true);
    CHECK_THROWS_MATCHES(csv.on_train_begin({}), tnt::InputError,
                         Catch::Message("CSVLogger: cannot open '" + path + "' for writing: Not a directory"));
  }
  SECTION("a path that works writes its rows") {
    const std::string path = dir + "/history.csv";
    tnt::CSVLogger csv(path);
    csv.on_train_begin({});
    csv.on_epoch_end(0, {{"loss", 0.5}});
    csv.on_train_end({});
    std::ifstream in(path);
    std::string header, row;
    std::getline(in, header);
    std::getline(in, row);
    CHECK(header == "epoch,loss");
    CHECK(row == "1,0.5");
  }
  SECTION("a fit that ends before its first epoch does leaves no file") {
    const std::string path = dir + "/never.csv";
    tnt::CSVLogger csv(path);
    csv.on_train_begin({});
    csv.on_train_end({});
    CHECK_FALSE(std::filesystem::exists(path));
  }
  SECTION("a resumed run refuses to append to a file that is not a history of this logger") {
    const std::string path = dir + "/other.csv";
    std::ofstream(path) << "step;value\n1;2\n";
    tnt::CSVLogger csv(path, /*append=*/true);
    CHECK_THROWS_WITH(csv.on_train_begin({}), Catch::Contains("CSVLogger: '" + path +
                                                              "' does not begin with the header this logger writes"));
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    CHECK(first == "step;value");  // left as it was
  }
  std::filesystem::remove_all(dir);
}

// A FIFO or a device as the history of a resumed run: reading its rows back would wait for a
// writer forever (the FIFO; this test then hangs until CTest's timeout) or read without end
// (/dev/zero). Refused instead, naming the file and its kind, before any training.
TEST_CASE("CSVLogger: a history that is not a regular file is refused, naming it") {
  const std::string dir = temp_dir();
  const std::string fifo = dir + "/history.csv";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    INFO(path);
    tnt::CSVLogger logger(path, /*append=*/true);
    tnt::TrainParams params;
    params.epochs = 2;
    params.initial_epoch = 1;
    logger.set_params(params);
    CHECK_THROWS_AS(logger.on_train_begin({}), tnt::InputError);
    CHECK_THROWS_WITH(logger.on_train_begin({}),
                      Catch::Contains("'" + path + "'") && Catch::Contains("not a regular file"));
  }
  std::filesystem::remove_all(dir);
}
