// CSVLogger driven directly (no MPI): a file it cannot open is named with the reason, no
// file from a fit without epochs, no rows appended to a file of another format or other
// columns, nothing written through a dangling link or into a FIFO, a failed write is an
// error, a resumed run whose history is missing says so.
// Tests run as root, so a directory without write permission would not fail: the paths
// here fail for everyone (a regular file as a directory, a missing parent).
#include <catch2/catch.hpp>

#include "capture_stderr.hpp"

#include "tarantella/callbacks.hpp"
#include "tarantella/check.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/tnt_csv_logger_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

using tnt::test::captured_stderr;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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

namespace {

// Temporary files the rewrite leaves beside the history (".history.csv.tmp-...").
std::vector<std::string> temps_beside(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".history.csv.tmp-", 0) == 0) names.push_back(name);
  }
  return names;
}

// Forks a process that resumes `path` at initial_epoch (the rewrite of on_train_begin) and,
// when kill_after >= 0, SIGKILLs it that many seconds after it is about to begin. Returns
// the seconds from that moment to its end (killed or not).
double resume_in_child(const std::string& path, int initial_epoch, double kill_after) {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    tnt::CSVLogger csv(path, /*append=*/true);
    tnt::TrainParams params;
    params.epochs = initial_epoch + 1;
    params.initial_epoch = initial_epoch;
    csv.set_params(params);
    const char go = 1;
    if (::write(ready[1], &go, 1) != 1) ::_exit(4);
    try {
      csv.on_train_begin({});
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  ::close(ready[1]);
  char go = 0;
  REQUIRE(::read(ready[0], &go, 1) == 1);
  ::close(ready[0]);
  const auto start = std::chrono::steady_clock::now();
  if (kill_after >= 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kill_after));
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (kill_after < 0) {
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  return seconds;
}

}  // namespace

TEST_CASE("CSVLogger: a resumed run killed while it rewrites history.csv leaves the old file or the new one",
          "[crash]") {
  // 200,000 epochs (4.6 MB) resumed at epoch 100,000: the rewrite reads them, writes half
  // back and syncs it, about 0.1 s in all on this machine's disk. Kills are spread evenly
  // over the time a whole resume takes (measured first), so some land while the new file is
  // being written (its temporary file is then left behind, which shows where the kill
  // landed) and others before and after. Each time, history.csv must be exactly the old
  // file or exactly the new one.
  const std::string dir = temp_dir();
  const std::string path = dir + "/history.csv";
  const int rows = 200000, resume_at = rows / 2;
  std::string old_text = "epoch,loss,accuracy\n", new_text;
  for (int e = 1; e <= rows; ++e) {
    if (e == resume_at + 1) new_text = old_text;
    old_text += std::to_string(e) + ",0.123456,0.654321\n";
  }
  auto write_old = [&] {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << old_text;
    for (const std::string& t : temps_beside(dir)) std::filesystem::remove(dir + "/" + t);
  };
  write_old();
  double whole = 0;  // the longest of three undisturbed resumes
  for (int i = 0; i < 3; ++i) {
    write_old();
    whole = std::max(whole, resume_in_child(path, resume_at, -1));
    REQUIRE(read_all(path) == new_text);  // the rewrite itself, undisturbed
  }

  // Sweeps of 20 kills spread over 1.5 times that, until kills have landed before, inside
  // and after the rewrite (a busy machine stretches the timing; 10 sweeps at most).
  int old_seen = 0, new_seen = 0, inside = 0, kills = 0;
  for (int sweep = 0; sweep < 10 && !(old_seen > 0 && new_seen > 0 && inside > 1); ++sweep) {
    for (int k = 0; k < 20; ++k, ++kills) {
      write_old();
      const double at = 1.5 * whole * (k + 0.5) / 20;
      resume_in_child(path, resume_at, at);
      const std::string text = read_all(path);
      const bool is_old = text == old_text, is_new = text == new_text;
      if (!is_old && !is_new) {
        FAIL_CHECK("killed " << at << " s into a resume: history.csv is neither the old file nor the new one: "
                             << text.size() << " bytes (old " << old_text.size() << ", new " << new_text.size() << ")");
      }
      old_seen += is_old;
      new_seen += is_new;
      inside += !temps_beside(dir).empty();
    }
  }
  INFO(kills << " kills: old file " << old_seen << ", new file " << new_seen << ", killed inside the rewrite " << inside
             << "; an undisturbed resume took " << whole << " s");
  // The kills must have hit the rewrite itself, or this proved nothing.
  CHECK(inside > 1);
  CHECK(old_seen > 0);
  CHECK(new_seen > 0);

  // What a killed rewrite left behind goes at the next rewrite; a live writer's stays.
  write_old();
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  const std::string stale = ".history.csv.tmp-" + std::to_string(dead) + "-abcdef";
  const std::string live = ".history.csv.tmp-" + std::to_string(::getpid()) + "-ghijkl";
  std::ofstream(dir + "/" + stale) << "partial";
  std::ofstream(dir + "/" + live) << "being written";
  REQUIRE(temps_beside(dir).size() == 2);
  resume_in_child(path, resume_at, -1);
  CHECK(read_all(path) == new_text);
  CHECK(temps_beside(dir) == std::vector<std::string>{live});
  std::filesystem::remove_all(dir);
}

