// Allreduce (ring, mpi; sum and average), broadcast and allgather on host buffers, for
// every host dtype and element counts around every edge: 0, 1, p-1, p, p+1, primes,
// 2^k +- 1 (k = 12 straddles the ring's small-message switch at 16 KiB of f32), several
// segments with a remainder. Every element is checked against a closed form, and guard
// elements on both sides of each buffer must keep their poison. Checks are non-fatal
// (CHECK) so that all ranks stay in step through the collectives of a test case.
// The 64 Mi-element case is in test_large.cpp (registered for fewer rank counts).
#include "comm_test_data.hpp"

#include "comm/waiter.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

using namespace tnt;
using tnt::test::poison;
using tnt::test::same;
using tnt::test::value;

namespace {

constexpr int64_t kGuard = 16;  // poisoned elements before and after every buffer

std::vector<int64_t> edge_counts(int p) {
  std::set<int64_t> counts = {0, 1, static_cast<int64_t>(p) - 1, p, static_cast<int64_t>(p) + 1, 2, 3, 7, 13, 997,
                              65537, 4095, 4096, 4097, 65535, 65536, 1048575, 1048577};
  counts.erase(-1);
  return {counts.begin(), counts.end()};
}

template <typename T>
int64_t guard_damage(const std::vector<T>& buf, int64_t count) {
  int64_t bad = 0;
  for (int64_t i = 0; i < kGuard; ++i) {
    bad += !same(buf[static_cast<size_t>(i)], poison<T>());
    bad += !same(buf[static_cast<size_t>(kGuard + count + i)], poison<T>());
  }
  return bad;
}

template <typename T>
void check_allreduce(Communicator& comm, AllreduceAlgo algo, ReduceOp op, int64_t count) {
  const int p = comm.size(), r = comm.rank();
  std::vector<T> buf(static_cast<size_t>(count + 2 * kGuard), poison<T>());
  T* data = buf.data() + kGuard;
  for (int64_t i = 0; i < count; ++i) data[i] = value<T>(i, r);
  comm.allreduce(data, count, dtype_of<T>(), Device::cpu(), op, algo);
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    T expect = tnt::test::sum_over_ranks<T>(i, p);
    if (op == ReduceOp::average) expect = static_cast<T>(expect / static_cast<T>(p));
    wrong += !same(data[i], expect);
  }
  INFO("allreduce " << allreduce_algo_name(algo) << (op == ReduceOp::average ? " average " : " sum ")
                    << dtype_name(dtype_of<T>()) << " count " << count << " on " << p << " ranks, rank " << r);
  CHECK(wrong == 0);
  CHECK(guard_damage(buf, count) == 0);
}

template <typename T>
void check_broadcast(Communicator& comm, int root, int64_t count) {
  const int r = comm.rank();
  std::vector<T> buf(static_cast<size_t>(count + 2 * kGuard), poison<T>());
  T* data = buf.data() + kGuard;
  if (r == root) {
    for (int64_t i = 0; i < count; ++i) data[i] = value<T>(i, root);
  }
  comm.broadcast(data, count, dtype_of<T>(), Device::cpu(), root);
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) wrong += !same(data[i], value<T>(i, root));
  INFO("broadcast " << dtype_name(dtype_of<T>()) << " count " << count << " root " << root << ", rank " << r);
  CHECK(wrong == 0);
  CHECK(guard_damage(buf, count) == 0);
}

template <typename T>
void check_allgather(Communicator& comm, int64_t count) {
  const int p = comm.size(), r = comm.rank();
  std::vector<T> in(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) in[static_cast<size_t>(i)] = value<T>(i, r);
  std::vector<T> out(static_cast<size_t>(p * count + 2 * kGuard), poison<T>());
  comm.allgather(in.data(), out.data() + kGuard, count, dtype_of<T>(), Device::cpu());
  int64_t wrong = 0;
  for (int q = 0; q < p; ++q) {
    for (int64_t i = 0; i < count; ++i) wrong += !same(out[static_cast<size_t>(kGuard + q * count + i)], value<T>(i, q));
  }
  INFO("allgather " << dtype_name(dtype_of<T>()) << " count " << count << ", rank " << r);
  CHECK(wrong == 0);
  CHECK(guard_damage(out, p * count) == 0);
}

}  // namespace

