// The 64 Mi-element allreduce (256 MiB of f32 per rank), ring and mpi, every element
// checked. Registered for 2 and 3 ranks only (tests/comm/CMakeLists.txt): it is the
// pipelining and size-limit case, not an edge-count case, and must stay quick on 2 cores.
#include "comm_test_data.hpp"

#include "tarantella/comm.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace tnt;

TEST_CASE("allreduce of 64 Mi f32 elements", "[comm][allreduce][large]") {
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  const int64_t count = int64_t{64} << 20;
  AllreduceAlgo algo = GENERATE(AllreduceAlgo::ring, AllreduceAlgo::mpi);
  std::vector<float> buf(static_cast<size_t>(count) + 1, test::poison<float>());  // +1: a guard after
  for (int64_t i = 0; i < count; ++i) buf[static_cast<size_t>(i)] = test::value<float>(i, r);
  comm.allreduce(buf.data(), count, DType::f32, Device::cpu(), ReduceOp::sum, algo);
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) wrong += !test::same(buf[static_cast<size_t>(i)], test::sum_over_ranks<float>(i, p));
  INFO(allreduce_algo_name(algo) << " on " << p << " ranks, rank " << r);
  CHECK(wrong == 0);
  CHECK(test::same(buf.back(), test::poison<float>()));
}
