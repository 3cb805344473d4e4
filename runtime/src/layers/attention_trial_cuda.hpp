// TNT_CUDNN_ATTENTION=auto (the default): the first use of each shape on a device runs a
// trial of cuDNN's flash attention against the engine that would run otherwise (the fused
// one where it applies, else the unfused one) and remembers the verdict; the rules are
// attention_choice.hpp's. The trial runs on test operands of the shape (q and k uniform in
// [-2, 2], so that the softmax is far from flat and a wrong scale shows; v and dO in
// [-1, 1], independent and of mean zero, as the dropout noise check assumes) with the real padding ids, their first key made visible (rows whose keys are all
// padding differ between the engines on purpose: attention_cudnn_cuda.hpp), so the layer's
// own tensors are only read for their shapes. It takes a few forward and backward runs of
// each engine, and the shape's undropped cuDNN graphs besides its own (one more key against
// kCudnnAttentionMaxShapes). Each verdict is logged at INFO with both times; a cuDNN result
// that disagrees is a WARNING (the shape keeps the other engine).
#pragma once

#include "layers/attention_cuda.hpp"
#include "layers/attention_cudnn_cuda.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace tnt::cuda {

struct AttentionTrialRecord {
  std::string key;    // CudnnAttentionKey::str() of the shape
  int device = -1;
  std::string other;  // "fused" or "unfused"
  bool use_cudnn = false;
  std::string verdict;  // "faster", "not faster", or the check or error that ruled cuDNN out
  bool suspect = false;  // a check failed or the trial failed: logged as a warning
  double cudnn_ms = -1, other_ms = -1;  // forward + backward, with the shape's dropout
  // Without dropout, cuDNN's results against the other engine's: {max |difference|, max
  // |other|} of o, dq, dk and dv (NaN where not reached).
  struct Agreement {
    double diff, largest;
  };
  Agreement o{NAN, NAN}, dq{NAN, NAN}, dk{NAN, NAN}, dv{NAN, NAN};
  // With dropout: <o, o> against <V, dV> from dO = o, <o, o_0> / <o_0, o_0> and
  // |o - o_0|^2 / |o_0|^2 (NaN where not checked).
  double o_dot_o = NAN, v_dot_dv = NAN, mean_ratio = NAN, noise = NAN;
  std::string str() const;
};

// Whether the shape of `key` (prepared: both cuDNN graphs built) runs cuDNN under auto on
// `device`: the remembered verdict, or the trial's on first use (q and k give the shapes,
// key_ids the padding; `other_fused` says which engine cuDNN is up against).
bool attention_auto_uses_cudnn(const Tensor& q, const Tensor& k, const Tensor& key_ids, const AttentionCoreArgs& a,
                               const CudnnAttentionKey& key, bool other_fused, int device);

// For tests. The records of every trial in this process, in order.
std::vector<AttentionTrialRecord> attention_trials();
// Forgets every verdict and record: each shape's next use runs its trial again.
void attention_trials_reset();
// true: a trial takes cuDNN wherever its checks pass, however slow (so that a test sees the
// auto path run cuDNN); false (the default): the times decide.
void attention_trial_prefer_cudnn(bool on);
// true: the trial's undropped cuDNN run uses twice the scale, so its check must fail.
void attention_trial_corrupt_scale(bool on);
// true: the trial's dropout run of cuDNN drops nothing, so its noise check must fail.
void attention_trial_corrupt_dropout(bool on);

}  // namespace tnt::cuda
