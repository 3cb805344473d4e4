// tnt::rank_cores: a rank's share of its node's cores, from every local rank's affinity
// mask (core/cpu_share.hpp), for programs that size their own threads by it.
#include "core/cpu_share.hpp"
#include "tarantella/runtime.hpp"

#include <catch2/catch.hpp>

#include <sched.h>

#include <cstdlib>

#include <vector>

using tnt::detail::cpu_share;

TEST_CASE("a rank's share of the cores its mask holds", "[core]") {
  using Masks = std::vector<std::vector<uint64_t>>;
  // Pinned to disjoint blocks: each rank has its own.
  CHECK(cpu_share(Masks{{0x0f}, {0xf0}}, 0) == 4);
  CHECK(cpu_share(Masks{{0x0f}, {0xf0}}, 1) == 4);
  // Unpinned: 4 ranks on 16 cores share them all.
  const Masks all(4, std::vector<uint64_t>{0xffff});
  for (size_t r = 0; r < 4; ++r) CHECK(cpu_share(all, r) == 4);
  // Two ranks on a socket of 8, one alone on the other: 4, 4 and 8.
  const Masks socket{{0x00ff}, {0x00ff}, {0xff00}};
  CHECK(cpu_share(socket, 0) == 4);
  CHECK(cpu_share(socket, 2) == 8);
  // Overlapping masks: CPUs 0-3 shared by two ranks, 4-5 rank 0's alone: 2 + 2 = 4.
  CHECK(cpu_share(Masks{{0x3f}, {0x0f}}, 0) == 4);
  CHECK(cpu_share(Masks{{0x3f}, {0x0f}}, 1) == 2);
  // CPUs above 63, in the second word; and never less than 1 core.
  CHECK(cpu_share(Masks{{0, 0x3}, {0, 0x3}}, 0) == 1);
  CHECK(cpu_share(Masks{{0x1}, {0x1}, {0x1}}, 2) == 1);
  CHECK(cpu_share(Masks{{0x0}}, 0) == 1);
}

TEST_CASE("rank_cores on this node's ranks", "[core]") {
  // The test's ranks are not pinned: every one has the process's mask, so each gets its
  // share of those cores.
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  const int cores = CPU_COUNT(&set);
  const int want = cores / tnt::local_size() > 0 ? cores / tnt::local_size() : 1;
  CHECK(tnt::rank_cores() == want);
  // The compute threads default to that share (TNT_NUM_THREADS unset in the tests), so that
  // unpinned ranks do not take turns on the same cores.
  if (std::getenv("TNT_NUM_THREADS") == nullptr) CHECK(tnt::num_threads() == want);
}
