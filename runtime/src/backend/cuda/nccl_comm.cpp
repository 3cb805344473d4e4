#include "backend/cuda/nccl_comm.hpp"

#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/nccl_check.hpp"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <cstring>

namespace tnt::backend {

static_assert(NcclComm::kIdBytes == sizeof(ncclUniqueId), "NCCL unique id size changed");

namespace {

ncclComm_t as_comm(void* p) { return static_cast<ncclComm_t>(p); }
cudaStream_t as_stream(void* p) { return static_cast<cudaStream_t>(p); }
cudaEvent_t as_event(void* p) { return static_cast<cudaEvent_t>(p); }

ncclDataType_t nccl_type(DType dtype, const std::string& op) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  throw CommError(fmt::format("{}: NCCL has no type for {}", op, dtype_name(dtype)));
}

}  // namespace

void NcclComm::make_unique_id(char* id) {
  ncclUniqueId uid;
  TNT_NCCL_CHECK(ncclGetUniqueId(&uid));
  std::memcpy(id, &uid, sizeof(uid));
}

NcclComm::NcclComm(const char* id, int rank, int size, int device, const std::string& op,
                   const Watch& watch, Clock::duration close_timeout)
    : rank_(rank), size_(size), device_(device), close_timeout_(close_timeout) {
  TNT_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  // Non-blocking: the stream must not serialise with the legacy default stream, or the
  // NCCL work could never overlap the compute work queued there.
  TNT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaEvent_t e1 = nullptr, e2 = nullptr;
  TNT_CUDA_CHECK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
  TNT_CUDA_CHECK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  sync_event_ = e1;
  order_event_ = e2;

  ncclUniqueId uid;
  std::memcpy(&uid, id, sizeof(uid));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, size, uid, rank, &config);
  comm_ = comm;
  if (rc != ncclSuccess && rc != ncclInProgress) {
    fail(op, fmt::format("ncclCommInitRankConfig failed: {} {}", ncclGetErrorString(rc), ncclGetLastError(nullptr)));
  }
  settle(op, "ncclCommInitRankConfig", watch);
}

NcclComm::~NcclComm() {
  cudaSetDevice(device_);
  if (comm_ && !aborted_) {
    const bool idle = !abort_on_close_ && cudaStreamQuery(as_stream(stream_)) == cudaSuccess;
    // A "not ready" answer must not linger as the thread's last error (see synchronize).
    if (!idle) (void)cudaGetLastError();
    if (idle && finalized(Clock::now() + close_timeout_)) {
      ncclCommDestroy(as_comm(comm_));
    } else {
      ncclCommAbort(as_comm(comm_));
    }
  }
  if (sync_event_) cudaEventDestroy(as_event(sync_event_));
  if (order_event_) cudaEventDestroy(as_event(order_event_));
  if (stream_) cudaStreamDestroy(as_stream(stream_));
}

bool NcclComm::finalized(Clock::time_point deadline) noexcept {
  ncclResult_t rc = ncclCommFinalize(as_comm(comm_));
  if (rc != ncclSuccess && rc != ncclInProgress) return false;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(as_comm(comm_), &state) != ncclSuccess) return false;
    if (state == ncclSuccess) return true;
    if (state != ncclInProgress || Clock::now() > deadline) return false;
    sched_yield();
  }
}

void NcclComm::fail(const std::string& op, const std::string& why) {
  if (comm_ && !aborted_) {
    ncclCommAbort(as_comm(comm_));
    aborted_ = true;
  }
  throw CommError(fmt::format("{} on rank {} of {} (NCCL, cuda:{}): {}", op, rank_, size_, device_, why));
}

void NcclComm::watch_round(const std::string& op, const char* call, const Watch& watch) {
  const Clock::time_point now = Clock::now();
  if (watch.check) {
    try {
      watch.check(now);
    } catch (...) {
      if (comm_ && !aborted_) {
        ncclCommAbort(as_comm(comm_));
        aborted_ = true;
      }
      throw;
    }
  }
  if (now > watch.deadline) {
    fail(op, call ? fmt::format("{} did not complete in time (TNT_COLLECTIVE_TIMEOUT); a rank may not have joined", call)
                  : "did not complete within TNT_COLLECTIVE_TIMEOUT; a rank may not have joined");
  }
}

