// Communicator: the job's collectives. Created by tnt::init over MPI_COMM_WORLD; reach it
// with tnt::communicator().
//
// Where the data goes:
//   host buffers   -> MPI: our ring allreduce ("ring", the default) or MPI's own ("mpi")
//   device buffers -> NCCL ("nccl"), on the communicator's own CUDA stream; the NCCL
//                     communicator is created on the first device-buffer collective (the
//                     unique id travels over MPI), so that first call is collective too.
// Types: f32, f64, i32, i64 on host; f32, f16, bf16 (and f64, i32, i64) on device. A
// CPU-only build has the same API and throws for device buffers.
//
// Contract (as with MPI): every rank calls the same collectives in the same order with the
// same counts and dtypes. A Communicator is used by one thread at a time; a thread that
// needs collectives concurrently with another (the Reducer's communication thread) works on
// its own duplicate().
//
// Every call returns when the data is complete on this rank (device collectives: the
// host waits for the NCCL stream, so the result is visible to every stream afterwards).
// A collective that does not complete within timeout() seconds (TNT_COLLECTIVE_TIMEOUT,
// default 600, or set_timeout; 0 = no timeout) throws CommError on the ranks that wait,
// naming the operation, its number on this communicator, where it can be known the ranks
// that never entered it or could not be asked, with their hosts when the job spans
// several, and where each rank is: in which collective, or in none since which one. Each
// rank answers "the collectives I entered and finished last, and what they were" on a
// small TCP socket of its own, beside MPI.
//
// A broken contract fails sooner. A host collective still waiting after 1.5 s asks the
// other ranks (then again after 3, 6, ... up to every 30 s; a collective whose ranks
// arrive together never asks): if two ranks called different collectives under one
// number (a collective under is_master_rank(), say), it throws CommError at once naming
// both calls and the fix; ranks that are merely late are waited for. A collective started
// inside a callback that does not run on every rank (Callback::Ranks other than all)
// throws InputError on this rank before it is numbered, naming the callback. After a
// CommError the communicator, and the buffer of the failed call, must not be used again:
// end the job.
#pragma once

#include "tarantella/config.hpp"
#include "tarantella/device.hpp"
#include "tarantella/dtype.hpp"
#include "tarantella/tensor.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace tnt {

enum class ReduceOp { sum, average };  // average = sum / size(), floating-point dtypes only

// automatic: TNT_ALLREDUCE_ALGO where it applies to the buffer (ring|mpi to host buffers,
// nccl to device buffers), else the default for the buffer's place (ring on host, nccl on
// device). An explicit algorithm that cannot handle the buffer is an error.
//
// ring: ours (comm/ring_allreduce.cpp): reduce-scatter + allgather over MPI point-to-point,
// pipelined in TNT_RING_SEGMENT-sized segments. Below kRingSmallBytes it switches to
// recursive doubling (one exchange per doubling instead of 2(p-1) ring steps), because a
// small message costs latency, not bandwidth; the benchmark labels such rows.
enum class AllreduceAlgo { automatic, ring, mpi, nccl };
AllreduceAlgo parse_allreduce_algo(const std::string& text);  // ""/auto, ring, mpi, nccl
const char* allreduce_algo_name(AllreduceAlgo algo);

// Host buffers smaller than this many bytes take the recursive-doubling path of "ring".
inline constexpr int64_t kRingSmallBytes = 16 * 1024;

namespace detail {
struct CommImpl;
struct CommAccess;  // comm/comm_state.hpp: the runtime's and the tests' way to the internals
}

