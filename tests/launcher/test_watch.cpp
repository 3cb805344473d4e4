// The launcher's watch over the ranks (rank_watch.hpp), driven by hand-made reports and a
// hand-moved clock: which verdict, when, and naming whom.
#include "env_names.hpp"
#include "error.hpp"
#include "cli.hpp"
#include "rank_watch.hpp"

#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <csignal>

using namespace tnt::launcher;
using namespace std::chrono_literals;

namespace {

std::vector<RankSlot> three_ranks() { return {{0, "a", 0}, {1, "a", 1}, {2, "b", 0}}; }

RankReport report(int rank, RankReport::Kind kind, int code = 0, bool signaled = false) {
  const auto slots = three_ranks();
  return RankReport{rank, slots[static_cast<size_t>(rank)].local_rank, slots[static_cast<size_t>(rank)].host,
                    signaled, code, kind};
}

WatchLimits limits(double start_s, double exit_s) { return {Seconds(start_s), Seconds(exit_s)}; }

const Clock::time_point t0 = Clock::now();

}  // namespace

TEST_CASE("watch: every rank starts in time, then the job ends normally", "[watch]") {
  RankWatch w(three_ranks(), limits(10, 5), t0);
  CHECK(w.next_check() == t0 + 10s);
  for (int r = 0; r < 3; ++r) w.record(report(r, RankReport::Kind::started), t0 + 1s);
  CHECK_FALSE(w.check(t0 + 9s));
  CHECK_FALSE(w.check(t0 + 10s));  // the start check passes, once
  CHECK(w.next_check() == Clock::time_point::max());
  for (int r = 0; r < 3; ++r) w.record(report(r, RankReport::Kind::ended), t0 + 60s);
  CHECK(w.failures().empty());
  CHECK(w.next_check() == t0 + 65s);  // mpirun should be gone by then
}

TEST_CASE("watch: ranks that never start are named at the start timeout", "[watch]") {
  RankWatch w(three_ranks(), limits(2, 0), t0);
  w.record(report(0, RankReport::Kind::started), t0 + 100ms);
  CHECK_FALSE(w.check(t0 + 1999ms));
  auto v = w.check(t0 + 2s);
  REQUIRE(v);
  CHECK(v->reason == RankWatch::Reason::start);
  CHECK(v->message == "2 of 3 ranks did not start within 2 s (--start-timeout, TNT_START_TIMEOUT): "
                      "rank 1 (host a, local rank 1), rank 2 (host b, local rank 0)");
  CHECK_FALSE(w.check(t0 + 3s));  // one verdict
  CHECK(w.next_check() == Clock::time_point::max());
}

TEST_CASE("watch: a rank stopped at the start timeout counts as not running", "[watch]") {
  RankWatch w(three_ranks(), limits(1.5, 0), t0);
  for (int r = 0; r < 3; ++r) w.record(report(r, RankReport::Kind::started), t0);
  w.record(report(1, RankReport::Kind::stopped, SIGSTOP), t0 + 10ms);
  w.record(report(2, RankReport::Kind::stopped, SIGTSTP), t0 + 10ms);
  w.record(report(2, RankReport::Kind::continued), t0 + 20ms);  // resumed: fine again
  auto v = w.check(t0 + 1500ms);
  REQUIRE(v);
  CHECK(v->reason == RankWatch::Reason::start);
  CHECK(v->message == "1 of 3 ranks was stopped 1.5 s (--start-timeout, TNT_START_TIMEOUT) after the launch: "
                      "rank 1 (host a, local rank 1, stopped by SIGSTOP)");

  // Both at once: one that never started and one that is stopped.
  RankWatch both(three_ranks(), limits(1, 0), t0);
  both.record(report(0, RankReport::Kind::started), t0);
  both.record(report(0, RankReport::Kind::stopped, SIGSTOP), t0);
  both.record(report(2, RankReport::Kind::started), t0);
  auto b = both.check(t0 + 1s);
  REQUIRE(b);
  CHECK_THAT(b->message, Catch::StartsWith("1 of 3 ranks did not start within 1 s") &&
                             Catch::Contains(": rank 1 (host a, local rank 1); 1 of 3 ranks was stopped") &&
                             Catch::EndsWith("rank 0 (host a, local rank 0, stopped by SIGSTOP)"));
}

