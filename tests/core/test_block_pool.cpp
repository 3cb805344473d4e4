// The caching allocator's bookkeeping (backend/block_pool.hpp), without a GPU: segments come
// from a fake source that hands out address ranges it never touches, so requests of GiBs
// cost nothing, and that can be told to run out of memory.
#include "backend/block_pool.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

using tnt::backend::BlockPool;
using tnt::backend::BlockPoolStats;

namespace {

constexpr size_t MiB = size_t{1} << 20;

// Hands out [next, next + bytes) from a made-up address space, with a gap between segments
// so that a block running past its segment would overlap nothing real and be caught by the
// range checks below instead.
struct FakeSource {
  uintptr_t next = uintptr_t{1} << 40;
  size_t capacity = SIZE_MAX;  // bytes the "device" holds
  size_t held = 0;
  std::map<uintptr_t, size_t> segments;  // start -> bytes
  int allocs = 0, frees = 0, refusals = 0;

  BlockPool pool() {
    return BlockPool(
        [this](size_t bytes) -> void* {
          if (bytes > capacity - held) {
            ++refusals;
            return nullptr;
          }
          const uintptr_t p = next;
          next += bytes + 4096 * 1024;
          segments[p] = bytes;
          held += bytes;
          ++allocs;
          return reinterpret_cast<void*>(p);
        },
        [this](void* ptr, size_t bytes) {
          auto it = segments.find(reinterpret_cast<uintptr_t>(ptr));
          REQUIRE(it != segments.end());
          REQUIRE(it->second == bytes);
          held -= bytes;
          segments.erase(it);
          ++frees;
        });
  }

  // Whether [p, p + bytes) lies inside one segment.
  bool inside(uintptr_t p, size_t bytes) const {
    auto it = segments.upper_bound(p);
    if (it == segments.begin()) return false;
    --it;
    return p >= it->first && p + bytes <= it->first + it->second;
  }
};

uintptr_t addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

// What memory.cpp did before the block pool: quarter-step size classes between powers of
// two (at least 512 bytes), a freed block reusable by its own class only. Counts what it
// would hold from the driver.
struct SizeClassModel {
  std::map<size_t, int> free_blocks;
  size_t reserved = 0;
  static size_t block(size_t bytes) {
    if (bytes <= 512) return 512;
    size_t step = std::max<size_t>(512, std::bit_floor(bytes) / 4);
    return (bytes + step - 1) / step * step;
  }
  void allocate(size_t bytes) {
    int& n = free_blocks[block(bytes)];
    if (n > 0) {
      --n;
    } else {
      reserved += block(bytes);
    }
  }
  void release(size_t bytes) { ++free_blocks[block(bytes)]; }
};

// stats that must hold whatever happened
void check_consistent(const BlockPoolStats& s, const FakeSource& src) {
  CHECK(s.in_use + s.cached == s.reserved);
  CHECK(s.reserved == src.held);
  CHECK(s.requested <= s.in_use);
  CHECK(s.segments == src.segments.size());
  CHECK(s.largest_free <= s.cached);
}

}  // namespace

TEST_CASE("block pool: rounding and segment sizes", "[core][memory]") {
  CHECK(BlockPool::round(0) == 512);
  CHECK(BlockPool::round(1) == 512);
  CHECK(BlockPool::round(512) == 512);
  CHECK(BlockPool::round(513) == 1024);
  CHECK(BlockPool::segment_size(512) == 2 * MiB);
  CHECK(BlockPool::segment_size(MiB) == 2 * MiB);
  CHECK(BlockPool::segment_size(MiB + 512) == 20 * MiB);
  CHECK(BlockPool::segment_size(20 * MiB + 512) == 22 * MiB);
}

TEST_CASE("block pool: small requests share a segment, each block inside it, aligned, apart", "[core][memory]") {
  FakeSource src;
  BlockPool pool = src.pool();
  std::vector<std::pair<uintptr_t, size_t>> blocks;
  for (size_t bytes : {1ul, 100ul, 512ul, 513ul, 4000ul, 70000ul, MiB}) {
    void* p = pool.allocate(bytes);
    REQUIRE(p != nullptr);
    CHECK(src.inside(addr(p), bytes));
    CHECK(addr(p) % 512 == 0);
    blocks.push_back({addr(p), BlockPool::round(bytes)});
  }
  CHECK(src.allocs == 1);  // all of it (about 1.08 MiB) fits one 2 MiB segment
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) CHECK(blocks[i - 1].first + blocks[i - 1].second <= blocks[i].first);
  const BlockPoolStats s = pool.stats();
  CHECK(s.requests == 7);
  CHECK(s.cache_hits == 6);
  check_consistent(s, src);
}

