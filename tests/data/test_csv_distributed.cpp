// Dataset::from_csv on several ranks (run with 2 and 3): every rank reads the same file (the
// master writes it into a shared job directory), distribute() gives each rank its own rows,
// and a bad file fails on every rank with the same message (no rank left waiting).
#include <catch2/catch.hpp>

#include "job_dir.hpp"
#include "temp_dir.hpp"

#include "tarantella/check.hpp"
#include "tarantella/dataset.hpp"
#include "tarantella/runtime.hpp"

#include <filesystem>
#include <string>

using namespace tnt;

namespace {

// The master writes text to dir/name; every rank learns it is there (the broadcast waits
// for the write).
std::string shared_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::string done;
  if (tnt::is_master_rank()) {
    test::write_bytes(path, test::Bytes(text.begin(), text.end()));
    done = path;
  }
  tnt::communicator().broadcast(done);
  REQUIRE(done == path);
  return path;
}

}  // namespace

TEST_CASE("csv on several ranks: each rank gets its slice of every global batch", "[csv][mpi]") {
  const std::string dir = test::job_dir("tnt_csv");
  std::string text = "id,value,label\n";
  const int64_t n = 11;  // global batches of 4: two full, one of 3 real rows (padded)
  for (int64_t i = 0; i < n; ++i) text += std::to_string(i) + "," + std::to_string(i) + ".5," + std::to_string(i % 3) + "\n";
  const std::string path = shared_file(dir, "rows.csv", text);
  Dataset::CsvOptions o;
  o.features = {"id", "value"};
  o.labels = {"label"};
  const int64_t batch = 4;
  auto it = Dataset::from_csv(path, o).distribute(batch, Remainder::pad).iterate(0);
  int64_t steps = 0;
  while (auto b = it.next()) {
    const int64_t first = b->step * batch + b->sample_offset;  // this rank's first row
    const std::vector<float> x = b->columns[0].to_vector();    // (b, 2)
    const std::vector<double> y = b->columns[1].to_double_vector();
    REQUIRE(b->columns[1].dtype() == DType::i32);
    for (int64_t r = 0; r < b->real_samples; ++r) {
      INFO("rank " << tnt::rank() << ", step " << b->step << ", row " << r);
      CHECK(x[static_cast<size_t>(2 * r)] == static_cast<float>(first + r));
      CHECK(x[static_cast<size_t>(2 * r + 1)] == static_cast<float>(first + r) + 0.5f);
      CHECK(y[static_cast<size_t>(r)] == static_cast<double>((first + r) % 3));
    }
    ++steps;
  }
  CHECK(steps == 3);
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}

TEST_CASE("csv on several ranks: a bad file is an InputError on every rank", "[csv][mpi]") {
  const std::string dir = test::job_dir("tnt_csv_bad");
  const std::string path = shared_file(dir, "bad.csv", "x,y\n1,2\n3,oops\n");
  Dataset::CsvOptions o;
  o.features = {"x", "y"};
  std::string message;
  try {
    (void)Dataset::from_csv(path, o);
  } catch (const InputError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains(path) && Catch::Contains("line 3") && Catch::Contains("column 1 ('y')"));
  // The same message on every rank: the master's, broadcast, against this rank's.
  std::string master = message;
  tnt::communicator().broadcast(master);
  CHECK(message == master);
  tnt::communicator().barrier();
  if (tnt::is_master_rank()) std::filesystem::remove_all(dir);
}