class Communicator {
 public:
  // Wraps MPI_COMM_WORLD (MPI must be initialised); device is this rank's device.
  static std::unique_ptr<Communicator> create_world(const Config& config, Device device);
  // A new communicator over the same ranks (its own MPI communicator, collective numbering,
  // scratch buffers and, when used, NCCL communicator), with the same settings. Collective.
  std::unique_ptr<Communicator> duplicate() const;
  // The ranks that pass the same color, numbered in their order here, with the same
  // settings (the workers of a parameter-server job). Collective. Its timeout messages say
  // where the other ranks are only by number: the position channel is the job's.
  std::unique_ptr<Communicator> split(int color) const;
  // The ranks listed (ranks of this communicator, ascending), numbered in that order.
  // Collective over those ranks only: the others need not call it, and may be gone (a
  // parameter-server job goes on without a lost worker this way). `tag` tells concurrent
  // calls apart.
  std::unique_ptr<Communicator> subset(const std::vector<int>& ranks, int tag = 0) const;
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;  // among the ranks on this node
  int local_size() const;
  static constexpr int master_rank() { return 0; }
  bool is_master() const { return rank() == master_rank(); }
  Device device() const;  // this rank's device; device collectives run there

  // Seconds a collective may take before it fails (this object only; duplicates copy it);
  // 0 = no limit.
  double timeout() const;
  void set_timeout(double seconds);
  // For tnt::finalize: this rank's program is done. From now on the side channel that tells
  // waiting ranks where this one is says so (a rank still waiting in a collective then fails
  // at once, naming this one), and it keeps answering, even after this communicator is
  // gone, until the returned handle is released (after MPI_Finalize).
  std::shared_ptr<void> announce_finished();
  // Collectives entered so far on this communicator (they are numbered from 1).
  int64_t collectives_entered() const;

  // The algorithm an allreduce of a buffer on `where` runs with `algo` (throws if none fits).
  AllreduceAlgo resolve(AllreduceAlgo algo, Device where) const;

  // In place: every rank ends with the element-wise sum (or average) of all ranks' buffers.
  void allreduce(Tensor& tensor, ReduceOp op = ReduceOp::sum, AllreduceAlgo algo = AllreduceAlgo::automatic);
  void allreduce(void* data, int64_t count, DType dtype, Device device, ReduceOp op = ReduceOp::sum,
                 AllreduceAlgo algo = AllreduceAlgo::automatic);

  // Every rank ends with root's values (shape and dtype must already match).
  void broadcast(Tensor& tensor, int root = master_rank());
  void broadcast(void* data, int64_t count, DType dtype, Device device, int root = master_rank());
  void broadcast(std::string& text, int root = master_rank());  // any length

  // Returns (size(), *in.shape): row q is rank q's tensor. Same dtype and device as in.
  Tensor allgather(const Tensor& in);
  void allgather(const void* in, void* out, int64_t count, DType dtype, Device device);  // out: (p, count)

  void barrier();

  // Scalar helpers for the training loop (metrics, sample counts): one small MPI allreduce.
  std::vector<double> allreduce_sum(std::vector<double> values);
  std::vector<int64_t> allreduce_sum(std::vector<int64_t> values);
  std::vector<double> allreduce_max(std::vector<double> values);
  std::vector<double> allreduce_min(std::vector<double> values);
  std::vector<int64_t> allgather(int64_t value);  // element q is rank q's value

  template <typename T>
    requires std::is_arithmetic_v<T>
  T allreduce_sum(T value) {
    if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(allreduce_sum(std::vector<double>{static_cast<double>(value)})[0]);
    } else {
      return static_cast<T>(allreduce_sum(std::vector<int64_t>{static_cast<int64_t>(value)})[0]);
    }
  }
  template <typename T>
    requires std::is_arithmetic_v<T>
  T allreduce_max(T value) {
    return static_cast<T>(allreduce_max(std::vector<double>{static_cast<double>(value)})[0]);
  }
  template <typename T>
    requires std::is_arithmetic_v<T>
  T allreduce_min(T value) {
    return static_cast<T>(allreduce_min(std::vector<double>{static_cast<double>(value)})[0]);
  }

 private:
  friend struct detail::CommAccess;
  explicit Communicator(std::unique_ptr<detail::CommImpl> impl);
  std::unique_ptr<detail::CommImpl> impl_;
};

}  // namespace tnt
