// What a Communicator holds (CommImpl: its MPI communicator, its settings, the number of
// the collectives it entered, its scratch memory, its NCCL communicator) and the private way
// to it. The polling wait with a deadline is comm/waiter.hpp, the arrivals side channel
// comm/arrivals.hpp.
#pragma once

#include "comm/arrivals.hpp"
#include "comm/collective_scope.hpp"
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
  int64_t spin_us = 200;  // a wait polls this long before it starts napping
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

MPI_Datatype mpi_type(DType dtype);  // f32, f64, i32, i64 (and u8); throws otherwise
// "op (collective #seq of this communicator) on rank r of n"; seq defaults to the last entered.
std::string comm_error_prefix(const CommImpl& comm, const std::string& op, int64_t seq = -1);

}  // namespace tnt::detail
