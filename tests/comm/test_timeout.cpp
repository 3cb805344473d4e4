// TNT_COLLECTIVE_TIMEOUT: the last rank skips a collective; the others must fail within a
// short timeout (1 s, set on a duplicate communicator) with a CommError that names the
// operation and the rank that never joined. Each case uses a fresh duplicate (a failed
// communicator is unusable), and all ranks meet again on the world communicator after it.
#include "tarantella/comm.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <chrono>
#include <thread>
#include <functional>
#include <string>
#include <vector>

using namespace tnt;

namespace {

constexpr double kTimeout = 1.0;
// Upper bound on how long a failing rank may take: the timeout, the 2 s the arrival query
// may wait for silent ranks, and generous slack for 3 ranks sharing 2 busy cores.
constexpr double kMaxSeconds = kTimeout + 2.0 + 10.0;

void expect_timeout(const std::string& op_text, const std::function<void(Communicator&)>& op) {
  Communicator& world = communicator();
  const int p = world.size(), r = world.rank();
  const int absent = p - 1;
  auto comm = world.duplicate();
  comm->set_timeout(kTimeout);
  if (r != absent) {
    auto t0 = std::chrono::steady_clock::now();
    std::string msg;
    try {
      op(*comm);
    } catch (const CommError& e) {
      msg = e.what();
    }
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO("rank " << r << ": " << msg);
    CHECK_THAT(msg, Catch::Contains(op_text));
    CHECK_THAT(msg, Catch::Contains("did not complete within 1 s"));
    CHECK_THAT(msg, Catch::Contains("rank(s) " + std::to_string(absent) + " never joined"));
    CHECK(took >= kTimeout);
    CHECK(took < kMaxSeconds);
    // Unusable afterwards, with a message that says why.
    CHECK_THROWS_WITH(comm->barrier(), Catch::Contains("unusable"));
  }
  world.barrier();
}

}  // namespace

TEST_CASE("a timeout of 0 means none: a late rank is waited for", "[comm][timeout]") {
  Communicator& world = communicator();
  auto comm = world.duplicate();
  comm->set_timeout(0);
  // The last rank joins 1.5 s late; with 0 read as "0 s" the others would fail at once.
  if (comm->rank() == comm->size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(comm->allreduce_sum(1.0) == static_cast<double>(comm->size()));
  CHECK_THROWS_AS(comm->set_timeout(-1), InputError);
  world.barrier();
}

TEST_CASE("a rank that skips a collective makes the others fail in time", "[comm][timeout]") {
  REQUIRE(communicator().size() >= 2);
  std::vector<float> big(1 << 20, 1.0f), small(10, 1.0f), out(10 * 8);
  SECTION("ring allreduce") {
    expect_timeout("allreduce(ring, 1048576 x f32)", [&](Communicator& c) {
      c.allreduce(big.data(), static_cast<int64_t>(big.size()), DType::f32, Device::cpu(), ReduceOp::sum,
                  AllreduceAlgo::ring);
    });
  }
  SECTION("ring allreduce, small-message path") {
    expect_timeout("allreduce(ring, 10 x f32)", [&](Communicator& c) {
      c.allreduce(small.data(), 10, DType::f32, Device::cpu(), ReduceOp::sum, AllreduceAlgo::ring);
    });
  }
  SECTION("MPI allreduce") {
    expect_timeout("allreduce(mpi, 10 x f32)", [&](Communicator& c) {
      c.allreduce(small.data(), 10, DType::f32, Device::cpu(), ReduceOp::sum, AllreduceAlgo::mpi);
    });
  }
  SECTION("broadcast from the absent rank") {
    // (A root that is present may finish without the absent rank: its sends complete.)
    const int absent = communicator().size() - 1;
    expect_timeout(fmt::format("broadcast(root {}", absent),
                   [&](Communicator& c) { c.broadcast(small.data(), 10, DType::f32, Device::cpu(), absent); });
  }
  SECTION("allgather") {
    expect_timeout("allgather(1 x f32", [&](Communicator& c) {
      c.allgather(small.data(), out.data(), 1, DType::f32, Device::cpu());
    });
  }
  SECTION("barrier") {
    expect_timeout("barrier", [&](Communicator& c) { c.barrier(); });
  }
  SECTION("scalar sum") {
    expect_timeout("allreduce_sum(1 value(s))", [&](Communicator& c) { c.allreduce_sum(1.0); });
  }
}

TEST_CASE("a Reducer whose bucket never completes fails in finalize", "[comm][timeout]") {
  Communicator& world = communicator();
  const int p = world.size(), r = world.rank();
  auto comm = world.duplicate();
  comm->set_timeout(kTimeout);  // the Reducer's own duplicate inherits it
  std::vector<std::pair<std::string, Tensor>> grads = {{"a", Tensor::zeros({1000})}, {"b", Tensor::zeros({1000})}};
  {
    Reducer reducer(*comm, grads, {.threshold_bytes = 0});
    if (r != p - 1) {
      std::string msg;
      try {
        reducer.finalize();
      } catch (const CommError& e) {
        msg = e.what();
      }
      INFO("rank " << r << ": " << msg);
      CHECK_THAT(msg, Catch::Contains("allreduce(ring, 1000 x f32)"));
      CHECK_THAT(msg, Catch::Contains("rank(s) " + std::to_string(p - 1) + " never joined"));
      CHECK_THROWS_WITH(reducer.finalize(), Catch::Contains("unusable"));
    }
  }
  world.barrier();
}

// A rank that has not reached a collective a while after the others is named once, by the
// lowest-numbered rank waiting, rank 0 here (before: silence until TNT_COLLECTIVE_TIMEOUT, 600 s by
// default). The warning comes after min(60 s, a quarter of the timeout): 4 s of a 16-s
// timeout here, at the waiters' look at 4.5 s (the next is at 10.5 s); the last rank joins
// after 9 s, leaving that look 4.5 s on a loaded machine, and the collective completes.
TEST_CASE("a rank that is late to a collective is named once while the others wait", "[comm][timeout]") {
  Communicator& world = communicator();
  const int p = world.size(), r = world.rank(), late = p - 1;
  auto comm = world.duplicate();
  comm->set_timeout(16);
  char path[] = "/tmp/tnt_stall_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  if (r == late) std::this_thread::sleep_for(std::chrono::seconds(9));
  CHECK_NOTHROW(comm->barrier());
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  const std::string said = text.str();
  INFO("rank " << r << " wrote: " << said);
  if (r == 0) {
    CHECK_THAT(said, Catch::Contains("barrier") && Catch::Contains("for rank(s) " + std::to_string(late) +
                                                                   ", which have not reached it"));
    CHECK_THAT(said, Catch::Contains("TNT_COLLECTIVE_TIMEOUT=16 s"));
  } else if (r == late) {
    CHECK(said.find("have not reached it") == std::string::npos);  // the rank behind waited for nobody
  }
  world.barrier();
}