TEST_CASE("block pool: a freed block serves the next request that fits, of any size", "[core][memory]") {
  FakeSource src;
  BlockPool pool = src.pool();
  // The old size-class allocator could not serve 3 MiB from a freed 1 GiB autotune workspace.
  void* workspace = pool.allocate(1024 * MiB);
  REQUIRE(workspace != nullptr);
  CHECK(pool.release(workspace) == 1024 * MiB);
  const int allocs = src.allocs;
  std::vector<void*> acts;
  for (int i = 0; i < 300; ++i) acts.push_back(pool.allocate(3 * MiB + 100 * i));
  CHECK(src.allocs == allocs);
  for (void* p : acts) CHECK(src.inside(addr(p), 3 * MiB));
  check_consistent(pool.stats(), src);
  for (void* p : acts) pool.release(p);
  // Everything merged back into the one segment.
  const BlockPoolStats s = pool.stats();
  CHECK(s.largest_free == 1024 * MiB);
  CHECK(s.in_use == 0);
  check_consistent(s, src);
}

TEST_CASE("block pool: neighbours merge in either order; whole segments go back", "[core][memory]") {
  FakeSource src;
  BlockPool pool = src.pool();
  void* a = pool.allocate(5 * MiB);
  void* b = pool.allocate(5 * MiB);
  void* c = pool.allocate(5 * MiB);
  CHECK(src.allocs == 1);  // one 20 MiB segment
  CHECK(addr(b) == addr(a) + 5 * MiB);
  CHECK(addr(c) == addr(b) + 5 * MiB);
  pool.release(b);
  pool.release(a);  // a merges with the free b after it
  void* d = pool.allocate(10 * MiB);
  CHECK(d == a);
  CHECK(src.allocs == 1);
  pool.release(c);
  pool.release(d);  // d merges with c and the tail after it
  BlockPoolStats s = pool.stats();
  CHECK(s.largest_free == 20 * MiB);
  CHECK(pool.release_free_segments() == 20 * MiB);
  s = pool.stats();
  CHECK(s.reserved == 0);
  CHECK(s.segments == 0);
  CHECK(src.frees == 1);
  check_consistent(s, src);
}

TEST_CASE("block pool: a rest of 1 MiB or less in a large block is not split off", "[core][memory]") {
  FakeSource src;
  BlockPool pool = src.pool();
  void* big = pool.allocate(4 * MiB);
  void* tail = pool.allocate(15 * MiB);  // the 16 MiB left after big
  pool.release(big);
  void* p = pool.allocate(3 * MiB + 512);  // rest 1 MiB - 512: handed out whole
  CHECK(p == big);
  BlockPoolStats s = pool.stats();
  CHECK(s.in_use == 4 * MiB + 16 * MiB);
  CHECK(s.requested == 3 * MiB + 512 + 15 * MiB);
  check_consistent(s, src);
  pool.release(p);
  pool.release(tail);
}

TEST_CASE("block pool: unknown and repeated frees change nothing", "[core][memory]") {
  FakeSource src;
  BlockPool pool = src.pool();
  void* p = pool.allocate(1000);
  int local = 0;
  CHECK(!pool.release(&local));
  CHECK(pool.release(p) == 1000u);
  CHECK(!pool.release(p));
  CHECK(!pool.release(nullptr));
  void* empty = pool.allocate(0);  // a block of its own, known like any other
  CHECK(pool.release(empty) == 0u);
  const BlockPoolStats s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.cached == s.reserved);
}

TEST_CASE("block pool: out of memory gives free segments back, retries, and fails cleanly", "[core][memory]") {
  FakeSource src;
  src.capacity = 64 * MiB;
  BlockPool pool = src.pool();
  void* a = pool.allocate(30 * MiB);  // a 30 MiB segment
  REQUIRE(a != nullptr);
  void* small = pool.allocate(1000);  // a 2 MiB segment
  pool.release(a);
  // 40 MiB does not fit beside the cached 30 MiB segment (32 MiB left): it is given back.
  void* b = pool.allocate(40 * MiB);
  REQUIRE(b != nullptr);
  CHECK(src.frees == 1);
  // Larger than what is left even after giving back every free segment: null.
  CHECK(pool.allocate(30 * MiB) == nullptr);
  // A request that needs less than the 20 MiB minimum segment gets just its own size.
  void* c = pool.allocate(12 * MiB);
  CHECK(c != nullptr);
  check_consistent(pool.stats(), src);
  pool.release(b);
  pool.release(c);
  pool.release(small);
  pool.release_free_segments();
  CHECK(src.held == 0);
}

