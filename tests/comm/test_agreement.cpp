// find_disagreement, the one "do all ranks hold the same list?" check: equal lists, one
// rank differing at one entry, several groups, a rank with fewer entries; every rank must
// get the same answer, and the world communicator stays in step afterwards.
#include "comm/agreement.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace tnt;
using detail::find_disagreement;

namespace {

std::vector<std::string> base() { return {"settings: 32 KB", "w0: f32 (3, 4)", "w1: f32 (4,)", "w2: f16 (8, 8)"}; }

std::string all_but(int p, int skip) {
  std::vector<int> ranks;
  for (int q = 0; q < p; ++q) {
    if (q != skip) ranks.push_back(q);
  }
  return detail::rank_list(ranks);
}

// Every rank's describe() text is the same.
void check_same_everywhere(const std::string& text) {
  Communicator& comm = communicator();
  std::string mine = text;
  std::string root = text;
  comm.broadcast(root, 0);
  CHECK(mine == root);
}

}  // namespace

TEST_CASE("rank_list", "[comm][agreement]") {
  CHECK(detail::rank_list({}) == "");
  CHECK(detail::rank_list({3}) == "3");
  CHECK(detail::rank_list({0, 2, 5}) == "0, 2, 5");
}

TEST_CASE("agreement: equal lists agree", "[comm][agreement]") {
  Communicator& comm = communicator();
  CHECK_FALSE(find_disagreement(comm, base()).has_value());
  CHECK_FALSE(find_disagreement(comm, {}).has_value());
  const int64_t before = comm.collectives_entered();
  CHECK_FALSE(find_disagreement(comm, {"one"}).has_value());
  CHECK(comm.collectives_entered() == before + 1);  // agreeing costs one allgather
}

TEST_CASE("agreement: one rank differs at one entry", "[comm][agreement]") {
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  const int odd = p - 1;
  std::vector<std::string> mine = base();
  if (r == odd) mine[2] = "w1: f32 (5,)";
  auto d = find_disagreement(comm, mine);
  if (p == 1) {
    CHECK_FALSE(d.has_value());
    return;
  }
  REQUIRE(d.has_value());
  CHECK(d->entry == 2);
  REQUIRE(d->groups.size() == 2);
  CHECK(d->groups[0].first == "w1: f32 (4,)");
  CHECK(detail::rank_list(d->groups[0].second) == all_but(p, odd));
  CHECK(d->groups[1].first == "w1: f32 (5,)");
  CHECK(d->groups[1].second == std::vector<int>{odd});
  CHECK(d->describe() == "rank(s) " + all_but(p, odd) + ": w1: f32 (4,); rank(s) " + std::to_string(odd) + ": w1: f32 (5,)");
  check_same_everywhere(d->describe());
  CHECK(comm.allreduce_sum(1) == p);
}

TEST_CASE("agreement: groups in order of their lowest rank; the first difference wins", "[comm][agreement]") {
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  if (p < 3) return;
  // Entry 1: rank q holds version q % 2 (ranks 0, 2, ... and 1, 3, ...); entry 3 differs on
  // every rank but comes later, so it is not the one reported.
  std::vector<std::string> mine = base();
  mine[1] = "w0 version " + std::to_string(r % 2);
  mine[3] = "w2 on rank " + std::to_string(r);
  auto d = find_disagreement(comm, mine);
  REQUIRE(d.has_value());
  CHECK(d->entry == 1);
  REQUIRE(d->groups.size() == 2);
  std::vector<int> even, odd;
  for (int q = 0; q < p; ++q) (q % 2 ? odd : even).push_back(q);
  CHECK(d->groups[0] == std::pair<std::string, std::vector<int>>{"w0 version 0", even});
  CHECK(d->groups[1] == std::pair<std::string, std::vector<int>>{"w0 version 1", odd});
  check_same_everywhere(d->describe());
}

TEST_CASE("agreement: a rank with fewer entries", "[comm][agreement]") {
  Communicator& comm = communicator();
  const int p = comm.size(), r = comm.rank();
  if (p == 1) return;
  std::vector<std::string> mine = base();
  if (r == 0) mine.pop_back();  // rank 0 lacks entry 3
  auto d = find_disagreement(comm, mine);
  REQUIRE(d.has_value());
  CHECK(d->entry == 3);
  REQUIRE(d->groups.size() == 2);
  CHECK_THAT(d->groups[0].first, Catch::StartsWith("(none") && Catch::Contains("3 entries"));
  CHECK(d->groups[0].second == std::vector<int>{0});
  CHECK(d->groups[1].first == "w2: f16 (8, 8)");
  CHECK(detail::rank_list(d->groups[1].second) == all_but(p, 0));
  check_same_everywhere(d->describe());
  CHECK(comm.allreduce_sum(1) == p);
}
