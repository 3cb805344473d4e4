// The policy is at the top of block_pool.hpp.
#include "backend/block_pool.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace tnt::backend {

namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

BlockPool::BlockPool(SegmentAlloc alloc, SegmentFree free) : alloc_(std::move(alloc)), free_(std::move(free)) {}

BlockPool::~BlockPool() {
  for (Block* head : segment_heads_) {
    size_t bytes = 0;
    for (Block* b = head; b != nullptr;) {
      bytes += b->size;
      Block* next = b->next;
      if (b != head) delete b;
      b = next;
    }
    free_(head->ptr, bytes);
    delete head;
  }
}

size_t BlockPool::round(size_t bytes) { return bytes == 0 ? kAlign : round_up(bytes, kAlign); }

size_t BlockPool::segment_size(size_t rounded) {
  if (rounded <= kSmallLimit) return kSmallSegment;
  return std::max(kLargeSegmentMin, round_up(rounded, kLargeRound));
}

BlockPool::Block* BlockPool::find_free(size_t rounded, bool small) {
  FreeSet& set = free_set(small);
  Block key;
  key.size = rounded;
  key.ptr = nullptr;
  auto it = set.lower_bound(&key);  // the smallest block of at least `rounded`, lowest address first
  if (it == set.end()) return nullptr;
  Block* b = *it;
  set.erase(it);
  return b;
}

BlockPool::Block* BlockPool::new_segment(size_t rounded, bool small) {
  size_t bytes = segment_size(rounded);
  void* p = alloc_(bytes);
  if (p == nullptr) {
    release_free_segments();
    p = alloc_(bytes);
  }
  if (p == nullptr && !small && bytes > round_up(rounded, kLargeRound)) {
    // The minimum segment does not fit, the request alone may.
    bytes = round_up(rounded, kLargeRound);
    p = alloc_(bytes);
  }
  if (p == nullptr) return nullptr;
  auto* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = bytes;
  b->small = small;
  segment_heads_.insert(b);
  ++stats_.segment_allocs;
  ++stats_.segments;
  stats_.reserved += bytes;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  stats_.cached += bytes;
  return b;
}

void* BlockPool::hand_out(Block* b, size_t rounded, size_t bytes) {
  const size_t rest = b->size - rounded;
  const bool split = b->small ? rest >= kAlign : rest > kLargeSplitMin;
  if (split) {
    auto* tail = new Block;
    tail->ptr = b->ptr + rounded;
    tail->size = rest;
    tail->small = b->small;
    tail->prev = b;
    tail->next = b->next;
    if (b->next != nullptr) b->next->prev = tail;
    b->next = tail;
    b->size = rounded;
    free_set(tail->small).insert(tail);
  }
  b->used = true;
  b->requested = bytes;
  stats_.cached -= b->size;
  stats_.in_use += b->size;
  stats_.requested += bytes;
  live_[b->ptr] = b;
  return b->ptr;
}

void* BlockPool::allocate(size_t bytes) {
  ++stats_.requests;
  const size_t rounded = round(bytes);
  const bool small = rounded <= kSmallLimit;
  Block* b = find_free(rounded, small);
  if (b != nullptr) {
    ++stats_.cache_hits;
  } else {
    b = new_segment(rounded, small);
    if (b == nullptr) return nullptr;
  }
  return hand_out(b, rounded, bytes);
}

std::optional<size_t> BlockPool::release(void* ptr) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return std::nullopt;
  Block* b = it->second;
  live_.erase(it);
  const size_t requested = b->requested;
  b->used = false;
  b->requested = 0;
  stats_.in_use -= b->size;
  stats_.requested -= requested;
  stats_.cached += b->size;
  FreeSet& set = free_set(b->small);
  // Merge the later block into the earlier one, so a segment's first block never goes away.
  if (Block* n = b->next; n != nullptr && !n->used) {
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  if (Block* p = b->prev; p != nullptr && !p->used) {
    set.erase(p);  // its key (size) changes
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  set.insert(b);
  return requested;
}

size_t BlockPool::release_free_segments() {
  size_t given = 0;
  for (FreeSet* set : {&free_small_, &free_large_}) {
    std::vector<Block*> whole;
    for (Block* b : *set) {
      if (b->prev == nullptr && b->next == nullptr) whole.push_back(b);
    }
    for (Block* b : whole) {
      set->erase(b);
      segment_heads_.erase(b);
      free_(b->ptr, b->size);
      given += b->size;
      stats_.reserved -= b->size;
      stats_.cached -= b->size;
      --stats_.segments;
      ++stats_.segment_frees;
      delete b;
    }
  }
  return given;
}

BlockPoolStats BlockPool::stats() const {
  BlockPoolStats s = stats_;
  s.largest_free = 0;
  if (!free_small_.empty()) s.largest_free = (*free_small_.rbegin())->size;
  if (!free_large_.empty()) s.largest_free = std::max(s.largest_free, (*free_large_.rbegin())->size);
  return s;
}

}  // namespace tnt::backend
