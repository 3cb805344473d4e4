// The Communicator's collectives on device buffers: NCCL, on the NCCL communicator of
// w.comm() (created by the first one, collectively over MPI). CUDA builds:
// device_collectives_cuda.cpp; CPU-only builds: nccl_stub.cpp, where they throw.
//
// Each one checks that `device` is this rank's device, orders the NCCL stream after the
// work queued so far on that device's compute stream (where the layers produced the
// data), enqueues, and returns when the data is complete on this rank (polling, with w's
// deadline). Call after comm.enter(). No CUDA types here.
#pragma once

#include "backend/cuda/nccl_comm.hpp"
#include "comm/waiter.hpp"

#include <cstdint>

namespace tnt::comm {

// How a wait on NCCL work of collective w ends when it does not complete: w's deadline,
// and w's rounds of asking the other ranks where they are (Waiter::poll), so that a
// missing rank or a different collective is named, as on the MPI paths. w must outlive
// the wait.
backend::NcclComm::Watch nccl_watch(detail::Waiter& w);

// data: (count,) of dtype, in place; average divides by the number of ranks.
void device_allreduce(detail::Waiter& w, void* data, int64_t count, DType dtype, Device device, bool average);
// data: (bytes,) as raw bytes; every rank ends with root's.
void device_broadcast(detail::Waiter& w, void* data, int64_t bytes, Device device, int root);
// in: (bytes_per_rank,), out: (p, bytes_per_rank) as raw bytes.
void device_allgather(detail::Waiter& w, const void* in, void* out, int64_t bytes_per_rank, Device device);

}  // namespace tnt::comm
