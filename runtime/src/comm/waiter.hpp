// Waiting for one collective's requests with a deadline: every host collective is
// nonblocking MPI + MPI_Test, so a missing rank becomes a CommError, not a hang; past a grace
// period the waiter asks the other ranks (comm/arrivals.hpp) where they are and names a
// mismatch of collectives at once.
#pragma once

#include "comm/comm_state.hpp"

#include <mpi.h>

#include <span>
#include <string>

namespace tnt::backend {
class NcclComm;
}

namespace tnt::detail {

// Waits for the requests of one collective, polling MPI_Test so that a deadline can be
// kept; spins for CommImpl::spin_us, then naps between polls (ranks are often
// oversubscribed in tests and share cores with compute threads, which need the core more
// than a wait on a slow link or a late peer does).
// For values the ranks exchanged that make no sense together (a disagreement an agreement
// check found): when the cause is that MPI paired two different collectives (a save_weights
// under is_master_rank() whose broadcasts met the others' first calls of fit), throws that
// CommError, naming both calls, instead of the garbage the values would make of a message.
// Asks the other ranks where they are (half a second at most); returns when they agree.
void raise_if_collectives_differ(const Communicator& comm, const std::string& what);

class Waiter {
 public:
  static constexpr double kMaxCheckInterval = 30.0;
  // A collective that some ranks have not reached after this long (or a quarter of a shorter
  // TNT_COLLECTIVE_TIMEOUT) is reported once, by the lowest-numbered rank waiting in it (as
  // Horovod's stall check does after 60 s), long before the timeout ends the job: a stopped
  // or hung rank is not silent for ten minutes.
  static constexpr double kStallWarningS = 60.0;
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
  // From check_peers, once the wait passes kStallWarningS: the warning, from one rank.
  void report_stall(Clock::time_point now, const std::vector<RankPosition>& where);
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
  mutable Clock::time_point started_{};  // when deadline() was first asked: the wait's start
  double check_interval_s_ = 0;
  bool stall_reported_ = false;  // the stall warning, at most once a collective
};

// On the error path: cancels point-to-point requests that are still pending and lets go of
// them, and marks the communicator broken.
void abandon_requests(CommImpl& comm, std::span<MPI_Request> requests, bool point_to_point);

// The NCCL communicator of w.comm(), created on first use: rank 0 makes the unique id, an
// MPI broadcast (part of w's collective) hands it to the others. CUDA builds
// (comm/device_collectives_cuda.cpp); CPU-only builds throw (comm/nccl_stub.cpp).
backend::NcclComm& ensure_nccl(Waiter& w);

}  // namespace tnt::detail
