// The tutorial's batch on real ranks (run with 2 and 4): 32736 tokens // 256 = 127 sentences,
// a prime, split unevenly by automatic distribution (4 ranks: 32, 32, 32, 31). Gathered,
// the ranks' slices of every step are exactly one rank's global batch. Manual distribution
// refuses that batch on every rank alike.
#include "temp_dir.hpp"
#include <catch2/catch.hpp>
#include <mpi.h>

#include "tarantella/check.hpp"
#include "tarantella/runtime.hpp"
#include "tarantella/tfrecord.hpp"
#include "tarantella/text/translation.hpp"

using namespace tnt;

namespace {

// 400 sentence pairs of 2..9 ids a side; the first id of each side identifies the pair.
TranslationData make_data(const test::TempDir& dir) {
  TFRecordWriter w((dir.path / "demo-train-00001-of-00001").string());
  for (int64_t k = 0; k < 400; ++k) {
    Example ex;
    std::vector<int64_t> in(static_cast<size_t>(2 + k % 8), 5), out(static_cast<size_t>(2 + (k * 3) % 8), 6);
    in[0] = 1000 + k;
    out[0] = 5000 + k;
    in.back() = out.back() = 1;
    ex.int64_features = {{"inputs", in}, {"targets", out}};
    w.write(serialize_example(ex));
  }
  w.close();
  return read_translation(dir.path.string(), "train", {.max_length = 8, .num_sentences = 0});
}

std::vector<int64_t> first_ids(const Tensor& t) {  // (b, T) -> column 0
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < t.dim(0); ++r) ids.push_back(t.data<int32_t>()[r * t.dim(1)]);
  return ids;
}

std::vector<int64_t> allgather(const std::vector<int64_t>& mine) {  // in rank order
  int p = tnt::size();
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(p)), displs(static_cast<size_t>(p));
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < p; ++r) displs[static_cast<size_t>(r)] = total, total += counts[static_cast<size_t>(r)];
  std::vector<int64_t> all(static_cast<size_t>(total));
  MPI_Allgatherv(mine.data(), n, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

}  // namespace

TEST_CASE("translation: 127 sentences split unevenly over the ranks equal one rank's batch", "[translation]") {
  test::TempDir dir;
  TranslationData data = make_data(dir);
  // Inputs of 9 ids (k % 8 == 7) and targets of 9 (3k % 8 == 7, k % 8 == 5) exceed 8.
  REQUIRE(data.size() == 300);
  const int64_t B = sentences_per_batch(32736, 256);
  REQUIRE(B == 127);
  const int p = tnt::size(), r = tnt::rank();
  TranslationOptions o{.max_length = 8, .seed = 5};

  // One rank's view: the same shuffled order cut into global batches of 127.
  std::vector<std::vector<int64_t>> serial_in, serial_out;
  {
    auto it = translation_dataset(data, o).batch(B, /*drop_remainder=*/true).iterate(2);
    while (auto b = it.next()) {
      serial_in.push_back(first_ids((*b)[0]));
      serial_out.push_back(first_ids((*b)[1]));
    }
  }
  REQUIRE(serial_in.size() == 2);  // 300 // 127

  DistributedDataset dist = translation_dataset(data, o).distribute(B, r, p, Remainder::drop);
  // 127 = p * (127 / p) + 127 % p: the first 127 % p ranks take one more.
  CHECK(dist.micro_batch_size() == B / p + (r < B % p ? 1 : 0));
  auto it = dist.iterate(2);
  size_t step = 0;
  while (auto b = it.next()) {
    REQUIRE(step < serial_in.size());
    CHECK(b->columns[0].shape() == Shape{dist.micro_batch_size(), 8});
    CHECK(b->real_samples == dist.micro_batch_size());
    CHECK(b->global_real_samples == B);
    CHECK(allgather(first_ids(b->columns[0])) == serial_in[step]);
    CHECK(allgather(first_ids(b->columns[1])) == serial_out[step]);
    ++step;
  }
  CHECK(step == serial_in.size());
}

TEST_CASE("translation: manual distribution refuses 127 sentences on every rank", "[translation]") {
  test::TempDir dir;
  TranslationData data = make_data(dir);
  const int p = tnt::size(), r = tnt::rank();
  REQUIRE(p > 1);  // 127 is prime: no rank count above 1 divides it
  std::string msg;
  try {
    translation_dataset_by_rank(data, 127, r, p);
  } catch (const InputError& e) {
    msg = e.what();
  }
  CHECK(msg.find(fmt::format("a global batch of 127 sentences does not split evenly over {} ranks", p)) !=
        std::string::npos);
  // A batch they divide works: 4 * p sentences, 4 per rank.
  auto it = translation_dataset_by_rank(data, 4 * p, r, p).iterate(0);
  auto b = it.next();
  REQUIRE(b);
  CHECK((*b)[0].shape() == Shape{4, 8});
}