TEST_CASE("watch: a rank stopped after the start check while others wait in MPI_Init", "[watch][join]") {
  using K = RankReport::Kind;
  RankWatch w(three_ranks(), limits(2, 0), t0);
  for (int r = 0; r < 3; ++r) w.record(report(r, K::started), t0 + 100ms);
  w.record(report(0, K::joining), t0 + 200ms);
  w.record(report(2, K::joining), t0 + 200ms);
  CHECK_FALSE(w.check(t0 + 2s));  // the start check passes: nobody is stopped yet
  w.record(report(1, K::stopped, SIGSTOP), t0 + 2500ms);  // on its way to MPI_Init
  CHECK(w.next_check() == t0 + 4500ms);
  CHECK_FALSE(w.check(t0 + 4499ms));
  auto v = w.check(t0 + 4500ms);
  REQUIRE(v);
  CHECK(v->reason == RankWatch::Reason::start);
  CHECK(v->message == "1 of 3 ranks was stopped for 2 s (--start-timeout, TNT_START_TIMEOUT) while rank 0 (host a, "
                      "local rank 0), rank 2 (host b, local rank 0) wait for it in MPI_Init: rank 1 (host a, local "
                      "rank 1, stopped by SIGSTOP)");
  CHECK_FALSE(w.check(t0 + 5s));  // one verdict

  // Continued in time: nothing to say.
  RankWatch c(three_ranks(), limits(2, 0), t0);
  for (int r = 0; r < 3; ++r) c.record(report(r, K::started), t0);
  c.record(report(0, K::joining), t0);
  CHECK_FALSE(c.check(t0 + 2s));
  c.record(report(1, K::stopped, SIGTSTP), t0 + 3s);
  c.record(report(1, K::continued), t0 + 4s);
  CHECK(c.next_check() == Clock::time_point::max());
  CHECK_FALSE(c.check(t0 + 10s));

  // Once MPI_Init returned (a rank joined), a stop is the runtime's collective timeout's
  // business; and without word of ranks in MPI_Init (a program without the runtime), a
  // stopped rank may be a user's doing: neither ends the job.
  for (bool joined : {true, false}) {
    RankWatch j(three_ranks(), limits(2, 0), t0);
    for (int r = 0; r < 3; ++r) j.record(report(r, K::started), t0);
    if (joined) j.record(report(0, K::joined), t0 + 1s);
    CHECK_FALSE(j.check(t0 + 2s));
    j.record(report(1, K::stopped, SIGSTOP), t0 + 3s);
    CHECK(j.next_check() == Clock::time_point::max());
    CHECK_FALSE(j.check(t0 + 60s));
  }

  // Time the launcher itself was stopped does not count against a stopped rank.
  RankWatch p(three_ranks(), limits(2, 0), t0);
  for (int r = 0; r < 3; ++r) p.record(report(r, K::started), t0);
  p.record(report(0, K::joining), t0);
  CHECK_FALSE(p.check(t0 + 2s));
  p.record(report(1, K::stopped, SIGSTOP), t0 + 3s);
  p.paused(10s);
  CHECK(p.next_check() == t0 + 15s);
}

TEST_CASE("watch: a rank that exits 0 while others still run", "[watch]") {
  RankWatch w(three_ranks(), limits(10, 3), t0);
  for (int r = 0; r < 3; ++r) w.record(report(r, RankReport::Kind::started), t0);
  w.record(report(1, RankReport::Kind::ended), t0 + 1s);  // before MPI_Init, say
  CHECK(w.next_check() == t0 + 4s);
  CHECK_FALSE(w.check(t0 + 3999ms));
  auto v = w.check(t0 + 4s);
  REQUIRE(v);
  CHECK(v->reason == RankWatch::Reason::exit);
  CHECK(v->message == "rank 1 (host a, local rank 1) exited 0, but 3 s later (--exit-timeout, TNT_EXIT_TIMEOUT) "
                      "2 of 3 ranks still had not ended: rank 0 (host a, local rank 0), rank 2 (host b, local rank 0)");
  CHECK(w.failures().empty());
}

TEST_CASE("watch: mpirun that does not end the job after a failure", "[watch]") {
  RankWatch w(three_ranks(), limits(0, 3), t0);
  w.record(report(2, RankReport::Kind::ended), t0 + 1s);
  w.record(report(0, RankReport::Kind::ended, SIGSEGV, true), t0 + 2s);  // the timer restarts here
  w.record(report(1, RankReport::Kind::ended, 3), t0 + 2500ms);
  REQUIRE(w.failures().size() == 2);
  CHECK(w.failures()[0].rank == 0);
  CHECK(w.next_check() == t0 + 5s);
  CHECK_FALSE(w.check(t0 + 4s));
  auto v = w.check(t0 + 5s);
  REQUIRE(v);
  CHECK(v->reason == RankWatch::Reason::teardown);
  CHECK(v->message == "rank 0 (host a, local rank 0) failed first (signal 11 (SIGSEGV)), but 3 s later "
                      "(--exit-timeout, TNT_EXIT_TIMEOUT) mpirun still had not ended the job");

  // Every rank ended 0 and mpirun lingers.
  RankWatch all(three_ranks(), limits(0, 1), t0);
  for (int r : {2, 0, 1}) all.record(report(r, RankReport::Kind::ended), t0);
  auto a = all.check(t0 + 1s);
  REQUIRE(a);
  CHECK(a->reason == RankWatch::Reason::teardown);
  CHECK_THAT(a->message, Catch::StartsWith("every rank's program has ended (the first: rank 2 (host b"));
}