TEST_CASE("block pool: a training-step pattern reaches a steady state close to its peak use", "[core][memory]") {
  // Forward keeps activations of assorted sizes; backward frees them in reverse while its
  // gradients and scratch (other sizes) come and go; the parameters live throughout.
  FakeSource src;
  BlockPool pool = src.pool();
  std::mt19937_64 rng(7);
  std::vector<size_t> act_sizes, grad_sizes;
  for (int i = 0; i < 120; ++i) act_sizes.push_back((1 + rng() % 64) * MiB + rng() % MiB);
  for (int i = 0; i < 120; ++i) grad_sizes.push_back((1 + rng() % 64) * MiB + rng() % MiB);
  SizeClassModel classes;
  std::vector<void*> params;
  for (int i = 0; i < 200; ++i) {
    const size_t bytes = 1 + rng() % (256 * 1024);
    params.push_back(pool.allocate(bytes));
    classes.allocate(bytes);
  }
  size_t peak_requested = 0;
  auto track = [&] { peak_requested = std::max(peak_requested, pool.stats().requested); };
  auto step = [&] {
    std::vector<void*> acts;
    for (size_t s : act_sizes) {
      acts.push_back(pool.allocate(s));
      classes.allocate(s);
      track();
    }
    for (size_t i = acts.size(); i-- > 0;) {
      const size_t scratch_bytes = grad_sizes[(i * 7) % grad_sizes.size()] / 3;
      void* g = pool.allocate(grad_sizes[i]);
      void* scratch = pool.allocate(scratch_bytes);
      classes.allocate(grad_sizes[i]);
      classes.allocate(scratch_bytes);
      track();
      pool.release(scratch);
      pool.release(acts[i]);
      pool.release(g);
      classes.release(scratch_bytes);
      classes.release(act_sizes[i]);
      classes.release(grad_sizes[i]);
    }
  };
  step();
  const size_t reserved_after_one = pool.stats().reserved;
  const int allocs_after_one = src.allocs;
  step();
  step();
  const BlockPoolStats s = pool.stats();
  CHECK(src.allocs == allocs_after_one);  // steady state: no new segment after the first step
  CHECK(s.reserved == reserved_after_one);
  // Held against used at the peak: the first step's segments are cut to its order of
  // requests, so some rounding (2 MiB per large segment) and a few holes are expected; 10%
  // is the bound that a size-class allocator misses on this pattern (see the next check).
  INFO("reserved " << s.peak_reserved / MiB << " MiB for a peak of " << peak_requested / MiB
                    << " MiB requested; size classes: " << classes.reserved / MiB << " MiB");
  CHECK(static_cast<double>(s.peak_reserved) <= 1.10 * static_cast<double>(peak_requested));
  CHECK(static_cast<double>(classes.reserved) > 1.10 * static_cast<double>(peak_requested));
  check_consistent(s, src);
  for (void* p : params) pool.release(p);
}

TEST_CASE("block pool: random requests and frees keep blocks apart and the books balanced", "[core][memory]") {
  FakeSource src;
  src.capacity = 512 * MiB;
  BlockPool pool = src.pool();
  std::mt19937_64 rng(11);
  std::map<uintptr_t, size_t> live;  // start -> requested bytes
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 100 < 55) {
      const size_t bytes = rng() % 4 == 0 ? rng() % (48 * MiB) : rng() % (64 * 1024);
      void* p = pool.allocate(bytes);
      if (p == nullptr) continue;  // out of the 512 MiB: allowed, the books must still balance
      const uintptr_t a = addr(p);
      REQUIRE(src.inside(a, BlockPool::round(bytes)));
      auto next = live.lower_bound(a);
      if (next != live.end()) REQUIRE(a + BlockPool::round(bytes) <= next->first);
      if (next != live.begin()) {
        auto prev = std::prev(next);
        REQUIRE(prev->first + BlockPool::round(prev->second) <= a);
      }
      live[a] = bytes;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      REQUIRE(pool.release(reinterpret_cast<void*>(it->first)) == it->second);
      live.erase(it);
    }
  }
  size_t requested = 0;
  for (const auto& [a, bytes] : live) requested += bytes;
  CHECK(pool.stats().requested == requested);
  check_consistent(pool.stats(), src);
  for (const auto& [a, bytes] : live) pool.release(reinterpret_cast<void*>(a));
  const BlockPoolStats s = pool.stats();
  CHECK(s.in_use == 0);
  pool.release_free_segments();
  CHECK(src.held == 0);
}