void NcclComm::settle(const std::string& op, const char* call, const Watch& watch) {
  TNT_CHECK(!aborted_, "{}: the NCCL communicator was aborted after an earlier error", op);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(as_comm(comm_), &state);
    if (rc != ncclSuccess) fail(op, fmt::format("ncclCommGetAsyncError: {}", ncclGetErrorString(rc)));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      fail(op, fmt::format("{}: {} {}", call, ncclGetErrorString(state), ncclGetLastError(as_comm(comm_))));
    }
    watch_round(op, call, watch);
    sched_yield();
  }
}

void NcclComm::wait_stream(void* stream) {
  TNT_CUDA_CHECK(cudaEventRecord(as_event(order_event_), as_stream(stream)));
  TNT_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), as_event(order_event_), 0));
}

void NcclComm::wait_event(void* event) {
  TNT_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), as_event(event), 0));
}

void NcclComm::record(void* event) { TNT_CUDA_CHECK(cudaEventRecord(as_event(event), as_stream(stream_))); }

void NcclComm::allreduce(void* data, size_t count, DType dtype, bool average, const std::string& op,
                         const Watch& watch) {
  TNT_CHECK(!aborted_, "{}: the NCCL communicator was aborted after an earlier error", op);
  TNT_CUDA_CHECK(cudaSetDevice(device_));
  ncclResult_t rc = ncclAllReduce(data, data, count, nccl_type(dtype, op), average ? ncclAvg : ncclSum,
                                  as_comm(comm_), as_stream(stream_));
  if (rc != ncclSuccess && rc != ncclInProgress) {
    fail(op, fmt::format("ncclAllReduce: {} {}", ncclGetErrorString(rc), ncclGetLastError(as_comm(comm_))));
  }
  settle(op, "ncclAllReduce", watch);
}

void NcclComm::broadcast(void* data, size_t bytes, int root, const std::string& op, const Watch& watch) {
  TNT_CHECK(!aborted_, "{}: the NCCL communicator was aborted after an earlier error", op);
  TNT_CUDA_CHECK(cudaSetDevice(device_));
  ncclResult_t rc = ncclBroadcast(data, data, bytes, ncclUint8, root, as_comm(comm_), as_stream(stream_));
  if (rc != ncclSuccess && rc != ncclInProgress) {
    fail(op, fmt::format("ncclBroadcast: {} {}", ncclGetErrorString(rc), ncclGetLastError(as_comm(comm_))));
  }
  settle(op, "ncclBroadcast", watch);
}

void NcclComm::allgather(const void* in, void* out, size_t bytes_per_rank, const std::string& op,
                         const Watch& watch) {
  TNT_CHECK(!aborted_, "{}: the NCCL communicator was aborted after an earlier error", op);
  TNT_CUDA_CHECK(cudaSetDevice(device_));
  ncclResult_t rc = ncclAllGather(in, out, bytes_per_rank, ncclUint8, as_comm(comm_), as_stream(stream_));
  if (rc != ncclSuccess && rc != ncclInProgress) {
    fail(op, fmt::format("ncclAllGather: {} {}", ncclGetErrorString(rc), ncclGetLastError(as_comm(comm_))));
  }
  settle(op, "ncclAllGather", watch);
}

void NcclComm::synchronize(void* event, const std::string& op, const Watch& watch) {
  TNT_CHECK(!aborted_, "{}: the NCCL communicator was aborted after an earlier error", op);
  TNT_CUDA_CHECK(cudaSetDevice(device_));
  cudaEvent_t e = as_event(event);
  if (!e) {
    e = as_event(sync_event_);
    TNT_CUDA_CHECK(cudaEventRecord(e, as_stream(stream_)));
  }
  // Polling instead of cudaEventSynchronize: a peer that never joins would block that
  // call forever, and NCCL reports its own asynchronous errors only when asked.
  for (;;) {
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) fail(op, fmt::format("CUDA error while waiting: {}", cudaGetErrorString(q)));
    // "Not ready" is a status, not an error: clear it, or the next kernel launch's check
    // (TNT_CUDA_CHECK_LAUNCH reads cudaGetLastError) could report it as a failed launch.
    // embedding_cuda.cu's polling of its id checks does the same.
    (void)cudaGetLastError();
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(as_comm(comm_), &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(op, fmt::format("asynchronous NCCL error: {} {}", ncclGetErrorString(state), ncclGetLastError(as_comm(comm_))));
    }
    watch_round(op, nullptr, watch);
    sched_yield();
  }
}

}  // namespace tnt::backend
