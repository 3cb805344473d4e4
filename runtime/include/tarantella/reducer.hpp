// Reducer ("tensor fusion"): sums every rank's parameter gradients while backward is still
// running.
//
// Plan. The gradients are given once, in the model's REGISTRATION order. Buckets are formed
// in REVERSE order (backward produces the last layers' gradients first), greedily: a
// bucket takes gradients while its size is below the threshold (so every bucket but the
// last reaches it), and also closes where the dtype or device changes. Threshold 0 (or 1
// byte) gives one bucket per gradient. Every rank must build the same plan: the
// constructor compares a fingerprint of (names, shapes, dtypes, devices, threshold) over
// the ranks and, on a mismatch, throws CommError on EVERY rank naming the first differing
// gradient and which ranks hold which version (instead of the job hanging later).
//
// One step, as the training loop uses it:
//   reducer.mark_ready(i)   for each gradient once it is final (any order; by index in the
//                           registration list or by name). From then until finalize()
//                           returns, the gradient tensor belongs to the Reducer: do not
//                           read or write it.
//   reducer.finalize()      after backward: waits for every bucket, writes the summed
//                           gradients back into the gradient tensors, times `scale`.
// A bucket starts once all its gradients are ready, and buckets start in bucket order on
// every rank (a complete bucket waits for the ones before it), so ranks never wait on
// different collectives. Nothing in mark_ready blocks: host buckets are packed and
// allreduced by a communication thread that owns its own duplicate of the communicator
// (so the training loop may keep using `comm` meanwhile); device buckets are packed by a
// kernel on the compute stream, handed to the NCCL stream through an event, and
// unpacked by finalize() on the compute stream. Gradients not marked by the time of
// finalize() are taken as they are (marked then, in registration order).
//
// Scaling. finalize(scale) multiplies the SUM by scale, 1/size() by default (the mean of the
// ranks' gradients). For uneven micro-batches, set_local_factor(f) makes each rank
// multiply ITS OWN gradient by f while packing, before the sum: with local batches b_r of
// a global batch B and per-rank mean losses, f_r = b_r / B and finalize(1.0) give the
// gradient of the mean loss over the global batch. The factor stays until changed; set it
// before the step's first mark_ready.
//
// Timing. last_step() describes the step finalize() just finished: for each bucket, when
// it became ready, when its allreduce started and finished, and when backward ended (the
// finalize() call); seconds since the step's first mark_ready (device buckets: measured
// with CUDA events, on the GPU's clock). hidden_s() is the communication time that
// overlapped backward.
//
// After an exception from finalize() (a CommError from a collective) the Reducer is
// unusable: end the job.
#pragma once

#include "tarantella/comm.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tnt {

struct ReducerOptions {
  // Chosen by the scaling model (docs/scaling.md): the first auto_warmup_steps steps run at
  // 32 KB, the next auto_steps are timed, then every rank measures the allreduce, the
  // master's timings pick the threshold predicted fastest, and the plan is made again once.
  static constexpr int64_t kAuto = -2;
  int64_t threshold_bytes = -1;  // -1: TNT_FUSION_THRESHOLD (KB, or auto) of the configuration; kAuto
  int auto_warmup_steps = 3;
  int auto_steps = 5;
  AllreduceAlgo algo = AllreduceAlgo::automatic;
  // Stream (cudaStream_t) that produces device gradients and receives the summed ones;
  // nullptr = the layers' compute stream of the gradients' device (what training uses).
  void* cuda_stream = nullptr;
  bool overlap = true;           // false: reduce every bucket inside finalize() (for comparisons)
};

struct BucketTiming {
  double ready_s = 0;  // its last gradient was marked ready
  double start_s = 0;  // packing / the allreduce began
  double end_s = 0;    // the summed data was complete
};

struct StepTiming {
  double backward_end_s = 0;  // finalize() was called
  // finalize() returned (device buckets over several ranks, on the GPU's clock as their
  // other times: the later of backward's end and the last bucket's end)
  double finalize_end_s = 0;
  std::vector<BucketTiming> buckets;
  // (gradients,) in registration order: when each was marked ready (device buckets: its
  // bucket's ready_s, since the GPU's clock has no per-gradient event). For the scaling
  // profile (docs/scaling.md), which re-plans the buckets at other thresholds.
  std::vector<double> gradient_ready_s;
  double comm_s() const;     // total time buckets were in flight (sum of end - start)
  double hidden_s() const;   // the part of it before backward_end_s
  double exposed_s() const;  // finalize_end_s - backward_end_s: what backward waited for
  // The mean over buckets of how long each waited to start once it was ready and the one
  // before it was done (the communication thread's wake-up); 0 without buckets.
  double launch_delay_s() const;
  // finalize_end_s less the later of backward_end_s and the last bucket's end: waking the
  // waiting thread and unpacking (0 for device buckets over several ranks, whose
  // finalize_end_s is that later end).
  double finish_s() const;
};

class Reducer {
 public:
  struct Bucket {
    std::vector<size_t> gradients;  // indices in the registration list, in reverse order
    int64_t bytes = 0;
    DType dtype = DType::f32;
    Device device;
  };

  // Collective over comm. gradients: (full parameter name, gradient tensor) in registration
  // order; names must be unique and tensors defined.
  Reducer(Communicator& comm, std::vector<std::pair<std::string, Tensor>> gradients, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  void mark_ready(size_t index);
  void mark_ready(const std::string& name);
  void add(const std::string& name) { mark_ready(name); }

  void set_local_factor(double factor);
  double local_factor() const;
  void finalize(std::optional<double> scale = std::nullopt);

  size_t num_gradients() const;
  const std::vector<std::string>& gradient_names() const;  // (gradients,) registration order
  std::vector<int64_t> gradient_bytes() const;              // (gradients,) registration order
  const std::vector<Bucket>& buckets() const;
  int64_t threshold_bytes() const;  // the plan's now (auto: changes once, after the timed steps)
  // Auto: the line that announced the choice (also printed by the master); empty before.
  const std::string& auto_choice() const;
  // Collective, between steps: makes the plan again at `bytes` (the scaling profile times a
  // few steps with one bucket, so that no allreduce runs during their backward). Refused
  // while --fusion-threshold auto has not chosen yet.
  void set_threshold(int64_t bytes);
  bool choosing_threshold() const;  // auto, before its choice
  std::string plan() const;  // one line per bucket: index, bytes, gradient names
  const StepTiming& last_step() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tnt
