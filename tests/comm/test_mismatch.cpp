// Collectives that not every rank calls (comm/rank_positions.hpp, comm/collective_scope.hpp):
// a mismatch fails fast on every rank that waits, naming each side's call; ranks that arrive
// together are never asked anything; a rank that is merely late is waited for; a real stall
// still waits for the timeout and then says where each rank is; the broadcast root blames
// the absent rank, not itself; a collective inside code that runs on some ranks only is
// refused at once.
// Each case works on a fresh duplicate (a failed communicator is unusable), and all ranks
// meet again on the world communicator after it.
#include "comm/collective_scope.hpp"
#include "comm/waiter.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace tnt;

namespace {

using Seconds = std::chrono::duration<double>;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return Seconds(std::chrono::steady_clock::now() - t0).count();
}

// A bound that tells "failed fast" from "waited for the timeout" (600 s in those cases): the
// 1.5 s grace, one arrival query, and generous slack for 3 ranks on 2 busy cores. Not a
// speed claim.
constexpr double kFastSeconds = 30.0;

// This rank's arrival channel (shared by all its communicators): queries it answered.
int64_t queries_answered(const Communicator& comm) { return detail::impl_of(comm).arrivals->queries_answered(); }

}  // namespace

TEST_CASE("a collective called on some ranks only fails fast, naming each side's call", "[comm][mismatch]") {
  Communicator& world = communicator();
  REQUIRE(world.size() >= 2);
  auto comm = world.duplicate();
  comm->set_timeout(600);
  const double grace = detail::impl_of(*comm).mismatch_grace_s;
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    // The master sums two values over MPI while the others reduce a tensor on the ring:
    // the calls cannot match, so every rank waits until it looks at the others.
    if (comm->is_master()) {
      comm->allreduce_sum(std::vector<double>{1.0, 2.0});
    } else {
      Tensor t = Tensor::full({4}, 1.0);
      comm->allreduce(t);
    }
  } catch (const CommError& e) {
    msg = e.what();
  }
  const double took = seconds_since(t0);
  INFO("rank " << comm->rank() << " after " << took << " s: " << msg);
  CHECK_THAT(msg, Catch::Contains("the ranks called different collectives: as collective #1, rank(s) 0 called "
                                  "allreduce_sum(2 value(s)) and rank(s) 1"));
  CHECK_THAT(msg, Catch::Contains("called allreduce(ring, 4 x f32)"));
  CHECK_THAT(msg, Catch::Contains("rank(s) 0: in #1 allreduce_sum(2 value(s))"));
  CHECK_THAT(msg, Catch::Contains("Callback::Ranks::all"));
  CHECK(took >= grace);
  CHECK(took < kFastSeconds);
  CHECK_THROWS_WITH(comm->barrier(), Catch::Contains("unusable"));
  world.barrier();
}

TEST_CASE("a timeout shorter than the grace names the different calls too", "[comm][mismatch][timeout]") {
  Communicator& world = communicator();
  auto comm = world.duplicate();
  comm->set_timeout(1.0);  // below the 1.5 s grace: the timeout's own query finds the mismatch
  std::string msg;
  try {
    if (comm->is_master()) {
      comm->allreduce_sum(std::vector<double>{1.0, 2.0});
    } else {
      Tensor t = Tensor::full({4}, 1.0);
      comm->allreduce(t);
    }
  } catch (const CommError& e) {
    msg = e.what();
  }
  INFO("rank " << comm->rank() << ": " << msg);
  CHECK_THAT(msg, Catch::Contains("did not complete within 1 s"));
  CHECK_THAT(msg, Catch::Contains("; the ranks called different collectives: as collective #1, rank(s) 0 called "
                                  "allreduce_sum(2 value(s)) and rank(s) 1"));
  CHECK_THAT(msg, Catch::Contains("; fix: every rank must call the same collectives in the same order"));
  CHECK_THAT(msg, !Catch::Contains("never joined"));  // every rank entered #1, each its own call
  world.barrier();
}

TEST_CASE("ranks that arrive together are never asked where they are", "[comm][mismatch]") {
  Communicator& world = communicator();
  auto comm = world.duplicate();
  REQUIRE(detail::impl_of(*comm).arrivals->enabled());
  comm->barrier();
  const int64_t before = queries_answered(*comm);
  std::vector<float> grad(1000, 1.0f);
  for (int i = 0; i < 50; ++i) {
    CHECK(comm->allreduce_sum(1.0) == static_cast<double>(comm->size()));
    comm->allreduce(grad.data(), static_cast<int64_t>(grad.size()), DType::f32, Device::cpu());
  }
  comm->barrier();
  // Each rank's own count: nobody waited past the grace, so nobody asked.
  CHECK(queries_answered(*comm) == before);
  world.barrier();
}