TEST_CASE("communicator reports the job's ranks", "[comm]") {
  Communicator& comm = communicator();
  CHECK(comm.rank() == tnt::rank());
  CHECK(comm.size() == tnt::size());
  CHECK(comm.local_rank() == tnt::local_rank());
  CHECK(comm.local_size() == tnt::local_size());
  CHECK(comm.is_master() == (comm.rank() == 0));
  CHECK(comm.timeout() == config().collective_timeout_s);
  MPI_Comm world = detail::impl_of(comm).comm;
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(world, MPI_COMM_WORLD, &result);
  CHECK(result == MPI_CONGRUENT);  // same ranks, own context: our tags never meet the user's
  // Every rank sees the same rank list, in order.
  std::vector<int64_t> ranks = comm.allgather(int64_t{comm.rank()});
  for (int q = 0; q < comm.size(); ++q) CHECK(ranks[static_cast<size_t>(q)] == q);
}

TEST_CASE("algorithm choice", "[comm]") {
  Communicator& comm = communicator();
  CHECK(parse_allreduce_algo("") == AllreduceAlgo::automatic);
  CHECK(parse_allreduce_algo("ring") == AllreduceAlgo::ring);
  CHECK(parse_allreduce_algo("mpi") == AllreduceAlgo::mpi);
  CHECK(parse_allreduce_algo("nccl") == AllreduceAlgo::nccl);
  CHECK_THROWS_WITH(parse_allreduce_algo("tree"), Catch::Contains("'tree'"));
  AllreduceAlgo host = comm.resolve(AllreduceAlgo::automatic, Device::cpu());
  if (config().allreduce_algo == "mpi") {
    CHECK(host == AllreduceAlgo::mpi);
  } else {
    CHECK(host == AllreduceAlgo::ring);
  }
  CHECK(comm.resolve(AllreduceAlgo::automatic, Device::cuda(0)) == AllreduceAlgo::nccl);
  CHECK_THROWS_WITH(comm.resolve(AllreduceAlgo::nccl, Device::cpu()), Catch::Contains("device buffer"));
  CHECK_THROWS_WITH(comm.resolve(AllreduceAlgo::ring, Device::cuda(0)), Catch::Contains("needs nccl"));
}

TEST_CASE("allreduce: every host algorithm, dtype and edge count", "[comm][allreduce]") {
  Communicator& comm = communicator();
  AllreduceAlgo algo = GENERATE(AllreduceAlgo::ring, AllreduceAlgo::mpi);
  for (int64_t count : edge_counts(comm.size())) {
    check_allreduce<float>(comm, algo, ReduceOp::sum, count);
    check_allreduce<double>(comm, algo, ReduceOp::sum, count);
    check_allreduce<int32_t>(comm, algo, ReduceOp::sum, count);
    check_allreduce<int64_t>(comm, algo, ReduceOp::sum, count);
    check_allreduce<float>(comm, algo, ReduceOp::average, count);
    check_allreduce<double>(comm, algo, ReduceOp::average, count);
  }
}

TEST_CASE("ring allreduce: both of its paths at every edge count", "[comm][allreduce]") {
  // The switch between recursive doubling and the ring moved to either end, and 4 KiB
  // segments (the finest cut the ring makes), so that every count takes each path and
  // large ones stream many segments per chunk, with remainders.
  auto comm = communicator().duplicate();
  detail::CommImpl& impl = detail::impl_of(*comm);
  impl.ring_segment_bytes = 4096;
  for (int64_t small : {int64_t{0}, int64_t{1} << 40}) {
    impl.small_bytes = small;
    for (int64_t count : edge_counts(comm->size())) {
      check_allreduce<float>(*comm, AllreduceAlgo::ring, ReduceOp::sum, count);
      check_allreduce<int64_t>(*comm, AllreduceAlgo::ring, ReduceOp::sum, count);
      check_allreduce<double>(*comm, AllreduceAlgo::ring, ReduceOp::average, count);
    }
  }
}

TEST_CASE("allreduce of a Tensor, and argument errors", "[comm][allreduce]") {
  Communicator& comm = communicator();
  const int p = comm.size();
  Tensor t = Tensor::full({3, 5}, comm.rank() + 1.0);
  comm.allreduce(t);
  for (float v : t.to_vector()) CHECK(v == static_cast<float>(p * (p + 1) / 2));
  Tensor a = Tensor::full({7}, 2.0 * (comm.rank() + 1));
  comm.allreduce(a, ReduceOp::average, AllreduceAlgo::mpi);
  for (float v : a.to_vector()) CHECK(v == static_cast<float>(p + 1));

  Tensor ints = Tensor::zeros({4}, DType::i32);
  CHECK_THROWS_WITH(comm.allreduce(ints, ReduceOp::average), Catch::Contains("floating-point"));
  Tensor bytes = Tensor::zeros({4}, DType::u8);
  CHECK_THROWS_WITH(comm.allreduce(bytes), Catch::Contains("u8"));
  Tensor none;
  CHECK_THROWS(comm.allreduce(none));
  CHECK_THROWS_WITH(comm.allreduce(nullptr, -1, DType::f32, Device::cpu()), Catch::Contains("negative"));
  // Argument errors are found before the collective starts, so the communicator is fine.
  comm.barrier();
}

