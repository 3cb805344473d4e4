// What a Communicator holds, and the pieces its collectives share: MPI error checks that
// name the operation, the polling wait with a deadline (every host collective is
// nonblocking MPI + MPI_Test, so a missing rank becomes a CommError, not a hang), and the
// arrivals side channel (TCP, beside MPI) that tells a timed-out rank who never entered the
// collective.
#pragma once

#include "tarantella/comm.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif
#include <vector>

namespace tnt::backend {
class NcclComm;
}

namespace tnt::detail {

// Memory that an abandoned MPI request (one that timed out) may still write into is given
// up, never freed; this tells LeakSanitizer that the leak is on purpose (a no-op otherwise).
inline void give_up_to_mpi(const void* p) {
#if defined(__SANITIZE_ADDRESS__)
  if (p) __lsan_ignore_object(p);
#else
  static_cast<void>(p);
#endif
}

using Clock = std::chrono::steady_clock;

// The side channel that tells a timed-out rank who never entered the collective. Each rank
// keeps, for each of kSlots communicators, the number of the last collective it entered (the
// world communicator is slot 0, duplicates take the next slots in creation order, which
// every rank shares because duplicate() is collective); entering a collective is one atomic
// store. A thread of each rank answers queries for these numbers on a TCP socket of its own
// (port and addresses exchanged once, when the world communicator is made), so the channel
// needs nothing of MPI: it works over any network, between hosts too, and a rank stuck in
// computation still answers. A timed-out rank asks every other rank at once, for a short
// while; a rank that cannot be reached (its host is down or cut off, it is stopped or gone)
// does not answer. If the socket cannot be made, the channel is off and messages say the
// missing ranks are unknown.
class Arrivals {
 public:
  static constexpr int kSlots = 64;
  explicit Arrivals(MPI_Comm comm);  // collective over comm
  ~Arrivals();                       // local: stops this rank's answering thread
  Arrivals(const Arrivals&) = delete;
  Arrivals& operator=(const Arrivals&) = delete;

  bool enabled() const { return listen_fd_ >= 0; }
  int next_slot();  // call in the same order on every rank
  void publish(int slot, int64_t seq) { seqs_[slot].store(seq, std::memory_order_release); }
  // Entry q: the last collective rank q entered on slot, or -1 when it did not answer
  // within budget_s.
  std::vector<int64_t> query(int slot, double budget_s) const;
  // Rank q's host name, as it calls itself; and whether all ranks are on one host.
  const std::string& host(int q) const { return peers_[static_cast<size_t>(q)].host; }
  bool one_host() const { return one_host_; }

 private:
  struct Peer {
    uint16_t port = 0;             // 0: no channel on that rank
    std::vector<uint32_t> addrs;   // IPv4, network order; loopback first for this host's ranks
    std::string host;
  };
  void serve();

