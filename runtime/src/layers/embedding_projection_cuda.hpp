// Embedding's output projection on CUDA (logits = x W^T, dx = dy W, dW += dy^T x) with the
// vocabulary padded to a multiple of 8 where that pays (TNT_GEMM_PAD; the rules and why:
// projection_pad.hpp). Dense uses the same products for its units (y = x W^T before its
// bias and epilogue) when they are not a multiple of 8.
//
// The padded path, for a 16-bit x whose vocabulary V is not a multiple of 8, Vp = V rounded
// up: W is copied into a (Vp, D) scratch with zero rows after V; the forward computes row
// chunks of (rows, Vp) logits and copies their first V columns out; the backward copies
// chunks of dy into (rows, Vp) with zero columns after V, computes dx from them and the
// padded W, and adds dW into a (Vp, D) f32 copy of the gradient that goes back at the end.
// Every product then has 16-byte aligned rows; the zero rows and columns add only zero
// terms, so the sums are the direct path's (in another order).
//
// TNT_GEMM_PAD=auto (the default): the first use of each (device, dtype, V, D, power-of-two
// class of rows) runs a trial: both paths on the first rows of the call's own x (several
// short chunks, so that a wrong offset or copy shows), compared within projection_pad::
// kAgree, then both timed at the call's size, forward and backward apart (the backward on the
// call's logits as its gradient). Each direction takes the padded path where it is 2%
// faster. One INFO line per trial with the four times (a disagreement, or a failed trial, is
// a WARNING, and that shape keeps the direct path). Not in deterministic mode: the choice
// would depend on timing. 1 = always padded where it applies; 0 = never.
#pragma once

#include "tarantella/dtype.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace tnt::cuda {

// Which path each direction of one call takes (decided at its forward, kept for its backward).
struct ProjectionPath {
  bool forward_padded = false, backward_padded = false;
};

// The path of a projection of x (rows, d) over a vocabulary of v on `device`: TNT_GEMM_PAD's
// mode, and at auto the remembered verdict or a trial (which runs both paths on x and w,
// the backward with dx, and writes into logits, whose contents the caller's forward then
// replaces). `layer` names the caller in the verdict line ("Embedding 'embedding'").
ProjectionPath projection_path(const std::string& layer, DType dtype, int64_t rows, int64_t v, int64_t d,
                               const void* x, const void* w, void* logits, int device);
// The same without a trial: the mode's path, or the verdict of an earlier trial, else direct
// (for a backward that did not keep its forward's path).
ProjectionPath projection_path_known(DType dtype, int64_t rows, int64_t v, int64_t d, int device);

// logits (rows, v) = x (rows, d) w^T (v, d), in dtype.
void projection_forward(bool padded, int device, DType dtype, int64_t rows, int64_t v, int64_t d, const void* x,
                        const void* w, void* logits);
// dx (rows, d) = dy (rows, v) w (v, d) where dx is not null; dw (v, d, f32) += dy^T x.
void projection_backward(bool padded, int device, DType dtype, int64_t rows, int64_t v, int64_t d, const void* dy,
                         const void* x, const void* w, void* dx, float* dw);

struct ProjectionPadRecord {
  std::string layer;  // "Embedding 'embedding'", "Dense 'fc'"
  int device = -1;
  DType dtype = DType::f32;
  int64_t rows = 0, v = 0, d = 0;
  ProjectionPath path;
  bool suspect = false;  // the check failed, or the trial did: logged as a warning
  std::string verdict;   // why, where suspect
  double forward_direct_ms = -1, forward_padded_ms = -1, backward_direct_ms = -1, backward_padded_ms = -1;
  // The check: {max |padded - direct|, max |direct|} of the logits, dx and dW (NaN where
  // not reached).
  struct Agreement {
    double diff = NAN, largest = NAN;
  };
  Agreement logits, dx, dw;
  std::string str() const;
};

// For tests. Every trial's record in this process, in order.
std::vector<ProjectionPadRecord> projection_pad_trials();
// Forgets every verdict and record.
void projection_pad_trials_reset();
// Rows per chunk of the padded path (0: projection_pad::chunk_rows's), so that a small test
// crosses chunk edges.
void projection_pad_chunk_rows_for_tests(int64_t rows);
// 1: the trial's check runs a padded forward whose copy reads each row one column late; 2: a
// padded backward whose dy rows land one column late; either way the check must fail. 0: off.
void projection_pad_corrupt_for_tests(int which);
// true: the trial takes the padded path in both directions wherever its check passes.
void projection_pad_prefer_padded_for_tests(bool on);
// How many projection_forward / projection_backward calls took the padded path (trials not
// counted).
int64_t projection_pad_padded_calls();

}  // namespace tnt::cuda
