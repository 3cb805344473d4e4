// One NCCL communicator and the CUDA stream it runs on (CUDA builds only). Created in
// nonblocking mode so that every wait, including initialisation, can keep a deadline: a
// rank that never arrives makes the others fail with a CommError instead of hanging.
// Interface without CUDA or NCCL types, so comm/ can include it in any translation unit.
#pragma once

#include "tarantella/dtype.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>

namespace tnt::backend {

class NcclComm {
 public:
  using Clock = std::chrono::steady_clock;
  // How a wait ends besides success: the deadline, and a check run on every round of the
  // wait (may be empty). The collectives' check (detail::Waiter::poll) asks the other ranks
  // where they are and throws, naming the ranks that never joined or that called another
  // collective; NCCL itself cannot tell which rank is missing. When the check throws, the
  // communicator is aborted and its exception goes on.
  struct Watch {
    Clock::time_point deadline;
    std::function<void(Clock::time_point)> check;
    Watch(Clock::time_point d) : deadline(d) {}  // NOLINT: a plain deadline is a Watch
    Watch(Clock::time_point d, std::function<void(Clock::time_point)> c) : deadline(d), check(std::move(c)) {}
  };
  static constexpr size_t kIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
  static void make_unique_id(char* id);   // id: (kIdBytes,)

  // Collective over the size ranks that received the same id. close_timeout bounds the
  // destructor's wait for the other ranks (see ~NcclComm).
  NcclComm(const char* id, int rank, int size, int device, const std::string& op, const Watch& watch,
           Clock::duration close_timeout);
  // With nothing left on the stream: ncclCommFinalize, polled until the communicator is
  // quiescent on every rank, then ncclCommDestroy (NCCL's order for a nonblocking
  // communicator). With work still queued (a step abandoned after an error elsewhere), an
  // asynchronous error, or no quiescence within close_timeout: ncclCommAbort, so that a
  // peer that never comes cannot hang the destructor.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // The owner gave up on this communicator (it left a step after an error): the destructor
  // aborts at once instead of finalizing, so the original error reaches the caller without
  // waiting close_timeout for peers that may never come.
  void abort_on_close() { abort_on_close_ = true; }

  void* stream() const { return stream_; }  // cudaStream_t (non-blocking)
  int device() const { return device_; }

  // Orders the NCCL stream after the work queued so far on `stream` (cudaStream_t;
  // nullptr = the legacy default stream) or after `event` (cudaEvent_t).
  void wait_stream(void* stream);
  void wait_event(void* event);
  void record(void* event);  // event (cudaEvent_t) completes when the NCCL stream gets here

  // Enqueue on the NCCL stream; they return before the data moves.
  void allreduce(void* data, size_t count, DType dtype, bool average, const std::string& op, const Watch& watch);
  void broadcast(void* data, size_t bytes, int root, const std::string& op, const Watch& watch);
  void allgather(const void* in, void* out, size_t bytes_per_rank, const std::string& op, const Watch& watch);

  // The host waits (polling) until `event`, or everything queued so far when event is
  // null, has completed; when the watch's check throws, at the deadline, or on an
  // asynchronous NCCL error, the communicator is aborted and a CommError names op, this
  // rank and the reason.
  void synchronize(void* event, const std::string& op, const Watch& watch);

 private:
  // Polls a nonblocking communicator until its last call has been set up.
  void settle(const std::string& op, const char* call, const Watch& watch);
  // One round of a wait: runs the watch's check (aborting before its exception goes on),
  // then fails at the deadline, naming call (an NCCL function; nullptr: the queued work).
  void watch_round(const std::string& op, const char* call, const Watch& watch);
  bool finalized(Clock::time_point deadline) noexcept;  // true: ready for ncclCommDestroy
  [[noreturn]] void fail(const std::string& op, const std::string& why);

  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  void* sync_event_ = nullptr;
  void* order_event_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  Clock::duration close_timeout_{};
  bool aborted_ = false;
  std::atomic<bool> abort_on_close_{false};
};

}  // namespace tnt::backend