TEST_CASE("a rank that is late but within the timeout is no mismatch", "[comm][mismatch]") {
  Communicator& world = communicator();
  const int late = world.size() - 1;
  auto comm = world.duplicate();
  // The late rank sleeps 3 s: past the 1.5 s grace (the others ask where it is and find it
  // in no collective), well inside the 8 s timeout.
  comm->set_timeout(8);
  comm->barrier();
  const int64_t before = queries_answered(*comm);
  if (comm->rank() == late) std::this_thread::sleep_for(std::chrono::seconds(3));
  CHECK(comm->allreduce_sum(1.0) == static_cast<double>(comm->size()));
  CHECK(comm->allreduce_sum(2.0) == 2.0 * comm->size());
  // The others did ask it (and went on waiting).
  if (comm->rank() == late) CHECK(queries_answered(*comm) > before);
  world.barrier();
}

TEST_CASE("a rank that stalls is waited for until the timeout; the message says where each rank is",
          "[comm][mismatch][timeout]") {
  Communicator& world = communicator();
  const int p = world.size(), stalled = p - 1;
  auto comm = world.duplicate();
  constexpr double kTimeout = 4.0;
  comm->set_timeout(kTimeout);
  comm->barrier();  // #1, finished by every rank
  if (comm->rank() == stalled) {
    // Computing, never in a collective: no mismatch, so only the timeout ends the wait.
    std::this_thread::sleep_for(Seconds(kTimeout + 2.0));
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    std::string msg;
    try {
      const detail::CollectiveLabel label("stall_test");
      comm->allreduce_sum(1.0);  // #2
    } catch (const CommError& e) {
      msg = e.what();
    }
    const double took = seconds_since(t0);
    INFO("rank " << comm->rank() << " after " << took << " s: " << msg);
    CHECK_THAT(msg, Catch::Contains("allreduce_sum(1 value(s)) in stall_test (collective #2"));
    CHECK_THAT(msg, Catch::Contains("did not complete within 4 s"));
    CHECK_THAT(msg, Catch::Contains(fmt::format("rank(s) {} never joined it", stalled)));
    CHECK_THAT(msg, Catch::Contains(fmt::format("where each rank is: rank(s) {}: in #2 allreduce_sum(1 value(s)) in "
                                                "stall_test; rank(s) {}: in no collective (last finished: #1 barrier)",
                                                p == 2 ? "0" : "0, 1", stalled)));
    CHECK_THAT(msg, !Catch::Contains("different collectives"));
    // The timeout, not the grace, ended it; the bound adds the 2 s arrival query and slack.
    CHECK(took >= kTimeout);
    CHECK(took < kTimeout + 2.0 + 10.0);
  }
  world.barrier();
}

TEST_CASE("the broadcast root's timeout message names the ranks that did not join, not itself",
          "[comm][mismatch][timeout]") {
  Communicator& world = communicator();
  const int absent = 1;
  auto comm = world.duplicate();
  comm->set_timeout(1.0);
  // 4 MiB: more than MPI sends before the receiver has matched, so the root cannot finish
  // without rank 1 (its direct receiver in every broadcast tree).
  std::vector<float> data(1 << 20, 1.0f);
  if (comm->rank() != absent) {
    std::string msg;
    try {
      comm->broadcast(data.data(), static_cast<int64_t>(data.size()), DType::f32, Device::cpu(), 0);
    } catch (const CommError& e) {
      msg = e.what();
    }
    INFO("rank " << comm->rank() << ": " << msg);
    if (comm->is_master()) {
      CHECK_THAT(msg, Catch::Contains("broadcast(root 0, 1048576 x f32, cpu)"));
      CHECK_THAT(msg, Catch::Contains("rank(s) 1 never joined it"));
      CHECK_THAT(msg, !Catch::Contains("waiting on rank 0"));
    } else if (!msg.empty()) {
      // A rank fed through rank 1 waits too; whether it does depends on MPI's tree.
      CHECK_THAT(msg, Catch::Contains("rank(s) 1 never joined it"));
    }
  }
  world.barrier();
}