TEST_CASE("CSVLogger: nothing is written through a dangling link or into a special file") {
  const std::string dir = temp_dir();
  SECTION("a dangling symbolic link is refused, and no file appears where it points") {
    const std::string target = dir + "/elsewhere.csv";
    const std::string path = dir + "/history.csv";
    std::filesystem::create_symlink(target, path);
    tnt::CSVLogger csv(path);
    bool refused = false;
    try {
      csv.on_train_begin({});
      csv.on_epoch_end(0, {{"loss", 0.5}});
      csv.on_train_end({});
    } catch (const tnt::InputError& e) {
      refused = true;
      CHECK_THAT(e.what(), Catch::Contains("'" + path + "' is a symbolic link to '" + target + "', which does not exist"));
    }
    CHECK(refused);
    CHECK_FALSE(std::filesystem::exists(target));
  }
  SECTION("a FIFO is refused at the start, not waited on") {
    const std::string path = dir + "/history.csv";
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    tnt::CSVLogger csv(path);
    CHECK_THROWS_WITH(csv.on_train_begin({}), Catch::Contains("'" + path + "' is not a regular file"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("CSVLogger: a row that cannot be written is an error, not a silently short history") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/history.csv";
  // A file size limit below the header's length makes the first write fail with EFBIG, as a
  // full disk would with ENOSPC. SIGXFSZ (which would end the test) is ignored meanwhile.
  rlimit old_limit{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  tnt::CSVLogger csv(path);
  csv.on_train_begin({});
  rlimit small = old_limit;
  small.rlim_cur = 8;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string message;
  try {
    csv.on_epoch_end(0, {{"loss", 0.5}, {"accuracy", 0.25}});
  } catch (const tnt::Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  CHECK_THAT(message, Catch::Contains("CSVLogger: writing epoch 1's row to '" + path + "' failed: File too large"));
  // The file this run made holds a cut header only: it goes, so that the directory is not
  // taken for a run with a history (a rerun of the same command then starts cleanly).
  CHECK_FALSE(std::filesystem::exists(path));
  csv.on_train_end({});

  // A history of earlier epochs that a resumed run appends to stays when its row fails.
  const std::string before = "epoch,loss\n1,0.5\n";
  std::ofstream(path) << before;
  tnt::TrainParams params;
  params.initial_epoch = 1;
  tnt::CSVLogger resumed(path, /*append=*/true);
  resumed.set_params(params);
  resumed.on_train_begin({});
  small.rlim_cur = before.size() + 2;
  old_handler = std::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  CHECK_THROWS_WITH(resumed.on_epoch_end(1, {{"loss", 0.25}}), Catch::Contains("writing epoch 2's row"));
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  REQUIRE(std::filesystem::exists(path));
  std::ifstream in(path);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(kept.rfind(before, 0) == 0);
  resumed.on_train_end({});
  std::filesystem::remove_all(dir);
}

TEST_CASE("CSVLogger: a resumed run appends only rows that fit the history's header") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/history.csv";
  tnt::TrainParams params;
  params.initial_epoch = 1;
  SECTION("other columns are refused, naming the file, which stays as it was") {
    const std::string before = "epoch,loss,accuracy\n1,0.5,0.7\n";
    std::ofstream(path) << before;
    tnt::CSVLogger csv(path, /*append=*/true);
    csv.set_params(params);
    csv.set_columns({"loss", "learning_rate", "seconds"});
    CHECK_THROWS_WITH(csv.on_train_begin({}),
                      Catch::Contains("CSVLogger: '" + path + "' has the columns epoch,loss,accuracy but this run logs "
                                      "epoch,loss,learning_rate,seconds"));
    CHECK(read_all(path) == before);
  }
  SECTION("the same columns are appended to") {
    std::ofstream(path) << "epoch,loss,accuracy\n1,0.5,0.7\n";
    tnt::CSVLogger csv(path, /*append=*/true);
    csv.set_params(params);
    csv.set_columns({"loss", "accuracy"});
    csv.on_train_begin({});
    csv.on_epoch_end(1, {{"loss", 0.25}, {"accuracy", 0.75}});
    csv.on_train_end({});
    CHECK(read_all(path) == "epoch,loss,accuracy\n1,0.5,0.7\n2,0.25,0.75\n");
  }
  SECTION("other columns are refused before the rows after the checkpoint are cut") {
    // Before, rows 2 and 3 were removed first and the columns refused after.
    const std::string before = "epoch,loss,foo\n1,0.5,1\n2,0.4,1\n3,0.3,1\n";
    std::ofstream(path) << before;
    tnt::CSVLogger csv(path, /*append=*/true);
    csv.set_params(params);
    csv.set_columns({"loss"});
    CHECK_THROWS_WITH(csv.on_train_begin({}), Catch::Contains("has the columns epoch,loss,foo"));
    CHECK(read_all(path) == before);
  }
  SECTION("a file without a newline is refused as it is, unless it is a header cut short") {
    // Before, a file of one line without '\n' had no complete line and was emptied.
    const std::string notes = "notes about this run, no newline";
    std::ofstream(path) << notes;
    {
      tnt::CSVLogger csv(path, /*append=*/true);
      csv.set_params(params);
      csv.set_columns({"loss"});
      CHECK_THROWS_WITH(csv.on_train_begin({}), Catch::Contains("does not begin with the header this logger writes"));
      CHECK(read_all(path) == notes);
    }
    std::ofstream(path) << "epoch,lo";  // a crash in the middle of the first write
    tnt::CSVLogger csv(path, /*append=*/true);
    csv.set_params(params);
    csv.set_columns({"loss"});
    csv.on_train_begin({});
    csv.on_epoch_end(1, {{"loss", 0.25}});
    csv.on_train_end({});
    CHECK(read_all(path) == "epoch,loss\n2,0.25\n");
  }
  SECTION("a byte-order mark (a spreadsheet's UTF-8) is dropped, the rows kept") {
    std::ofstream(path) << "\xEF\xBB\xBF" "epoch,loss\n1,0.5\n";
    tnt::CSVLogger csv(path, /*append=*/true);
    csv.set_params(params);
    csv.set_columns({"loss"});
    csv.on_train_begin({});
    csv.on_epoch_end(1, {{"loss", 0.25}});
    csv.on_train_end({});
    CHECK(read_all(path) == "epoch,loss\n1,0.5\n2,0.25\n");
  }
  SECTION("rows missing before the resume are named in a warning") {
    params.initial_epoch = 4;
    std::ofstream(path) << "epoch,loss\n1,0.5\n3,0.3\n";
    tnt::CSVLogger csv(path, /*append=*/true);
    csv.set_params(params);
    csv.set_columns({"loss"});
    const std::string said = captured_stderr([&] { csv.on_train_begin({}); });
    CHECK_THAT(said, Catch::Contains("CSVLogger: '" + path + "' has no row for epochs 2, 4 of the 4 before this "
                                     "resumed run: the history goes on without them"));
    // All there: nothing said.
    std::ofstream(path) << "epoch,loss\n1,0.5\n2,0.4\n3,0.3\n4,0.2\n";
    tnt::CSVLogger whole(path, /*append=*/true);
    whole.set_params(params);
    whole.set_columns({"loss"});
    CHECK(captured_stderr([&] { whole.on_train_begin({}); }).find("has no row") == std::string::npos);
  }
  SECTION("a missing history is named in a warning, and a new one starts") {
    params.initial_epoch = 3;
    tnt::CSVLogger csv(path, /*append=*/true);
    csv.set_params(params);
    csv.set_columns({"loss"});
    const std::string said = captured_stderr([&] { csv.on_train_begin({}); });
    CHECK_THAT(said, Catch::Contains("CSVLogger: '" + path + "' is missing: the history of this resumed run starts at "
                                     "epoch 4, without the rows of epochs 1 to 3"));
    csv.on_epoch_end(3, {{"loss", 0.125}});
    csv.on_train_end({});
    CHECK(read_all(path) == "epoch,loss\n4,0.125\n");
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
  // A directory, resumed or not: named as such (a resumed run said "basic_filebuf::underflow
  // error reading the file: Is a directory", naming nothing).
  const std::string directory = dir + "/history_dir.csv";
  std::filesystem::create_directory(directory);
  for (const bool append : {true, false}) {
    tnt::CSVLogger logger(directory, append);
    tnt::TrainParams params;
    params.epochs = 2;
    params.initial_epoch = 1;
    logger.set_params(params);
    CHECK_THROWS_MATCHES(logger.on_train_begin({}), tnt::InputError,
                         Catch::Message("CSVLogger: '" + directory + "' is a directory: the history goes into a file "
                                        "(give a file's path, or remove the directory)"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("CSVLogger: validation columns from the start when the first epoch has none; names quoted") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/history.csv";
  tnt::TrainParams params;
  params.metrics = {"loss", "accuracy"};
  SECTION("validation_freq 2: epoch 1 has no val_ values, epoch 2 has them") {
    // Before, the header came from epoch 1's logs alone and the val_ columns were never
    // written. Keras adds them too; empty fields where an epoch has none.
    params.validates = true;
    tnt::CSVLogger csv(path);
    csv.set_params(params);
    csv.on_train_begin({});
    csv.on_epoch_end(0, {{"loss", 0.5}, {"accuracy", 0.25}});
    csv.on_epoch_end(1, {{"loss", 0.25}, {"accuracy", 0.5}, {"val_loss", 0.75}, {"val_accuracy", 0.125}});
    csv.on_train_end({});
    CHECK(read_all(path) == "epoch,accuracy,loss,val_accuracy,val_loss\n1,0.25,0.5,,\n2,0.5,0.25,0.125,0.75\n");
  }
  SECTION("no validation: no val_ columns") {
    tnt::CSVLogger csv(path);
    csv.set_params(params);
    csv.on_train_begin({});
    csv.on_epoch_end(0, {{"loss", 0.5}, {"accuracy", 0.25}});
    csv.on_train_end({});
    CHECK(read_all(path) == "epoch,accuracy,loss\n1,0.25,0.5\n");
  }
  SECTION("a name with a comma or a quote is quoted, and a resumed run reads the header back") {
    // Before, the header had more fields than the rows: csv readers shifted every column.
    {
      tnt::CSVLogger csv(path);
      csv.set_params(params);
      csv.on_train_begin({});
      csv.on_epoch_end(0, {{"loss", 0.5}, {"f1,\"macro\"", 0.25}});
      csv.on_train_end({});
    }
    CHECK(read_all(path) == "epoch,\"f1,\"\"macro\"\"\",loss\n1,0.25,0.5\n");
    params.initial_epoch = 1;
    tnt::CSVLogger csv(path, /*append=*/true);
    csv.set_params(params);
    csv.set_columns({"f1,\"macro\"", "loss"});
    csv.on_train_begin({});
    csv.on_epoch_end(1, {{"loss", 0.25}, {"f1,\"macro\"", 0.5}});
    csv.on_train_end({});
    CHECK(read_all(path) == "epoch,\"f1,\"\"macro\"\"\",loss\n1,0.25,0.5\n2,0.5,0.25\n");
  }
  std::filesystem::remove_all(dir);
}
