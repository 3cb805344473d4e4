// The arrivals side channel (TCP, beside MPI) that tells a waiting rank where every other
// rank is: which collectives it entered and finished, and what they were (OpDesc). One
// thread per process answers the others' queries; an eventfd stops it.
#pragma once

#include "comm/collective_scope.hpp"
#include "comm/rank_positions.hpp"
#include "tarantella/comm.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tnt::detail {

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
  // This rank's program is done (tnt::finalize): every answer says so from now on, so that
  // a rank still waiting in a collective learns that this one will never join it.
  void mark_finished() { finished_.store(true, std::memory_order_relaxed); }
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
  std::atomic<bool> finished_{false};
  std::thread server_;
};

}  // namespace tnt::detail
