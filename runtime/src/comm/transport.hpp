// How the Reducer moves its buckets: one Transport per Reducer, chosen by where the
// gradients live. The Reducer decides WHEN (the plan, which gradients are ready, bucket
// order, the step's clock); a transport decides HOW (packing, the collective, unpacking).
//
//   host   (transport_host.cpp)        pack, our ring (or MPI's) allreduce on a
//                                      communication thread with its own duplicate
//                                      communicator, unpack; without MPI_THREAD_MULTIPLE or
//                                      with overlap off, all inside wait_all().
//   nccl   (transport_nccl_cuda.cpp)   pack kernel on the device's compute stream, event
//                                      hand-off to the NCCL stream, unpack kernel on the
//                                      compute stream; CUDA builds only (nccl_stub.cpp
//                                      throws in CPU-only builds).
//
// Calls, all from the training thread: begin_step, then launch() for each bucket in
// bucket order, end_backward, wait_all, unpack() for each bucket, read_timing. With one
// rank nothing is launched: scale() instead.
#pragma once

#include "comm/bucket_plan.hpp"
#include "tarantella/reducer.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace tnt::comm {

using Clock = std::chrono::steady_clock;

// What a transport is made from; it keeps its own copies.
struct TransportSetup {
  Communicator& comm;                     // the user's; with more than one rank a transport duplicates it (collective)
  const BucketPlan& plan;                 // every bucket of one kind of memory
  const std::vector<std::string>& names;  // (gradients,) for messages
  const std::vector<Tensor>& grads;       // (gradients,) in registration order
  const ReducerOptions& options;
};

// A bucket as both transports hold it.
struct FusedBucket {
  std::vector<Tensor> members;   // the bucket's gradients, in bucket order
  std::vector<int64_t> offsets;  // (members,) element offset of each in fused
  Tensor fused;                  // (bucket elements,); undefined for a one-gradient bucket or one rank
  DType dtype = DType::f32;
  int64_t bytes = 0;
  AllreduceAlgo algo = AllreduceAlgo::automatic;
  std::string what;  // "Reducer bucket 3 (40960 B)", for messages
  std::string trace_args;  // the timeline's args: bucket, bytes, tensors (io/timeline.hpp)
};

// The plan's buckets with their fused buffers allocated where the gradients live, and the
// algorithm each resolves to (throws when the configured one cannot take them).
std::vector<FusedBucket> fuse_buckets(const TransportSetup& setup);

class Transport {
 public:
  virtual ~Transport() = default;

  virtual void begin_step(Clock::time_point t0) = 0;  // the step's first mark_ready; times count from t0
  // Bucket b is complete: pack it (times factor) and start its sum. Never waits for peers.
  virtual void launch(size_t b, double factor) = 0;
  virtual void end_backward() = 0;  // finalize() was called
  // Returns when every launched bucket is summed on this rank; throws the first failure.
  virtual void wait_all() = 0;
  virtual void unpack(size_t b, double scale) = 0;  // the sum back into the gradients, times scale
  virtual void scale(size_t b, double factor) = 0;  // one rank: the gradients times factor, in place
  // Fills start_s and end_s of every bucket (device: also ready_s and backward_end_s, from
  // events on the GPU's clock).
  virtual void read_timing(StepTiming& timing) = 0;
  // The owner leaves a step early (its destructor): a collective still waiting gives up.
  virtual void cancel() = 0;
};

std::unique_ptr<Transport> make_host_transport(const TransportSetup& setup);
std::unique_ptr<Transport> make_nccl_transport(const TransportSetup& setup);

}  // namespace tnt::comm