  int rank_ = 0;
  int size_ = 1;
  int next_slot_ = 1;
  uint64_t token_ = 0;  // the job's, so that a stray connection cannot pose as a query
  std::unique_ptr<std::atomic<int64_t>[]> seqs_;  // (kSlots,) this rank's entries
  std::vector<Peer> peers_;
  bool one_host_ = true;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor wakes the thread with it
  std::thread server_;
};

// Host scratch memory that grows on demand (64-byte aligned).
class Scratch {
 public:
  Scratch() = default;
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get(size_t bytes);
  // After a failed collective a late message may still land in the buffer: forget it
  // instead of freeing it.
  void abandon();

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// What a collective is, for messages. Formatted only when a message is needed, so that a
// small collective pays nothing for it.
struct OpDesc {
  const char* name = "";
  const char* algo = nullptr;  // allreduce algorithm, shown first
  int root = -1;               // broadcast root (-1: not shown)
  int64_t count = -1;          // elements (-1: not shown)
  DType dtype = DType::f32;
  const char* unit = nullptr;  // shown instead of "x dtype", e.g. "value(s)"
  bool show_device = false;
  Device device = Device::cpu();
  std::string str() const;  // "allreduce(ring, 10 x f32)", "broadcast(root 0, 3 x i64, cpu)"
};

struct NcclDeleter {
  void operator()(backend::NcclComm* nccl) const;  // defined for both builds (see ensure_nccl)
};

struct CommImpl {
  MPI_Comm comm = MPI_COMM_NULL;  // our own duplicate of the user's communicator
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  Device device;
  double timeout_s = 600.0;
  std::string config_algo;  // TNT_ALLREDUCE_ALGO as configured ("" = defaults)
  AllreduceAlgo configured = AllreduceAlgo::automatic;  // config_algo, parsed
  size_t ring_segment_bytes = 256 * 1024;
  // The ring never cuts chunks finer than this: measured on 2 ranks over shared memory,
  // 64 KiB pieces beat 4 and 16 KiB ones up to 128 KiB buffers (fewer rendezvous rounds).
  int64_t min_segment_bytes = 64 * 1024;
  int64_t small_bytes = kRingSmallBytes;  // below: recursive doubling inside "ring"
  int64_t spin_us = 200;  // a wait polls this long before it starts yielding the core
  int tag_ub = 32767;
  int64_t seq = 0;  // collectives entered
  std::shared_ptr<Arrivals> arrivals;
  int slot = 0;
  bool broken = false;  // a collective failed; nothing more may run here
  // Set by an owner that wants a waiting collective to give up (the Reducer's destructor).
  std::atomic<bool>* cancel = nullptr;
  Scratch scratch;
  std::unique_ptr<backend::NcclComm, NcclDeleter> nccl;  // created by the first device collective

  CommImpl();
  ~CommImpl();

  // Numbers the next collective and publishes it; throws if the communicator is broken.
  int64_t enter(const OpDesc& op);
  int tag(int64_t seq_number) const { return static_cast<int>(seq_number % tag_ub); }
  Clock::time_point deadline() const;
};

// The private way from a Communicator to its internals (comm/, the Reducer's transports,
// tests and benchmarks); the public header names only this struct.
struct CommAccess {
  static CommImpl& impl(const Communicator& comm) { return *comm.impl_; }
};
inline CommImpl& impl_of(const Communicator& comm) { return CommAccess::impl(comm); }

// Waits for the requests of one collective, polling MPI_Test so that a deadline can be
// kept; spins for CommImpl::spin_us, then yields the core between polls (ranks are often
// oversubscribed in tests and share cores with compute threads).
class Waiter {
 public:
  Waiter(CommImpl& comm, const OpDesc& op);  // call after comm.enter()
  std::string op() const { return op_.str(); }
  CommImpl& comm() const { return comm_; }

  // peer/role describe whom the request waits on, for the timeout message (-1: unknown).
  void wait(MPI_Request& request, int peer = -1, const char* role = nullptr);
  void wait_all(std::span<MPI_Request> requests, int peer = -1, const char* role = nullptr);
  // Throws a CommError naming the operation and rank when rc is not MPI_SUCCESS.
  void check(int rc, const char* call) const;
  [[noreturn]] void timed_out(int peer, const char* role) const;
  Clock::time_point deadline() const;

 private:
  CommImpl& comm_;
  OpDesc op_;
  int64_t seq_;
  // Set at the first poll that finds the request incomplete (a clock read is not free,
  // and most small collectives complete before); deadline() sets it when asked first.
  mutable Clock::time_point deadline_{};
};

// On the error path: cancels point-to-point requests that are still pending and lets go of
// them, and marks the communicator broken.
void abandon_requests(CommImpl& comm, std::span<MPI_Request> requests, bool point_to_point);

// The NCCL communicator of w.comm(), created on first use: rank 0 makes the unique id, an
// MPI broadcast (part of w's collective) hands it to the others. CUDA builds
// (comm/device_collectives_cuda.cpp); CPU-only builds throw (comm/nccl_stub.cpp).
backend::NcclComm& ensure_nccl(Waiter& w);

MPI_Datatype mpi_type(DType dtype);  // f32, f64, i32, i64 (and u8); throws otherwise
std::string comm_error_prefix(const CommImpl& comm, const std::string& op);

}  // namespace tnt::detail
