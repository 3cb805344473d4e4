// comm/rank_positions.hpp without MPI: the arrival channel's wire form, the mismatch
// judgement (which must never fire on ranks that are merely at different numbers), and the
// "where each rank is" text; and collective_scope's readable callback names.
#include "comm/collective_scope.hpp"
#include "comm/rank_positions.hpp"

#include <catch2/catch.hpp>

using namespace tnt::detail;

namespace {

// A rank that answered: entered, done, and records (seq, key) with text "op<key>".
RankPosition at(int64_t entered, int64_t done, std::vector<std::pair<int64_t, std::string>> ops) {
  RankPosition p;
  p.answered = true;
  p.entered = entered;
  p.done = done;
  for (auto& [seq, key] : ops) p.recent.push_back({seq, key, "op" + key});
  return p;
}

std::string plain(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

TEST_CASE("a position survives the wire form; junk does not decode") {
  RankPosition p = at(7, 6, {{6, "a|1"}, {7, "b|2"}});
  p.recent[1].text = "broadcast(root 0, 3 x i64, cpu) in save_weights";
  RankPosition back;
  REQUIRE(decode(encode(p), back));
  CHECK(back.answered);
  CHECK(back.entered == 7);
  CHECK(back.done == 6);
  REQUIRE(back.recent.size() == 2);
  CHECK(back.recent[1].seq == 7);
  CHECK(back.recent[1].key == "b|2");
  CHECK(back.recent[1].text == "broadcast(root 0, 3 x i64, cpu) in save_weights");
  // Tabs and newlines inside a field cannot break the lines.
  p.recent[0].text = "a\tb\nc";
  REQUIRE(decode(encode(p), back));
  CHECK(back.recent[0].text == "a b c");

  RankPosition untouched = at(1, 1, {});
  // The same answer cut short, at every length before its end mark ".", never decodes.
  const std::string whole = encode(p);
  for (size_t n = 0; n + 2 < whole.size(); ++n) {
    INFO(whole.substr(0, n));
    CHECK_FALSE(decode(whole.substr(0, n), back));
  }
  for (const char* junk : {"", "5\n.\n", "x y\n.\n", "-1 0 0\n.\n", "3 2\n.\n", "3 2 2\n.\n", "3 2 1 1\n.\n",
                           "3 2 0\nnot a record\n.\n", "3 2 0\n0\tk\tt\n.\n", "3 2 0\n.\nafter the end\n"}) {
    INFO(junk);
    CHECK_FALSE(decode(junk, untouched));
  }
  CHECK(untouched.entered == 1);  // a failed decode leaves the target alone
}

TEST_CASE("a rank whose program is done says so, and is named by the collectives it never entered") {
  RankPosition done = at(4, 4, {{4, "x"}});
  done.finished = true;
  RankPosition back;
  REQUIRE(decode(encode(done), back));
  CHECK(back.finished);
  CHECK(back.str() == "finished its program (in tnt::finalize; last collective: #4 opx)");
  REQUIRE(decode(encode(at(4, 4, {})), back));
  CHECK_FALSE(back.finished);
  // Rank 0 waits in #5, which rank 1 never entered: it never will. In #4 (which rank 1
  // finished) nobody is missing; a rank that did not answer is not judged.
  const std::vector<RankPosition> ranks{at(5, 4, {{4, "x"}, {5, "y"}}), done, RankPosition{}};
  CHECK(finished_before(ranks, 5) == std::vector<int>{1});
  CHECK(finished_before(ranks, 4).empty());
  RankPosition never = at(0, 0, {});
  never.finished = true;
  CHECK(never.str() == "finished its program (in tnt::finalize), no collective called");
  CHECK(finished_before({never}, 1) == std::vector<int>{0});
}

TEST_CASE("ranks that called the same collectives are no mismatch, wherever they are now") {
  // All in #5.
  CHECK_FALSE(find_mismatch({at(5, 4, {{4, "x"}, {5, "y"}}), at(5, 4, {{4, "x"}, {5, "y"}})}));
  // Rank 1 still computing after #4 (late), rank 0 waits in #5.
  CHECK_FALSE(find_mismatch({at(5, 4, {{4, "x"}, {5, "y"}}), at(4, 4, {{4, "x"}})}));
  // A broadcast root that finished #5 and waits in #6 while rank 1 still receives #5.
  CHECK_FALSE(find_mismatch({at(6, 5, {{5, "bcast"}, {6, "sum"}}), at(5, 4, {{4, "x"}, {5, "bcast"}})}));
  // A rank that did not answer, and one with nothing in common with the others.
  RankPosition silent;
  CHECK_FALSE(find_mismatch({at(5, 4, {{5, "y"}}), silent, at(30, 30, {{30, "z"}})}));
  // Nothing entered yet.
  CHECK_FALSE(find_mismatch({at(0, 0, {}), at(0, 0, {})}));
}

TEST_CASE("ranks that called different collectives under one number are a mismatch") {
  SECTION("different calls in the same number") {
    auto m = find_mismatch({at(5, 4, {{5, "sum"}}), at(5, 4, {{5, "ring"}}), at(5, 4, {{5, "ring"}})});
    REQUIRE(m);
    CHECK(m->seq == 5);
    CHECK(describe_mismatch(*m, plain) == "as collective #5, rank(s) 0 called opsum and rank(s) 1,2 called opring");
  }
  SECTION("a rank that went on past a collective the others did not call") {
    // Rank 0 called an extra broadcast as #5 (it finished alone) and waits in #6; rank 1
    // waits in #5 for its regular sum: the earliest disagreement is #5.
    auto m = find_mismatch({at(6, 5, {{4, "x"}, {5, "bcast"}, {6, "sum"}}), at(5, 4, {{4, "x"}, {5, "sum"}})});
    REQUIRE(m);
    CHECK(m->seq == 5);
    REQUIRE(m->groups.size() == 2);
    CHECK(m->groups[0] == std::make_pair(std::string("opbcast"), std::vector<int>{0}));
    CHECK(m->groups[1] == std::make_pair(std::string("opsum"), std::vector<int>{1}));
  }
  SECTION("three different calls, listed by lowest rank") {
    auto m = find_mismatch({at(2, 1, {{2, "c"}}), at(2, 1, {{2, "a"}}), at(2, 1, {{2, "b"}}), at(2, 1, {{2, "a"}})});
    REQUIRE(m);
    CHECK(describe_mismatch(*m, plain) == "as collective #2, rank(s) 0 called opc, rank(s) 1,3 called opa and "
                                          "rank(s) 2 called opb");
  }
}

TEST_CASE("where each rank is, grouped") {
  RankPosition silent;
  std::vector<RankPosition> ranks = {at(5, 4, {{4, "x"}, {5, "y"}}), at(4, 4, {{4, "x"}}), at(5, 4, {{4, "x"}, {5, "y"}}),
                                     silent, at(0, 0, {})};
  CHECK(describe_positions(ranks, plain) ==
        "rank(s) 0,2: in #5 opy; rank(s) 1: in no collective (last finished: #4 opx); rank(s) 3: did not answer; "
        "rank(s) 4: in no collective (none entered yet)");
  // A number no longer remembered is shown bare.
  CHECK(at(9, 8, {}).str() == "in #9");
}

TEST_CASE("callback names as a reader knows them") {
  CHECK(readable_type_name(typeid(RankPosition).name()) == "detail::RankPosition");
  CHECK(readable_type_name("not a mangled name") == "not a mangled name");
}
