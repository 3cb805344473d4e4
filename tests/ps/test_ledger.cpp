// The sample ledger (runtime/src/ps/ledger.hpp): which batches of an epoch go where once
// workers are lost. Pure: driven by hand, without MPI.
#include <catch2/catch.hpp>

#include "ps/ledger.hpp"
#include "tarantella/check.hpp"

using tnt::ps::Ledger;
using tnt::ps::Part;

namespace {

std::vector<bool> none(size_t n) { return std::vector<bool>(n, false); }

}  // namespace

TEST_CASE("ledger: no loss, the epoch ends when every worker has asked") {
  Ledger l(3);
  l.learn_steps(10);
  l.ask(0, false);
  CHECK(l.serve(none(3)).empty());  // workers 1 and 2 still train their parts
  l.ask(2, false);
  CHECK(l.serve(none(3)).empty());
  l.ask(1, false);
  const auto over = l.serve(none(3));
  REQUIRE(over.size() == 3);
  for (const auto& a : over) CHECK_FALSE(a.part);
  CHECK(l.epoch() == 1);
  CHECK_FALSE(l.waiting(0));
}

TEST_CASE("ledger: a lost worker's batches no push covered, shared by the others, each once") {
  Ledger l(3);
  l.learn_steps(10);
  for (int i = 0; i < 4; ++i) l.count_push(1, 0);  // batches 0..3 of worker 1's part
  l.count_push(1, 1);                               // a push of another epoch does not count
  CHECK(l.lose(1) == 6);
  std::vector<bool> gone{false, true, false};
  l.ask(0, false);
  auto a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK(a[0].worker == 0);
  CHECK(a[0].part == Part{1, 4, 7});  // ceil(6 / 2 workers left)
  l.ask(2, false);
  a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK(a[0].part == Part{1, 7, 9});  // ceil(3 / 2)
  l.ask(2, false);
  a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK(a[0].part == Part{1, 9, 10});
  // Worker 0 is lost too, after its own part (10 pushes) and one batch of its grant: the
  // rest of the grant (worker 1's batches 5 and 6) goes to worker 2.
  for (int i = 0; i < 11; ++i) l.count_push(0, 0);
  CHECK(l.lose(0) == 2);
  gone = {true, true, false};
  l.ask(2, false);
  a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK(a[0].part == Part{1, 5, 7});
  l.ask(2, false);
  a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK_FALSE(a[0].part);
  // The next epoch: both lost parts whole, in the order they were lost, to the one left.
  l.ask(2, false);
  a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK(a[0].part == Part{1, 0, 10});
  l.ask(2, false);
  a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK(a[0].part == Part{0, 0, 10});
}

TEST_CASE("ledger: lost before any worker said the size of its part; a stop cuts the epoch") {
  Ledger l(2);
  l.count_push(0, 0);
  l.count_push(0, 0);
  CHECK(l.lose(0) == 0);  // not known yet
  l.learn_steps(5);
  const std::vector<bool> gone{true, false};
  l.ask(1, false);
  auto a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK(a[0].part == Part{0, 2, 5});
  l.ask(1, true);  // it stops (max_steps): nothing more is handed out
  a = l.serve(gone);
  REQUIRE(a.size() == 1);
  CHECK_FALSE(a[0].part);
  CHECK_THROWS_AS(l.learn_steps(6), tnt::InputError);
}