TEST_CASE("watch: after a failure, ranks not yet started are not the news", "[watch]") {
  RankWatch w(three_ranks(), limits(2, 30), t0);
  w.record(report(0, RankReport::Kind::started), t0);
  w.record(report(0, RankReport::Kind::ended, 1), t0 + 1s);
  CHECK_FALSE(w.check(t0 + 2s));  // mpirun is stopping the job; the exit timeout bounds that
  // ... cut to 20 s after a failure (mpirun ends a job within seconds of one).
  CHECK(w.next_check() == t0 + 21s);
  auto v = w.check(t0 + 21s);
  REQUIRE(v);
  CHECK(v->message == "rank 0 (host a, local rank 0) failed first (exit code 1), but 20 s later (mpirun ends a job "
                      "within seconds of a failure) mpirun still had not ended the job");
}

TEST_CASE("watch: no limits, reports from outside the plan, and long lists", "[watch]") {
  RankWatch none(three_ranks(), limits(0, 0), t0);
  none.record(report(1, RankReport::Kind::ended), t0);
  CHECK(none.next_check() == Clock::time_point::max());
  CHECK_FALSE(none.check(t0 + 1000h));

  RankWatch w(three_ranks(), limits(1, 0), t0);
  w.record(RankReport{7, 0, "z", false, 0, RankReport::Kind::started}, t0);
  w.record(RankReport{-1, 0, "z", false, 0, RankReport::Kind::ended}, t0);
  CHECK(w.failures().empty());
  auto v = w.check(t0 + 1s);
  REQUIRE(v);
  CHECK_THAT(v->message, Catch::StartsWith("3 of 3 ranks did not start"));

  std::vector<RankSlot> many;
  for (int r = 0; r < 100; ++r) many.push_back({r, fmt::format("h{}", r / 4), r % 4});
  RankWatch big(many, limits(1, 0), t0);
  auto b = big.check(t0 + 1s);
  REQUIRE(b);
  CHECK_THAT(b->message, Catch::Contains("100 of 100 ranks") &&
                             Catch::Contains("rank 7 (host h1, local rank 3) and 92 more") &&
                             !Catch::Contains("rank 8 "));
}

