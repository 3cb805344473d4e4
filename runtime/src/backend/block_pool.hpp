// A caching allocator's bookkeeping, apart from the memory it manages: segments come from a
// source (cudaMalloc in backend/cuda/memory.cpp; anything in tests), and requests are cut
// out of them as best-fitting blocks, split where the rest is worth keeping, and merged
// with free neighbours when they come back. Plain C++, so the policy is tested without a
// GPU (tests/core/test_block_pool.cpp). Not thread-safe: the caller locks.
//
// Why not size classes (what memory.cpp did before): a block freed in one class could
// serve no request of another, so a step held the sum over classes of each class's peak,
// and a 1 GiB convolution autotune workspace stayed reserved for good, unusable by the
// activations. Here any free byte serves any request it fits, and segments that are
// wholly free can be given back (release_free_segments) when memory runs short.
//
// The policy:
// - A request is rounded up to kAlign bytes (what the device's vector loads and cuDNN's
//   alignment want).
// - Requests up to kSmallLimit come from kSmallSegment segments kept apart from the large
//   ones, so that small long-lived tensors (parameters, statistics) do not pin large
//   segments and stop them merging.
// - A larger request takes a segment of at least kLargeSegmentMin (several medium tensors
//   share one driver call), else its size rounded up to kLargeRound.
// - Best fit: the smallest free block of the right pool that holds the request (lowest
//   address among equals, so runs are reproducible). The rest is split off as a free block
//   when it is at least kAlign (small pool) or more than kLargeSplitMin (large pool: a
//   smaller rest is handed out with the block and counted as in use).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>

namespace tnt::backend {

struct BlockPoolStats {
  size_t reserved = 0;        // bytes of every segment held from the source
  size_t peak_reserved = 0;   // the most reserved ever (not reset)
  size_t cached = 0;          // bytes of the free blocks inside the segments
  size_t in_use = 0;          // bytes of the blocks handed out (rounded, with unsplit rests)
  size_t requested = 0;       // bytes the live blocks' callers asked for
  size_t largest_free = 0;    // the biggest free block
  size_t segments = 0;        // segments held
  uint64_t segment_allocs = 0;  // successful source allocations
  uint64_t segment_frees = 0;   // segments given back to the source
  uint64_t requests = 0;        // allocate calls
  uint64_t cache_hits = 0;      // requests served without a new segment
};

class BlockPool {
 public:
  static constexpr size_t kAlign = 512;
  static constexpr size_t kSmallLimit = size_t{1} << 20;
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kLargeSegmentMin = size_t{20} << 20;
  static constexpr size_t kLargeRound = size_t{2} << 20;
  static constexpr size_t kLargeSplitMin = size_t{1} << 20;

  // The source returns null when it is out of memory; free gets back exactly what alloc gave.
  using SegmentAlloc = std::function<void*(size_t bytes)>;
  using SegmentFree = std::function<void(void* ptr, size_t bytes)>;

  BlockPool(SegmentAlloc alloc, SegmentFree free);
  // Gives every segment back to the source, blocks in use or not.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // What a request of `bytes` takes at least: bytes rounded up to kAlign (kAlign for 0).
  static size_t round(size_t bytes);
  // The segment a request that found no free block asks the source for (rounded = round()).
  static size_t segment_size(size_t rounded);

  // A block of at least `bytes`, kAlign-aligned relative to its segment's start. Null when
  // the source is out of memory even after every wholly free segment was given back.
  void* allocate(size_t bytes);
  // Takes the block back; returns the bytes its caller had asked for, or nothing (and
  // nothing changes) for a pointer this pool did not hand out or has already taken back.
  std::optional<size_t> release(void* ptr);
  // Gives every wholly free segment back to the source; returns the bytes given back.
  size_t release_free_segments();
  BlockPoolStats stats() const;

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    bool used = false;
    bool small = false;
    Block* prev = nullptr;  // neighbours within the segment
    Block* next = nullptr;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySizeThenAddress>;

  FreeSet& free_set(bool small) { return small ? free_small_ : free_large_; }
  Block* find_free(size_t rounded, bool small);
  Block* new_segment(size_t rounded, bool small);
  void* hand_out(Block* b, size_t rounded, size_t bytes);

  SegmentAlloc alloc_;
  SegmentFree free_;
  FreeSet free_small_, free_large_;
  std::unordered_map<void*, Block*> live_;
  std::set<Block*> segment_heads_;  // first block of every segment, for the destructor
  BlockPoolStats stats_;
};

}  // namespace tnt::backend