#ifndef TNT_WITH_CUDA
TEST_CASE("CPU-only build: device buffers fail clearly", "[comm]") {
  Communicator& comm = communicator();
  float x[4] = {1, 2, 3, 4};
  auto dup = comm.duplicate();  // the failed call leaves its communicator unusable
  CHECK_THROWS_WITH(dup->allreduce(x, 4, DType::f32, Device::cuda(0)), Catch::Contains("built with CUDA"));
}
#endif

TEST_CASE("broadcast: roots, dtypes, edge counts", "[comm][broadcast]") {
  Communicator& comm = communicator();
  const int p = comm.size();
  for (int root : std::set<int>{0, p - 1, p / 2}) {
    for (int64_t count : edge_counts(p)) {
      check_broadcast<float>(comm, root, count);
      check_broadcast<double>(comm, root, count);
      check_broadcast<int32_t>(comm, root, count);
      check_broadcast<int64_t>(comm, root, count);
    }
  }
  Tensor t = comm.rank() == p - 1 ? Tensor::full({2, 3}, 42.0) : Tensor::zeros({2, 3});
  comm.broadcast(t, p - 1);
  for (float v : t.to_vector()) CHECK(v == 42.0f);
  std::string text = comm.rank() == 0 ? std::string(5000, 'x') + "end" : "something else";
  comm.broadcast(text);
  CHECK(text == std::string(5000, 'x') + "end");
  CHECK_THROWS_WITH(comm.broadcast(t, p), Catch::Contains("not a rank"));
}

TEST_CASE("allgather: dtypes, edge counts, tensors", "[comm][allgather]") {
  Communicator& comm = communicator();
  const int p = comm.size();
  for (int64_t count : {int64_t{0}, int64_t{1}, static_cast<int64_t>(p) + 1, int64_t{997}, int64_t{65537}}) {
    check_allgather<float>(comm, count);
    check_allgather<double>(comm, count);
    check_allgather<int32_t>(comm, count);
    check_allgather<int64_t>(comm, count);
  }
  Tensor mine = Tensor::full({2, 2}, comm.rank());
  Tensor all = comm.allgather(mine);
  REQUIRE(all.shape() == Shape{p, 2, 2});
  std::vector<float> v = all.to_vector();
  for (int q = 0; q < p; ++q) {
    for (int i = 0; i < 4; ++i) CHECK(v[static_cast<size_t>(q * 4 + i)] == static_cast<float>(q));
  }
}

TEST_CASE("scalar helpers for the training loop", "[comm]") {
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  CHECK(comm.allreduce_sum(0.5 * (r + 1)) == 0.25 * p * (p + 1));
  CHECK(comm.allreduce_sum(int64_t{1} << 40) == (int64_t{1} << 40) * p);
  CHECK(comm.allreduce_sum(3) == 3 * p);  // int
  CHECK(comm.allreduce_max(static_cast<double>(r)) == p - 1);
  CHECK(comm.allreduce_min(static_cast<double>(r) - 1.5) == -1.5);
  std::vector<double> sums = comm.allreduce_sum(std::vector<double>{1.0, static_cast<double>(r), -2.0});
  CHECK(sums == std::vector<double>{1.0 * p, p * (p - 1) / 2.0, -2.0 * p});
  std::vector<int64_t> counts = comm.allreduce_sum(std::vector<int64_t>{r, 10});
  CHECK(counts == std::vector<int64_t>{p * (p - 1) / 2, 10 * p});
  std::vector<int64_t> gathered = comm.allgather(int64_t{100 + r});
  for (int q = 0; q < p; ++q) CHECK(gathered[static_cast<size_t>(q)] == 100 + q);
  int64_t before = comm.collectives_entered();
  comm.barrier();
  CHECK(comm.collectives_entered() == before + 1);
}

TEST_CASE("duplicates are independent communicators", "[comm]") {
  Communicator& comm = communicator();
  auto a = comm.duplicate();
  auto b = a->duplicate();
  CHECK(a->size() == comm.size());
  CHECK(b->rank() == comm.rank());
  CHECK(a->collectives_entered() == 0);
  a->set_timeout(30);
  CHECK(a->timeout() == 30);
  CHECK(a->duplicate()->timeout() == 30);
  check_allreduce<float>(*a, AllreduceAlgo::ring, ReduceOp::sum, 1000);
  check_allreduce<float>(*b, AllreduceAlgo::ring, ReduceOp::sum, 100000);
  CHECK(a->collectives_entered() == 1);
  CHECK_THROWS(a->set_timeout(-1));  // 0 is "no timeout" (test_timeout.cpp)
}
