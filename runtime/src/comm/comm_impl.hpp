// What a Communicator holds, and the pieces its collectives share: MPI error checks that
// name the operation, the polling wait with a deadline (every host collective is
// nonblocking MPI + MPI_Test, so a missing rank becomes a CommError, not a hang), and the
// arrivals side channel (TCP, beside MPI) that tells a waiting rank where every other rank
// is: which collectives it entered and finished, and what they were.
#pragma once

#include "comm/collective_scope.hpp"
#include "comm/rank_positions.hpp"
#include "tarantella/comm.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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
  const char* label = current_collective_label();  // the runtime call it is part of, if any
  // "allreduce(ring, 10 x f32)", "broadcast(root 0, 3 x i64, cpu) in save_weights"
  std::string str() const;
  // What every rank's call must agree on (str() less the device index, which differs).
  std::string key() const;
};

// The side channel that tells a waiting rank where the others are. Each rank keeps, for
// each of kSlots communicators, the number of the last collective it entered and of the last
// it finished, and what its last kHistory collectives were (the world communicator is slot
// 0, duplicates take the next slots in creation order, which every rank shares because
// duplicate() is collective); entering or finishing a collective is a short store under an
// uncontended lock. A thread of each rank answers queries for these on a TCP socket of its
// own (port and addresses exchanged once, when the world communicator is made), so the
// channel needs nothing of MPI: it works over any network, between hosts too, and a rank
// stuck in computation still answers. A waiting rank asks every other rank at once, for a
// short while, and only after a grace period (see Waiter); a rank that cannot be reached
// (its host is down or cut off, it is stopped or gone) does not answer. If the socket cannot
// be made, the channel is off and messages say where the other ranks are is unknown.
class Arrivals {
 public:
  static constexpr int kSlots = 64;
  static constexpr int kHistory = 16;
  explicit Arrivals(MPI_Comm comm);  // collective over comm
  ~Arrivals();                       // local: stops this rank's answering thread
  Arrivals(const Arrivals&) = delete;
  Arrivals& operator=(const Arrivals&) = delete;

  bool enabled() const { return listen_fd_ >= 0; }
  int next_slot();  // call in the same order on every rank
  void reset(int slot);  // a new communicator takes the slot: nothing entered yet
  void enter(int slot, int64_t seq, const OpDesc& op);
  void finish(int slot, int64_t seq);
  RankPosition local(int slot) const;  // this rank's own
  // Entry q: rank q's position on slot (answered == false when it did not answer within
  // budget_s); this rank's own entry is local(slot).
  std::vector<RankPosition> query(int slot, double budget_s) const;
  // Rank q's host name, as it calls itself; and whether all ranks are on one host.
  const std::string& host(int q) const { return peers_[static_cast<size_t>(q)].host; }
  bool one_host() const { return one_host_; }
  // Queries this rank has answered: none while every collective completes within the grace.
  int64_t queries_answered() const { return answered_.load(std::memory_order_relaxed); }

 private:
  struct Peer {
    uint16_t port = 0;             // 0: no channel on that rank
    std::vector<uint32_t> addrs;   // IPv4, network order; loopback first for this host's ranks
    std::string host;
  };
  struct Entry {
    int64_t seq = 0;  // 0: empty
    OpDesc op;
  };
  struct Slot {
    mutable std::mutex mutex;
    int64_t entered = 0;
    int64_t done = 0;
    Entry history[kHistory];  // collective seq at [seq % kHistory]
  };
  void serve();
  std::string answer(int slot) const;  // the wire form of local(slot)

  int rank_ = 0;
  int size_ = 1;
  int next_slot_ = 1;
  uint64_t token_ = 0;  // the job's, so that a stray connection cannot pose as a query
  std::unique_ptr<Slot[]> slots_;  // (kSlots,) this rank's positions
  std::vector<Peer> peers_;
  bool one_host_ = true;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor wakes the thread with it
  std::atomic<int64_t> answered_{0};
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
  // A rank that has waited this long in a collective asks the others where they are, and
  // fails at once if they called different collectives (then again after twice as long, up
  // to kMaxCheckInterval). Short next to any timeout worth setting, long next to a
  // collective whose ranks arrive together, so that such collectives never pay for it.
  double mismatch_grace_s = 1.5;
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

  // Numbers the next collective and publishes it; throws if the communicator is broken, or
  // (InputError) inside code that runs on some ranks only (collective_scope.hpp).
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
  static constexpr double kMaxCheckInterval = 30.0;
  Waiter(CommImpl& comm, const OpDesc& op);  // call after comm.enter()
  // For collective number seq, entered earlier and waited for now (work queued on a device
  // stream: the Reducer's NCCL buckets).
  Waiter(CommImpl& comm, const OpDesc& op, int64_t seq);
  ~Waiter();  // publishes the collective as finished, unless it is left by an exception
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  std::string op() const { return op_.str(); }
  CommImpl& comm() const { return comm_; }

  // peer/role describe whom the request waits on, for the timeout message (-1: unknown).
  void wait(MPI_Request& request, int peer = -1, const char* role = nullptr);
  void wait_all(std::span<MPI_Request> requests, int peer = -1, const char* role = nullptr);
  // One round of a wait on work that MPI does not see (an NCCL stream; `wait` uses it for
  // MPI requests): past the deadline throws timed_out; after the grace, and then at growing
  // intervals, asks the other ranks where they are and throws when they called different
  // collectives; throws when the owner cancelled. The caller polls its own work between
  // rounds and cleans up its side (aborts the NCCL communicator) when this throws.
  void poll(Clock::time_point now, int peer = -1, const char* role = nullptr);
  // Throws a CommError naming the operation and rank when rc is not MPI_SUCCESS, and the
  // ranks' different collectives when that is why (MPI matched two different calls).
  void check(int rc, const char* call) const;
  [[noreturn]] void timed_out(int peer, const char* role) const;
  Clock::time_point deadline() const;

 private:
  // After the grace period: asks the other ranks where they are; throws a CommError when
  // they called different collectives.
  void check_peers(Clock::time_point now);
  // "": the ranks agree (or cannot be asked); else ". The likely cause: ..." with the fix.
  std::string mismatch_note() const;
  std::string prefix() const;  // comm_error_prefix for this collective's number

  CommImpl& comm_;
  OpDesc op_;
  int64_t seq_;
  int uncaught_;  // std::uncaught_exceptions() at the start
  // Set at the first poll that finds the request incomplete (a clock read is not free,
  // and most small collectives complete before); deadline() sets them when asked first.
  mutable Clock::time_point deadline_{};
  mutable Clock::time_point next_check_{};
  double check_interval_s_ = 0;
};

// On the error path: cancels point-to-point requests that are still pending and lets go of
// them, and marks the communicator broken.
void abandon_requests(CommImpl& comm, std::span<MPI_Request> requests, bool point_to_point);

// The NCCL communicator of w.comm(), created on first use: rank 0 makes the unique id, an
// MPI broadcast (part of w's collective) hands it to the others. CUDA builds
// (comm/device_collectives_cuda.cpp); CPU-only builds throw (comm/nccl_stub.cpp).
backend::NcclComm& ensure_nccl(Waiter& w);

MPI_Datatype mpi_type(DType dtype);  // f32, f64, i32, i64 (and u8); throws otherwise
// "op (collective #seq of this communicator) on rank r of n"; seq defaults to the last entered.
std::string comm_error_prefix(const CommImpl& comm, const std::string& op, int64_t seq = -1);

}  // namespace tnt::detail