// Waits on work that MPI does not see (the Reducer's NCCL buckets, the device collectives)
// run the same checks through Waiter::poll, between their own polls of the GPU: shown here
// on CPU ranks with a wait on work that never completes, as on the NCCL path, where a
// Waiter is made for a bucket entered earlier (the constructor with the bucket's number).
namespace {
// Polls w until it throws (bounded: a CommError is expected long before); the message.
std::string poll_until_thrown(detail::Waiter& w) {
  const auto give_up = std::chrono::steady_clock::now() + Seconds(120);
  try {
    while (std::chrono::steady_clock::now() < give_up) {
      w.poll(std::chrono::steady_clock::now());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const CommError& e) {
    return e.what();
  }
  return "(poll never threw)";
}
}  // namespace

TEST_CASE("a wait outside MPI (the NCCL path) names a different collective on the other ranks",
          "[comm][mismatch][nccl_wait]") {
  Communicator& world = communicator();
  auto comm = world.duplicate();
  comm->set_timeout(600);
  detail::CommImpl& c = detail::impl_of(*comm);
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  if (comm->is_master()) {
    // A bucket launched (numbered #1), then waited for later, as NcclTransport does.
    const detail::OpDesc op{.name = "Reducer bucket allreduce(nccl)", .count = 1000, .dtype = DType::bf16};
    const int64_t seq = c.enter(op);
    REQUIRE(seq == 1);
    detail::Waiter w(c, op, seq);
    msg = poll_until_thrown(w);
  } else {
    try {
      comm->barrier();
    } catch (const CommError& e) {
      msg = e.what();
    }
  }
  const double took = seconds_since(t0);
  INFO("rank " << comm->rank() << " after " << took << " s: " << msg);
  CHECK_THAT(msg, Catch::Contains("as collective #1, rank(s) 0 called Reducer bucket allreduce(nccl)"));
  CHECK_THAT(msg, Catch::Contains(fmt::format("and rank(s) {} called barrier", world.size() == 2 ? "1" : "1, 2")));
  if (comm->is_master()) CHECK_THAT(msg, Catch::Contains("(collective #1 of this communicator) on rank 0"));
  CHECK(took < kFastSeconds);
  world.barrier();
}

TEST_CASE("a wait outside MPI (the NCCL path) names the ranks that never launched the bucket",
          "[comm][mismatch][nccl_wait][timeout]") {
  Communicator& world = communicator();
  const int p = world.size();
  auto comm = world.duplicate();
  constexpr double kTimeout = 3.0;
  comm->set_timeout(kTimeout);
  detail::CommImpl& c = detail::impl_of(*comm);
  comm->barrier();  // #1
  if (comm->is_master()) {
    // Buckets #2 and #3 launched; the wait is for #2, so the message names #2, not the
    // communicator's last number.
    const detail::OpDesc op{.name = "Reducer bucket allreduce(nccl)", .count = 64, .dtype = DType::f32};
    const int64_t first = c.enter(op);
    c.enter(op);
    const auto t0 = std::chrono::steady_clock::now();
    detail::Waiter w(c, op, first);
    const std::string msg = poll_until_thrown(w);
    const double took = seconds_since(t0);
    INFO("after " << took << " s: " << msg);
    CHECK_THAT(msg, Catch::Contains("Reducer bucket allreduce(nccl)"));
    CHECK_THAT(msg, Catch::Contains("(collective #2 of this communicator) on rank 0"));
    CHECK_THAT(msg, Catch::Contains("did not complete within 3 s"));
    CHECK_THAT(msg, Catch::Contains(fmt::format("rank(s) {} never joined it", p == 2 ? "1" : "1, 2")));
    CHECK_THAT(msg, Catch::Contains("in no collective (last finished: #1 barrier)"));
    CHECK(took >= kTimeout);
    CHECK(took < kTimeout + 2.0 + 10.0);
  } else {
    // Computing, never in a collective: only the timeout ends the master's wait.
    std::this_thread::sleep_for(Seconds(kTimeout + 2.0));
  }
  world.barrier();
}

TEST_CASE("a collective inside code that runs on some ranks only is refused at once", "[comm][mismatch]") {
  Communicator& world = communicator();
  auto comm = world.duplicate();
  const int64_t before = comm->collectives_entered();
  {
    // Every rank enters the region here, so that every rank checks the refusal.
    const std::string where = "callback 'Probe'";
    const detail::SomeRanksRegion region(where, "the master only (Ranks::master_only)");
    CHECK_THROWS_AS(comm->barrier(), InputError);
    CHECK_THROWS_WITH(comm->barrier(), Catch::Contains("barrier is a collective (every rank must call it), but it was "
                                                       "called from callback 'Probe', which runs on the master only "
                                                       "(Ranks::master_only)"));
    CHECK_THROWS_WITH(comm->allreduce_sum(1.0), Catch::Contains("Callback::Ranks::all"));
    // A labelled runtime call is refused by its own name, before it does anything.
    CHECK_THROWS_WITH(detail::CollectiveLabel("save_weights"), Catch::StartsWith("save_weights is a collective"));
    CHECK(comm->collectives_entered() == before);  // nothing was numbered
  }
  // Outside the region the communicator works (a refusal does not break it).
  CHECK(comm->allreduce_sum(1.0) == static_cast<double>(comm->size()));
  CHECK(comm->collectives_entered() == before + 1);
  world.barrier();
}
