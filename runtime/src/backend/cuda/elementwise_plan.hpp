// How an element-wise CUDA kernel walks its n elements, decided on the host before the
// launch (backend/cuda/vector_io.cuh runs the plan). Plain C++, no CUDA headers, so the
// decision is unit-tested without a GPU (tests/core/test_elementwise_plan.cpp).
//
// Vector path: each thread step moves `width` elements of every operand with one load or
// store per operand (16 bytes for the widest element type), so every pointer must be
// 16-byte aligned. Tensors can be views at any byte offset (fusion buffers, slice_rows),
// so alignment is checked for every call; one misaligned pointer sends the whole call to
// the scalar path (width 1), which reads nothing it should not. Either path applies the
// same per-element function to the same element, so the results are bit for bit the same.
//
// Index type: the kernel counts in 32-bit unsigned integers when no index it forms can
// wrap (n plus one grid's worth of threads fits), else in 64 bits. The widths are powers of
// two, so splitting n into vectors and a tail is a shift either way: no per-element
// division.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace tnt::cuda {

constexpr int kVectorBytes = 16;

inline bool aligned_for_vectors(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % kVectorBytes == 0;
}

// Elements of the widest operand that fill one 16-byte access (1 for an element wider
// than 16 bytes, which none of ours is).
constexpr int vector_width(int widest_element_bytes) {
  return widest_element_bytes >= kVectorBytes ? 1 : kVectorBytes / widest_element_bytes;
}

struct ElementwisePlan {
  int width = 1;       // elements per thread step: vector_width(...) or 1 (scalar path)
  int64_t vectors = 0; // n / width full steps
  int64_t tail = 0;    // n % width elements left, one per thread of the first threads
  // Work items the grid is sized for: the steps, or the tail alone when there are none.
  int64_t work_items() const { return vectors > 0 ? vectors : tail; }
};

// width: vector_width of the operands' widest element type; pointers: every operand.
inline ElementwisePlan plan_elementwise(int64_t n, int width, std::initializer_list<const void*> pointers) {
  ElementwisePlan plan;
  bool aligned = width > 1;
  for (const void* p : pointers) aligned = aligned && aligned_for_vectors(p);
  plan.width = aligned ? width : 1;
  plan.vectors = n / plan.width;
  plan.tail = n % plan.width;
  return plan;
}

// Whether 32-bit unsigned indices are safe for n elements walked by `threads` threads in
// a grid-stride loop: the largest index formed is below n + threads (the step after the
// last element), which must stay below 2^32.
inline bool fits_index32(int64_t n, int64_t threads) {
  return n >= 0 && threads >= 0 && n + threads < (int64_t{1} << 32);
}

}  // namespace tnt::cuda