TEST_CASE("watch: limits from options, the environment, and the defaults", "[watch]") {
  Options o;
  auto l = watch_limits(o, {});
  CHECK(l.start.count() == default_start_timeout_s);
  CHECK(l.exit.count() == default_exit_timeout_s);
  l = watch_limits(o, {{env::start_timeout, "2.5"}, {env::exit_timeout, "0"}});
  CHECK(l.start.count() == 2.5);
  CHECK(l.exit.count() == 0);
  CHECK(l.any());
  o.start_timeout_s = 7;
  o.exit_timeout_s = 0;
  l = watch_limits(o, {{env::start_timeout, "2.5"}, {env::exit_timeout, "9"}});  // the option wins
  CHECK(l.start.count() == 7);
  CHECK(l.exit.count() == 0);
  o.start_timeout_s = 0;
  CHECK_FALSE(watch_limits(o, {}).any());
  for (const char* bad : {"", "-1", "soon", "1e9", "nan", "2s"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(watch_limits(Options{}, {{env::start_timeout, bad}}),
                      fmt::format("TNT_START_TIMEOUT='{}' is not a number of seconds from 0 (no limit) to a year (31622400)", bad));
  }
  CHECK(format_seconds(Seconds(120)) == "120");
  CHECK(format_seconds(Seconds(0.25)) == "0.25");
}

TEST_CASE("watch: a rank that ends without joining while others wait in MPI_Init", "[watch][join]") {
  using K = RankReport::Kind;
  SECTION("named at once, whichever comes first") {
    for (bool end_first : {true, false}) {
      INFO("the rank ends " << (end_first ? "before" : "after") << " the other enters MPI_Init");
      RankWatch w(three_ranks(), limits(100, 300), t0);
      for (int r = 0; r < 3; ++r) w.record(report(r, K::started), t0);
      if (end_first) {
        w.record(report(1, K::ended), t0 + 1s);
        CHECK_FALSE(w.check(t0 + 1s));  // nobody waits for it yet
        w.record(report(0, K::joining), t0 + 2s);
      } else {
        w.record(report(0, K::joining), t0 + 1s);
        w.record(report(1, K::ended), t0 + 2s);
      }
      CHECK(w.next_check() == t0 + 2s);
      auto v = w.check(t0 + 2s);
      REQUIRE(v);
      CHECK(v->reason == RankWatch::Reason::left);
      CHECK(v->message == "rank 1 (host a, local rank 1) exited 0 without joining the job (its program ended before "
                          "tnt::init, or never called it), while rank 0 (host a, local rank 0) waits for it in "
                          "MPI_Init: the job cannot finish");
    }
  }
  SECTION("not when some rank got through MPI_Init: every rank entered it, whatever was heard") {
    RankWatch w(three_ranks(), limits(100, 300), t0);
    for (int r = 0; r < 3; ++r) w.record(report(r, K::started), t0);
    w.record(report(0, K::joining), t0);
    w.record(report(2, K::joined), t0);
    w.record(report(1, K::ended), t0 + 1s);  // its word was lost
    CHECK_FALSE(w.check(t0 + 1s));
    CHECK_FALSE(w.check(t0 + 300s));
    auto v = w.check(t0 + 301s);  // left to the exit timeout, as before
    REQUIRE(v);
    CHECK(v->reason == RankWatch::Reason::exit);
  }
  SECTION("not for a failure, which mpirun acts on, nor for a rank that entered") {
    RankWatch w(three_ranks(), limits(100, 300), t0);
    w.record(report(0, K::joining), t0);
    w.record(report(1, K::ended, 3), t0 + 1s);
    w.record(report(2, K::joining), t0 + 1s);
    w.record(report(2, K::ended), t0 + 1s);
    CHECK_FALSE(w.check(t0 + 2s));
  }
  SECTION("a rank that joins after the rule held in between") {
    RankWatch w(three_ranks(), limits(100, 300), t0);
    w.record(report(0, K::joining), t0);
    w.record(report(1, K::ended), t0 + 1s);
    w.record(report(2, K::joined), t0 + 1s);  // before the check: MPI_Init returned there after all
    CHECK_FALSE(w.check(t0 + 1s));
  }
}

TEST_CASE("watch: time the launcher was stopped does not count", "[watch]") {
  RankWatch w(three_ranks(), limits(10, 3), t0);
  w.record(report(0, RankReport::Kind::started), t0 + 1s);
  w.paused(20s);  // stopped at t0 + 5 s, continued at t0 + 25 s
  CHECK(w.next_check() == t0 + 30s);
  CHECK_FALSE(w.check(t0 + 29s));
  auto v = w.check(t0 + 30s);
  REQUIRE(v);
  CHECK(v->reason == RankWatch::Reason::start);
  // The exit timer moves on too.
  RankWatch e(three_ranks(), limits(0, 3), t0);
  e.record(report(1, RankReport::Kind::ended), t0 + 1s);
  e.paused(10s);
  CHECK_FALSE(e.check(t0 + 13s));
  CHECK(e.check(t0 + 14s));
}

TEST_CASE("watch: a parameter-server worker killed is survived; a server's failure starts the timer", "[watch]") {
  RankWatch w(three_ranks(), limits(0, 3), t0);
  w.tolerate({1, 2});  // rank 0 serves
  w.record(report(2, RankReport::Kind::ended, SIGKILL, true), t0 + 1s);
  CHECK(w.next_check() == Clock::time_point::max());  // the others go on without it
  CHECK_FALSE(w.check(t0 + 100s));
  w.record(report(0, RankReport::Kind::ended, SIGKILL, true), t0 + 101s);
  CHECK(w.next_check() == t0 + 104s);
  auto v = w.check(t0 + 104s);
  REQUIRE(v);
  CHECK(v->reason == RankWatch::Reason::teardown);
}

TEST_CASE("watch: ranks waiting in MPI_Init for one that has not entered it are named, with the wait", "[watch]") {
  RankWatch w(three_ranks(), limits(10, 5), t0);
  for (int r = 0; r < 3; ++r) w.record(report(r, RankReport::Kind::started), t0 + 1s);
  CHECK_FALSE(w.init_wait(t0 + 2s));  // nobody waits yet
  w.record(report(0, RankReport::Kind::joining), t0 + 2s);
  w.record(report(2, RankReport::Kind::joining), t0 + 5s);
  const auto wait = w.init_wait(t0 + 62s);
  REQUIRE(wait);
  CHECK(wait->since == t0 + 2s);
  CHECK(wait->message == "rank 0 (host a, local rank 0), rank 2 (host b, local rank 0) have waited 60 s in MPI_Init "
                         "(tnt::init) for rank 1 (host a, local rank 1), which has not reached it: a program that "
                         "works long before tnt::init, or one stuck before it");
  CHECK_FALSE(w.check(t0 + 62s));  // no limit applies to it
  w.record(report(1, RankReport::Kind::joined), t0 + 70s);
  CHECK_FALSE(w.init_wait(t0 + 71s));  // through MPI_Init: nothing waits any more
}

TEST_CASE("watch: every rank in MPI_Init and none through it is said, with the time since the last came", "[watch]") {
  // An Open MPI daemon stopped at start-up: every rank entered MPI_Init, none returns.
  RankWatch w(three_ranks(), limits(10, 5), t0);
  for (int r = 0; r < 3; ++r) w.record(report(r, RankReport::Kind::started), t0 + 1s);
  w.record(report(0, RankReport::Kind::joining), t0 + 2s);
  w.record(report(1, RankReport::Kind::joining), t0 + 3s);
  CHECK(w.init_wait(t0 + 4s)->message.find("for rank 2 (host b, local rank 0), which has not reached it") !=
        std::string::npos);
  w.record(report(2, RankReport::Kind::joining), t0 + 4s);
  const auto wait = w.init_wait(t0 + 64s);
  REQUIRE(wait);
  CHECK(wait->since == t0 + 4s);
  CHECK(wait->message == "all 3 ranks have been in MPI_Init (tnt::init) for 60 s and none has got through it: an "
                         "Open MPI daemon or a host that does not answer (rank 0 (host a, local rank 0), rank 1 "
                         "(host a, local rank 1), rank 2 (host b, local rank 0))");
  CHECK_FALSE(w.check(t0 + 64s));  // no limit applies to it
  w.record(report(1, RankReport::Kind::joined), t0 + 65s);
  CHECK_FALSE(w.init_wait(t0 + 66s));
}

TEST_CASE("watch: ranks waiting in MPI_Finalize for one that has not reached it are named, with the wait", "[watch]") {
  RankWatch w(three_ranks(), limits(10, 5), t0);
  for (int r = 0; r < 3; ++r) {
    w.record(report(r, RankReport::Kind::started), t0 + 1s);
    w.record(report(r, RankReport::Kind::joined), t0 + 2s);
  }
  CHECK_FALSE(w.finalize_wait(t0 + 30s));  // all train
  CHECK_FALSE(w.check(t0 + 30s));          // the start check passed, all running
  w.record(report(1, RankReport::Kind::finalizing), t0 + 40s);
  w.record(report(2, RankReport::Kind::finalizing), t0 + 41s);
  w.record(report(0, RankReport::Kind::stopped, SIGSTOP), t0 + 39s);
  const auto wait = w.finalize_wait(t0 + 100s);
  REQUIRE(wait);
  CHECK(wait->since == t0 + 40s);
  CHECK(wait->message == "rank 1 (host a, local rank 1), rank 2 (host b, local rank 0) have waited 60 s in "
                         "MPI_Finalize (tnt::finalize, the end of the program) for rank 0 (host a, local rank 0, "
                         "stopped by SIGSTOP), which has not reached it: still working (writing files, say) or stuck "
                         "there");
  CHECK_FALSE(w.check(t0 + 100s));  // no limit applies to it
  const auto stopped = w.stopped_ranks(t0 + 100s);
  REQUIRE(stopped);
  CHECK(*stopped == "rank 0 (host a, local rank 0, stopped by SIGSTOP) is stopped (61 s the longest): the others "
                    "wait for it");
  w.record(report(0, RankReport::Kind::continued), t0 + 101s);
  CHECK_FALSE(w.stopped_ranks(t0 + 102s));
  w.record(report(0, RankReport::Kind::finalizing), t0 + 103s);
  CHECK_FALSE(w.finalize_wait(t0 + 104s));  // every rank at the end
}

TEST_CASE("watch: a parameter-server job's ranks may end apart: no finalize wait is said", "[watch]") {
  RankWatch w(three_ranks(), limits(10, 5), t0);
  w.tolerate({1, 2});
  for (int r = 0; r < 3; ++r) w.record(report(r, RankReport::Kind::started), t0 + 1s);
  w.record(report(1, RankReport::Kind::finalizing), t0 + 40s);
  CHECK_FALSE(w.finalize_wait(t0 + 200s));
}
